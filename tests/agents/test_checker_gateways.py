"""The Checker reads every gateway behind its endpoint (scanflow.agentkit.gateways): two real gateway
metric registries served by uvicorn on two loopback addresses under one name (the name's resolution
stubbed, as a headless Service's DNS answer), its real watch sensor, and what it judges."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from agents_support import digits_workflow, spec_of
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest

from scanflow.agentkit import gateways
from scanflow.platform.processes import free_port
from scanflow.settings import Settings

pytestmark = pytest.mark.timeout(120)


class Ctx:
    """The parts of scanflow.agent.Context the watch sensor touches."""

    def __init__(self, home: Path) -> None:
        self.name, self.workflow = "checker", digits_workflow()
        self.spec = spec_of(self.workflow, "checker")
        self.state: dict[str, Any] = {}
        self.settings = Settings(home=home, gateway_discovery="dns")
        self.log = logging.getLogger("test.checker")

    def now(self) -> float:
        return time.time()


def _gateway(replica: str) -> tuple[FastAPI, dict[str, Any]]:
    """A gateway's admin and metrics routes over a real metrics registry (`held["metrics"]`: replace it
    to play a restart of the gateway's process at the same address)."""
    from scanflow.serving.gateway_server import _Metrics

    held: dict[str, Any] = {"metrics": _Metrics()}
    app = FastAPI()

    @app.get("/admin/state")
    def state() -> dict[str, Any]:
        return {"replicas": [{"url": replica, "healthy": True, "outstanding": 1}],
                "backup": {"healthy": True}, "routed_to": "primary", "route": "auto"}

    @app.get("/metrics", response_class=PlainTextResponse)
    def text() -> str:
        return generate_latest(held["metrics"].registry).decode()

    return app, held


def _serve(held: dict[str, Any], n: int, seconds: float) -> None:
    for _ in range(n):
        held["metrics"].latency.observe(seconds)
        held["metrics"].requests.inc("200", "primary")


def test_the_watch_sums_every_gateway_behind_its_name_and_judges_only_intervals_of_the_same_processes(
        mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_app: Any) -> None:
    """(The watch writes its latency checks to the monitoring run: a real MLflow server on loopback.)"""
    from scanflow.serving import discovery
    from scanflow.serving.gateway_server import _Metrics
    from scanflow.standard import checker

    port = free_port()
    fast_app, fast = _gateway("http://127.0.0.9:1")
    slow_app, slow = _gateway("http://127.0.0.9:1")
    serve_app(fast_app, "127.0.0.1", port)
    serve_app(slow_app, "127.0.0.2", port)
    members = ["127.0.0.1", "127.0.0.2"]

    async def resolve(host: str, _port: int) -> list[str]:
        assert host == "gateways.test"
        return list(members)

    monkeypatch.setattr(discovery, "resolve_host", resolve)
    monkeypatch.setattr(checker, "service_url", lambda svc: f"http://gateways.test:{port}")
    ctx: Any = Ctx(tmp_path)

    def tick() -> dict[str, Any] | None:
        events = asyncio.run(checker.watch(ctx))
        return next((p for n, p in events if n == "latency.checked"), None)

    tick()  # the Checker has seen the service healthy: from now on it judges
    tick()  # the first interval with both counters known
    _serve(fast, 60, 0.004)  # one gateway fast, the other slow: only the sum shows the p99 a client sees
    _serve(slow, 60, 0.4)
    both = tick()
    assert both is not None and both["breached"] and both["latency_ms"] >= 250.0, both
    assert both["replicas"] == 1 and both["in_flight"] == 2  # one replica, one request in flight at each
    assert [m[0] for m in ctx.state["gateway_members"]] == [f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"]
    assert both["completion_rate"] is not None and both["completion_rate"] > 0

    # the slow gateway's process restarts at its address and serves more than it had before: its count
    # alone did not go down, its counters' creation time did change: that interval is not reported
    slow["metrics"] = _Metrics()
    _serve(slow, 200, 0.4)
    _serve(fast, 60, 0.004)
    assert tick() is None
    _serve(slow, 60, 0.4)
    _serve(fast, 60, 0.004)
    again = tick()
    assert again is not None and again["breached"], again

    members.remove("127.0.0.2")  # the slow gateway goes: the summed counters drop, that interval is not reported
    _serve(fast, 60, 0.004)
    assert tick() is None
    _serve(fast, 60, 0.004)
    after = tick()
    assert after is not None and not after["breached"] and after["latency_ms"] is not None
    assert after["latency_ms"] <= 5.0 and after["completion_rate"] > 0


def test_a_read_continues_the_last_only_for_the_same_processes_all_answering() -> None:
    a, b = ("a", 1.0, 5.0), ("b", 2.0, 2.0)
    assert gateways.continues([a, b], [("a", 1.0, 7.0), ("b", 2.0, 2.0)], complete=True)
    assert gateways.continues(None, [a], complete=True)  # the first read
    assert not gateways.continues([a, b], [("a", 1.0, 7.0)], complete=True)  # one left
    assert not gateways.continues([a], [("a", 1.0, 7.0), ("b", 9.0, 0.0)], complete=True)  # one came
    assert not gateways.continues([a, b], [("a", 1.0, 7.0), ("b", 3.0, 9.0)], complete=True)  # b restarted
    assert not gateways.continues([("a", None, 5.0)], [("a", None, 1.0)], complete=True)  # no creation time
    assert not gateways.continues([a, b], [("a", 1.0, 7.0), ("b", 2.0, 2.0)], complete=False)  # one did not answer


def test_member_of_reads_the_process_behind_an_answer() -> None:
    from scanflow.serving.gateway_server import _Metrics

    m = _Metrics()
    for _ in range(3):
        m.latency.observe(0.01)
    url, created, count = gateways.member_of("http://g:1", generate_latest(m.registry).decode())
    assert (url, count) == ("http://g:1", 3.0) and created is not None and created > 0


def test_merge_expositions_sums_each_series_by_name_and_labels() -> None:
    a = 'x_total{code="200"} 3.0\nx_total{code="500"} 1.0\nh_bucket{le="0.1"} 2.0\nh_bucket{le="+Inf"} 4.0\n'
    b = 'x_total{code="200"} 5.0\nh_bucket{le="0.1"} 1.0\nh_bucket{le="+Inf"} 1.0\ng 2.0\n'
    from scanflow.agentkit.latency import histogram

    merged = gateways.merge_expositions([a, b])
    assert histogram(merged, "h") == {0.1: 3.0, float("inf"): 5.0}
    assert 'x_total{code="200"} 8.0' in merged and 'x_total{code="500"} 1.0' in merged and "g 2.0" in merged
    assert gateways.merge_expositions([]) == ""


def test_merge_states_keeps_one_replica_per_url() -> None:
    s1 = {"route": "auto", "replicas": [{"url": "u1", "healthy": False, "outstanding": 2},
                                        {"url": "u2", "healthy": True, "outstanding": 0}]}
    s2 = {"route": "backup", "replicas": [{"url": "u1", "healthy": True, "outstanding": 3}]}
    merged = gateways.merge_states([s1, s2])
    assert merged["route"] == "auto"
    assert merged["replicas"] == [{"url": "u1", "healthy": True, "outstanding": 5},
                                  {"url": "u2", "healthy": True, "outstanding": 0}]
    assert gateways.merge_states([]) == {}


@pytest.mark.parametrize(("answer", "expected"), [
    (["10.0.0.5", "10.0.0.6"], ["http://10.0.0.5:8080", "http://10.0.0.6:8080"]),
    (["10.0.0.5"], ["http://10.0.0.5:8080"]),  # one address (a ClusterIP, one pod)
    (["10.0.0.5", "fd00::5"], ["http://10.0.0.5:8080"]),  # one host, two families: counted once
    (["fd00::5"], ["http://[fd00::5]:8080"]),
    ([], ["http://gw:8080"]),
])
def test_instances_are_the_addresses_of_one_family(monkeypatch: pytest.MonkeyPatch, answer: list[str],
                                                   expected: list[str]) -> None:
    from scanflow.serving import discovery

    async def resolve(host: str, port: int) -> list[str]:
        return answer

    monkeypatch.setattr(discovery, "resolve_host", resolve)
    assert asyncio.run(gateways.instances("http://gw:8080", "dns")) == expected
    assert asyncio.run(gateways.instances("http://127.0.0.1:8080", "dns")) == ["http://127.0.0.1:8080"]
    # static (the default): read as configured; https: never by address (the certificate names the host)
    assert asyncio.run(gateways.instances("http://gw:8080", "static")) == ["http://gw:8080"]
    assert asyncio.run(gateways.instances("https://gw:8443", "dns")) == ["https://gw:8443"]


def test_merge_states_sums_the_challengers_figures_and_keeps_the_worst_p99() -> None:
    a = {"replicas": [], "challenger": {"url": "http://c:1", "mode": "canary", "share": 0.1, "healthy": False,
                                        "answered": 10, "failed": 1, "timed": 10, "p99_ms": 12.0, "compared": 0,
                                        "agreed": 0, "recent_timed": 10, "recent_p99_ms": 40.0}}
    b = {"replicas": [], "challenger": {"url": "http://c:1", "mode": "canary", "share": 0.1, "healthy": True,
                                        "answered": 5, "failed": 0, "timed": 5, "p99_ms": 30.0, "compared": 4,
                                        "agreed": 3, "recent_timed": 5, "recent_p99_ms": 8.0}}
    merged = gateways.merge_states([a, b])["challenger"]
    assert (merged["answered"], merged["failed"], merged["timed"], merged["recent_timed"]) == (15, 1, 15, 15)
    assert merged["p99_ms"] == 30.0 and merged["healthy"] is True and merged["agreement"] == 0.75
    assert merged["recent_p99_ms"] == 40.0 and merged["champion_recent_p99_ms"] is None
    assert gateways.merge_states([{"replicas": []}, {"replicas": [], "challenger": None}])["challenger"] is None


def test_gateways_challengers_merge_within_one_delivery() -> None:
    from scanflow.agentkit.gateways import merge_challengers

    def ch(delivery: str, since: float, answered: int, p99: float, champion_p99: float) -> dict[str, object]:
        return {"url": "http://c:8080", "delivery": delivery, "since": since, "mode": "shadow", "share": 1.0,
                "healthy": True, "requests": answered, "mirrored": answered, "answered": 0, "failed": 0, "timed": answered,
                "p99_ms": p99, "champion_timed": answered, "champion_p99_ms": champion_p99, "compared": 0, "agreed": 0}

    # two gateways on the current delivery, one (not reached yet by the Executor's call) on the previous one
    merged = merge_challengers([ch("d2", 20.0, 100, 30.0, 10.0), None, ch("d1", 5.0, 900, 500.0, 9.0),
                                ch("d2", 12.0, 50, 40.0, 12.0)])
    assert merged is not None and merged["delivery"] == "d2" and merged["other_deliveries"] == 1
    assert (merged["requests"], merged["champion_timed"]) == (150, 150)
    assert (merged["p99_ms"], merged["champion_p99_ms"], merged["since"]) == (40.0, 12.0, 12.0)
    # one gateway each: the one set last
    tie = merge_challengers([ch("d1", 5.0, 900, 500.0, 9.0), ch("d2", 20.0, 100, 30.0, 10.0)])
    assert tie is not None and tie["delivery"] == "d2" and tie["requests"] == 100
    # most gateways hold the earlier delivery (the Executor's latest call reached one): the majority counts
    lagging = merge_challengers([ch("d1", 5.0, 900, 500.0, 9.0), ch("d1", 6.0, 100, 30.0, 9.0), ch("d2", 20.0, 1, 1.0, 1.0)])
    assert lagging is not None and lagging["delivery"] == "d1" and lagging["requests"] == 1000
    assert merge_challengers([None, None]) is None
