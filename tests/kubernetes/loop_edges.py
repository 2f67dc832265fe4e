"""Pure: the connections the autonomic loop makes on Kubernetes, read from the rendered manifests.

Why derived, not listed: a hand-kept list of edges agrees with the NetworkPolicies by construction and
missed the Checker's scrape of the replicas (the prod policy dropped it, and the Planner decided without
replica CPU). Here every address a container is configured with (env values, command and args: peers,
MLflow, the stores, the Tracker, the gateway's upstreams, the watched services) becomes an edge to the
pods its Service selects, on the Service's target port. One edge is behaviour, not an address, and is
added by rule: whoever watches a service through SCANFLOW_SERVICE_URLS also reads /metrics of that
gateway's upstreams, at the addresses the gateway reports (scanflow/standard/checker.py `watch`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubernetes.netpol import Pod, pods_of, selects

# scheme://[user[:password]@]host:port, for http(s) and SQLAlchemy's postgresql(+driver) URLs
URL = re.compile(r"(?:https?|postgresql(?:\+\w+)?)://(?:[^@/\s,]*@)?([a-z0-9][a-z0-9.-]*):(\d+)")
WATCH_ENV = "SCANFLOW_SERVICE_URLS"


@dataclass(frozen=True)
class Edge:
    src: str  # pod (workload) name
    dst: str
    port: int
    why: str  # the setting (or rule) it comes from


def _containers(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(doc["spec"]["template"]["spec"].get("containers") or [])


def _settings(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, text) of every literal env value, command and argument of a workload's containers."""
    out: list[tuple[str, str]] = []
    for c in _containers(doc):
        out += [(e["name"], str(e["value"])) for e in c.get("env") or [] if "value" in e]
        out += [("command", " ".join(map(str, c.get("command") or []))), ("args", " ".join(map(str, c.get("args") or [])))]
    return out


def _service_target(svc: Mapping[str, Any], port: int) -> int | None:
    for p in svc["spec"].get("ports") or []:
        if p.get("port") == port:
            target = p.get("targetPort", port)
            return target if isinstance(target, int) else port
    return None


def loop_edges(docs: Iterable[Mapping[str, Any]], namespace: str) -> set[Edge]:
    """Every connection the manifests' configuration asks for, to the pods that would answer it."""
    docs = list(docs)
    services = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    workloads = [d for d in docs if d.get("kind") in ("Deployment", "StatefulSet", "Job")]
    pods = {p.name: p for p in pods_of(workloads, namespace)}
    edges: set[Edge] = set()
    for doc in workloads:
        src = doc["metadata"]["name"]
        for name, text in _settings(doc):
            for host, port in URL.findall(text):
                svc = services.get(host.split(".")[0])
                target = _service_target(svc, int(port)) if svc else None
                if svc is None or target is None:
                    continue
                for dst in pods.values():
                    if dst.name != src and selects({"matchLabels": svc["spec"].get("selector") or {}}, dst.labels):
                        edges.add(Edge(src, dst.name, target, name))
    watched = {(e.src, e.dst) for e in edges if e.why == WATCH_ENV}
    upstreams = [e for e in edges if e.why == "SCANFLOW_UPSTREAM"]
    for watcher, gateway in watched:
        edges |= {Edge(watcher, u.dst, u.port, f"{WATCH_ENV}: the gateway's upstreams' /metrics")
                  for u in upstreams if u.src == gateway}
    return edges


def pods_by_name(docs: Iterable[Mapping[str, Any]], namespace: str) -> dict[str, Pod]:
    return {p.name: p for p in pods_of(docs, namespace)}
