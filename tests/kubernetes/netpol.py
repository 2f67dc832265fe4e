"""Pure: what Kubernetes NetworkPolicies (networking.k8s.io/v1) admit, for the tests of the prod overlay.

A small reading of the API's rules, enough for the policies in deploy/: ingress only; label selectors
with matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist); peers by podSelector (the
policy's own namespace), namespaceSelector, or both (both must match); numeric ports. A pod no ingress
policy selects takes any traffic; one that some policy selects takes what any of them admits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: Mapping[str, str]
    ports: tuple[int, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Does a label selector match? An empty selector matches everything."""
    sel = selector or {}
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for expr in sel.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _peer_admits(peer: Mapping[str, Any], src: Pod, policy_ns: str, ns_labels: Mapping[str, Mapping[str, str]]) -> bool:
    if "ipBlock" in peer:
        raise AssertionError("ipBlock peers are not modelled here")
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], ns_labels[src.namespace]):
            return False
    elif src.namespace != policy_ns:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], src.labels)


def admits(policies: Iterable[Mapping[str, Any]], src: Pod, dst: Pod, port: int,
           ns_labels: Mapping[str, Mapping[str, str]]) -> bool:
    """May `src` open a TCP connection to `dst`:`port` under these policies?"""
    chosen = [p for p in policies if p["metadata"].get("namespace", dst.namespace) == dst.namespace
              and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
              and selects(p["spec"]["podSelector"], dst.labels)]
    if not chosen:
        return True
    for pol in chosen:
        ns = pol["metadata"].get("namespace", dst.namespace)
        for rule in pol["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any(_peer_admits(p, src, ns, ns_labels) for p in peers):
                continue
            ports = rule.get("ports")
            if ports and not any(pt.get("protocol", "TCP") == "TCP" and pt.get("port") == port for pt in ports):
                continue
            return True
    return False


def pods_of(docs: Iterable[Mapping[str, Any]], namespace: str) -> list[Pod]:
    """The pods the workload objects among `docs` run (one per template), in `namespace` unless set."""
    out = []
    for d in docs:
        if d.get("kind") not in ("Deployment", "StatefulSet", "Job"):
            continue
        meta = d["spec"]["template"]["metadata"]
        ports = tuple(p["containerPort"] for c in d["spec"]["template"]["spec"]["containers"]
                      for p in c.get("ports") or [])
        out.append(Pod(d["metadata"]["name"], d["metadata"].get("namespace") or namespace,
                       dict(meta.get("labels") or {}), ports, dict(meta.get("annotations") or {})))
    return out
