"""What the Checker observes of a real replica behind a real gateway: two scrapes of their /metrics
around a burst of requests give the arrival rate, the service time and CPU per request, the replica's
CPU used and limit, its throttling and its node's idle cores (scanflow.agentkit.observe)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from serving_helpers import LoadResult, closed_loop, wait_for

from scanflow.agentkit import observe

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _scrape(http: httpx.AsyncClient, gw: str, replica: str) -> tuple[observe.GatewaySample | None,
                                                                               dict[str, observe.ReplicaSample], float]:
    gw_text = (await http.get(gw + "/metrics")).text
    rep_text = (await http.get(replica + "/metrics")).text
    return observe.parse_gateway(gw_text), {replica: observe.parse_replica(rep_text)}, time.monotonic()


async def test_two_scrapes_around_load_give_rates_cpu_and_service_time(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    r = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    gw = await asyncio.to_thread(launch, "gateway", "--service", "digits", "--replica", r.url, "--allow-anonymous")
    async with httpx.AsyncClient(timeout=10) as http:
        g0, r0, t0 = await _scrape(http, gw.url, r.url)
        idle = observe.window(g0, g0, r0, r0, 1.0)
        assert idle["arrival_rate"] == 0 and idle["service_time_ms"] is None  # nothing happened: no rate
        stop, progress = asyncio.Event(), LoadResult()
        load = asyncio.create_task(closed_loop(gw.url, {"inputs": digits_rows[:1]}, 4, stop, progress))
        await wait_for(lambda: load.done() or progress.ok >= 300, 60, "300 answers through the gateway")
        stop.set()
        result = await load
        g1, r1, t1 = await _scrape(http, gw.url, r.url)
    assert result.failures == []
    obs = observe.window(g0, g1, r0, r1, t1 - t0)
    answered = result.ok
    assert obs["completion_rate"] == pytest.approx(answered / (t1 - t0), rel=0.05)
    assert obs["arrival_rate"] == pytest.approx(obs["completion_rate"], rel=0.05)  # nothing left in flight
    assert obs["mean_latency_ms"] > 0 and obs["service_time_ms"] > 0
    assert obs["service_time_ms"] < obs["mean_latency_ms"]  # queueing and the gateway hop excluded
    assert obs["cpu_used_cores"] > 0 and obs["cpu_per_request_ms"] > 0
    assert 0 < obs["cpu_utilization"] <= 1 and obs["cpu_limit_cores"] >= 1
    assert obs["threads"] >= 1 and obs["node_cpus"] >= 1
    assert obs["node_idle_cores"] is not None and 0 <= obs["node_idle_cores"] <= obs["node_cpus"]
    # one replica on the node, unlimited: nothing left to allocate beyond what it may already use
    assert obs["headroom_cores_per_replica"] == max(0.0, obs["node_cpus"] - obs["cpu_limit_cores"])
    if r1[r.url].periods is not None:  # the replica's cgroup has a CPU controller here
        assert obs["throttled_ratio"] is not None and 0 <= obs["throttled_ratio"] <= 1
