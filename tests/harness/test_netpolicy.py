"""The emulated cluster's NetworkPolicy rules (tests/harness/netpolicy.py), on the prod overlay's policies."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.harness import netpolicy

POLICIES = [d for d in yaml.safe_load_all(
    (Path(__file__).resolve().parents[2] / "deploy/overlays/prod/networkpolicy.yaml").read_text()) if d]
REPLICA = {"app.kubernetes.io/component": "replica", "app.kubernetes.io/name": "digits"}
GATEWAY = {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/name": "digits-gateway"}
CHECKER = {"app.kubernetes.io/component": "agent", "app.kubernetes.io/name": "checker"}
TRACKER = {"app.kubernetes.io/component": "agent", "app.kubernetes.io/name": "tracker"}
SOURCES = [("10.244.0.2", GATEWAY), ("10.244.0.3", CHECKER), ("10.244.0.4", TRACKER), ("10.244.0.5", REPLICA)]


def test_a_replica_admits_the_gateway_and_the_checker_only() -> None:
    rules = netpolicy.iptables_rules(REPLICA, {8080}, SOURCES, POLICIES, "scanflow", "10.244.0.1")
    lines = rules.splitlines()
    assert "-A INPUT -s 10.244.0.2/32 -p tcp --dport 8080 -j ACCEPT" in lines
    assert "-A INPUT -s 10.244.0.3/32 -p tcp --dport 8080 -j ACCEPT" in lines
    assert not any(line.startswith(("-A INPUT -s 10.244.0.4/", "-A INPUT -s 10.244.0.5/")) for line in lines)
    # the node (probes, port-forward) and loopback pass; any other new connection is dropped, last
    assert "-A INPUT -s 10.244.0.1/32 -j ACCEPT" in lines and "-A INPUT -i lo -j ACCEPT" in lines
    assert lines[-2:] == ["-A INPUT -p tcp --syn -j DROP", "COMMIT"]


def test_without_policies_every_pod_is_open() -> None:
    open_rules = netpolicy.iptables_rules(REPLICA, {8080}, SOURCES, [], "scanflow", "10.244.0.1")
    assert open_rules.splitlines() == ["*filter", ":INPUT ACCEPT [0:0]", "COMMIT"]
    assert netpolicy.admitted([], TRACKER, REPLICA, 8080, "scanflow")
    assert not netpolicy.admitted(POLICIES, TRACKER, REPLICA, 8080, "scanflow")
    assert netpolicy.admitted(POLICIES, REPLICA, TRACKER, 8080, "scanflow")  # prediction records
