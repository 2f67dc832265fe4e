"""The `netpol` scenario on the emulated prod overlay: connections opened from inside pods' network
namespaces, some the loop needs (they must connect), some no component needs (they must not).

It runs after the loop's own scenarios, which already show that every edge the loop uses is admitted
(a dropped edge stalls wired, S4 or S1); this adds the denials, through a Service address (the
emulated kube-proxy) and to a pod's own address (its iptables), and the Service connections the
policies refused during the whole run."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from .cluster import Cluster

CONNECT_TIMEOUT_S = 3.0  # a dropped SYN is retried after 1 s: an admitted connection is in by then

# (from the pods of, to: a Service name or "pod:<service>" for its first pod's own address, port, admitted)
EDGES: tuple[tuple[str, str, int, bool], ...] = (
    ("checker", "pod:digits", 8080, True),        # the Checker reads each replica's /metrics
    ("digits", "tracker", 8080, True),            # replicas post their prediction records
    ("digits-gateway", "pod:digits", 8080, True),  # the gateway balances over the replicas' own addresses
    ("executor", "mlflow", 5000, True),
    ("tracker", "postgres", 5432, True),          # the agents' stores
    ("digits", "postgres", 5432, False),          # a replica never reaches the database
    ("digits", "pod:digits-backup", 8080, False),  # nor another replica
    ("digits-gateway", "mlflow", 5000, False),    # the gateway needs no model store
    ("digits-gateway", "postgres", 5432, False),
)


def _pod_of(cluster: Cluster, owner: str) -> Any:
    with cluster._lock:
        return next(p for p in cluster.pods.values()
                    if p.owner[1] == owner and p.ready and not p.terminating and p.spec.get("_netns"))


def connects(cluster: Cluster, src: str, dst: str, port: int) -> bool:
    """Does a pod of `src` get an answer from `dst`:`port` within CONNECT_TIMEOUT_S? An answer, not a
    connect: the emulated kube-proxy accepts every connection to a Service address and then holds
    one the policies refuse. PostgreSQL is asked its SSLRequest (it answers one byte), others HTTP."""
    ip = _pod_of(cluster, dst[4:]).ip if dst.startswith("pod:") else cluster.service_ip(dst)
    ask = "struct.pack('!ii', 8, 80877103)" if port == 5432 else "b'GET /health HTTP/1.0\\r\\n\\r\\n'"
    code = (f"import socket, struct, sys; s = socket.create_connection(({ip!r}, {port}), {CONNECT_TIMEOUT_S}); "
            f"s.settimeout({CONNECT_TIMEOUT_S}); s.sendall({ask}); sys.exit(0 if s.recv(1) else 1)")
    r = subprocess.run(["nsenter", f"--net=/run/netns/{_pod_of(cluster, src).spec['_netns']}", sys.executable,
                        "-c", code], capture_output=True, timeout=CONNECT_TIMEOUT_S + 30, check=False)
    return r.returncode == 0


def run_netpol(cluster: Cluster, result: dict[str, Any]) -> None:
    result["netpol_edges"] = [
        {"from": src, "to": dst, "port": port, "want": want, "connected": connects(cluster, src, dst, port)}
        for src, dst, port, want in EDGES]
    result["netpol_firewalled_pods"] = sorted(cluster._firewalls)
    result["policy_drops"] = list(cluster.policy_drops)
