"""NetworkPolicy enforcement for the emulated cluster (ingress, TCP, the pods of one namespace).

Two paths reach a pod, and each is held to the same rules (tests/kubernetes/netpol.admits):

- a pod's own address (headless Services, the Checker's scrape of a replica's metrics): iptables in
  the destination pod's network namespace, as a CNI's per-pod filter would do it. A SYN from a pod
  address the policies do not admit on that port is dropped, so the client's connect hangs to its own
  timeout, as on a cluster; packets of connections already open pass (`--syn` only matches the first).
- a Service address: the kube-proxy this harness plays knows the client's pod (the connection's
  source address) and only picks endpoints that admit it; when none does, it answers nothing and holds
  the connection until the client gives up (`iptables_rules` lets the proxy's own address through).

Traffic from the node's address (the kubelet's probes, the test's own calls, which stand for
`kubectl port-forward`) is not filtered: NetworkPolicy-enforcing CNIs let a node reach its pods.
Approximation: a rule that admits a source on every port is enforced on the ports the pod declares
and the ports some policy names, not on undeclared ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tests.kubernetes.netpol import Pod, admits, selects

Obj = Mapping[str, Any]


def _ns_labels(namespace: str) -> dict[str, dict[str, str]]:
    return {namespace: {"kubernetes.io/metadata.name": namespace}}


def selected(policies: Iterable[Obj], labels: Mapping[str, str], namespace: str) -> bool:
    """Does some ingress policy select a pod with these labels (then only what one admits gets in)?"""
    return any(p["metadata"].get("namespace", namespace) == namespace
               and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
               and selects(p["spec"].get("podSelector"), labels) for p in policies)


def admitted(policies: Iterable[Obj], src: Mapping[str, str], dst: Mapping[str, str], port: int,
             namespace: str) -> bool:
    """May a pod labelled `src` open a TCP connection to one labelled `dst` on `port` (same namespace)?"""
    return admits(list(policies), Pod("src", namespace, src), Pod("dst", namespace, dst), port,
                  _ns_labels(namespace))


def policy_ports(policies: Iterable[Obj]) -> set[int]:
    """Every numeric port some ingress rule names."""
    return {int(pt["port"]) for p in policies for rule in p["spec"].get("ingress") or []
            for pt in rule.get("ports") or [] if isinstance(pt.get("port"), int)}


def container_ports(pod_spec: Obj) -> set[int]:
    return {int(p["containerPort"]) for c in pod_spec.get("containers") or [] for p in c.get("ports") or []}


def iptables_rules(dst_labels: Mapping[str, str], dst_ports: Iterable[int],
                   sources: Iterable[tuple[str, Mapping[str, str]]], policies: list[Obj], namespace: str,
                   node_ip: str) -> str:
    """`iptables-restore` input for the INPUT chain of a pod's network namespace: open when no policy
    selects the pod; else loopback and the node pass, each (source pod address, port) the policies
    admit passes, and any other new TCP connection is dropped."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]"]
    if selected(policies, dst_labels, namespace):
        lines += ["-A INPUT -i lo -j ACCEPT", f"-A INPUT -s {node_ip}/32 -j ACCEPT"]
        ports = sorted(set(dst_ports) | policy_ports(policies))
        for ip, labels in sorted(sources, key=lambda s: s[0]):
            for port in ports:
                if admitted(policies, labels, dst_labels, port, namespace):
                    lines.append(f"-A INPUT -s {ip}/32 -p tcp --dport {port} -j ACCEPT")
        lines.append("-A INPUT -p tcp --syn -j DROP")
    return "\n".join([*lines, "COMMIT", ""])
