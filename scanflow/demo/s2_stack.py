"""S2's reads and actions on a running EmbeddedStack: the gateway's latency histogram and per-second
p99s, the replicas it routes to, a replica's CPU time (psutil), the Executor's actuators and the
Planner's autoscale strategy over REST, and the calibration ramp built on them. Separate from the
scenario (scanflow.demo.s2_autoscale) because S3 and the tuning benchmark drive the stack the same way,
and from the pure arithmetic (scanflow.demo.s2_capacity) because each of these needs live processes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from scanflow.demo.s2_capacity import SATURATED, SLO_MS, over_slo, probe_rates

if TYPE_CHECKING:
    from scanflow.demo.load import OpenLoad

STRATEGY = "autoscale"  # the Planner strategy the scenario turns on (the digits workflow's)
PROBE_S = 1.5  # seconds per calibration rate


def autoscale_strategy(**overrides: float) -> dict[str, Any]:
    """The digits workflow's own Planner autoscale strategy, as JSON for POST /strategies; `overrides`
    (the vertical knobs the Planner accepts from a strategy's args, e.g. min_cpu) go into its action's args."""
    from scanflow.examples.digits.workflow import workflow

    planner = next(a for a in workflow.agents if a.role == "planner")
    spec = next(s for s in planner.strategies if s.name == STRATEGY)
    body = spec.model_dump(mode="json")
    for action in body["actions"]:
        action["args"] = {**action.get("args", {}), **overrides}
    return body


def agent_request(stack: Any, method: str, role: str, path: str, body: Any = None, timeout_s: float = 60.0) -> httpx.Response:
    return httpx.request(method, stack.agent_urls[role] + path, json=body, timeout=timeout_s,
                         headers={"Authorization": f"Bearer {stack.token}"})


def run_executor_actuator(stack: Any, actuator: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one of the Executor's actuators now; its result (RuntimeError when it did not succeed)."""
    r = agent_request(stack, "POST", "executor", f"/actuators/{actuator}", {"args": args}, timeout_s=180.0)
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    if r.status_code != 200 or body.get("status") != "succeeded":
        raise RuntimeError(f"executor {actuator}: {r.status_code} {r.text[:200]}")
    return dict(body.get("result") or {})


def gateway_histogram(url: str) -> dict[float, float]:
    """The gateway's cumulative latency histogram now ({} when unreadable)."""
    from scanflow.agentkit.latency import histogram

    try:
        return histogram(httpx.get(f"{url}/metrics", timeout=5.0).text, "scanflow_gateway_request_latency_seconds")
    except httpx.HTTPError:
        return {}


def gateway_p99s(url: str, seconds: float, q: float = 0.99) -> list[float]:
    """The per-second gateway percentiles over `seconds` at the present load: the windows the Checker judges."""
    from scanflow.agentkit.latency import percentile_ms

    values: list[float] = []
    prev = gateway_histogram(url)
    for _ in range(max(1, int(seconds))):
        time.sleep(1.0)  # one measurement window, not a synchronisation
        cur = gateway_histogram(url)
        p = percentile_ms(prev, cur, q) if cur else None
        if p is not None:
            values.append(p.ms)
        prev = cur
    return values


def serving_replicas(url: str) -> int | None:
    """How many replicas the service's gateway routes to now (None: gateway unreadable)."""
    try:
        return len(httpx.get(f"{url}/admin/state", timeout=2.0).json().get("replicas") or [])
    except (httpx.HTTPError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads, through psutil); None when unreadable."""
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, ValueError):  # gone, not ours to read; a pid <= 0
        return None
    return float(t.user + t.system)


def limited_replicas(services: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Pure: the service's replicas as the Executor reports them (GET /services)."""
    return list((services.get(name) or {}).get("replicas") or [])


def calibrate(load: OpenLoad, url: str, pid: int, cpu_limit: float,
              slo_ms: float = SLO_MS) -> list[tuple[float, float, float | None]]:
    """A rate ramp on one replica held to `cpu_limit` cores: (rate, CPU cores it used, gateway p99 ms) per
    step (after an unmeasured warm-up at the first rate), up to the step where it used SATURATED of its
    limit or the gateway p99 broke `slo_ms` at two rates in a row (the
    input of `capacity`; S3 passes inf: it needs the CPU-bound capacity, and on a busy machine the p99
    breaks the SLO long before the replica is saturated). The load is left at the last rate."""
    from scanflow.agentkit.latency import percentile_ms

    points: list[tuple[float, float, float | None]] = []
    load.rate(probe_rates(10.0)[0])
    time.sleep(PROBE_S)  # warm-up at the first rate (the replica's first requests after its resize): not measured
    for r in probe_rates(10.0):
        load.rate(r)
        time.sleep(0.5)  # the rate settles: not measured
        h0, c0, t0 = gateway_histogram(url), cpu_seconds(pid), time.monotonic()
        time.sleep(PROBE_S)  # one measurement window, not a synchronisation
        h1, c1, t1 = gateway_histogram(url), cpu_seconds(pid), time.monotonic()
        if c0 is None or c1 is None:
            break
        p = percentile_ms(h0, h1, 0.99) if h1 else None
        points.append((r, (c1 - c0) / (t1 - t0), None if p is None else p.ms))
        if len(points) >= 2 and all(over_slo(q, slo_ms) for _, _, q in points[-2:]):
            break  # two rates in a row over the SLO: confirmed (see `capacity`)
        if points[-1][1] >= SATURATED * cpu_limit:
            break
    return points


def planner_latency_low(stack: Any) -> float:
    """The Planner's scale-down band (its autoscale `latency_low`) in the stack's workflow."""
    planner = next((a for a in stack.workflow.agents if a.role == "planner"), None)
    return float(((planner.settings if planner else {}).get("autoscale") or {}).get("latency_low", 0.5))


def restore_declared(stack: Any, svc: Any, declared: dict[str, Any]) -> None:
    """The declared resources and replica count again (S3 and later runs expect the service as declared)."""
    for actuator, args in (("set_resources", {"service": svc.name, "resources": declared, "threads": svc.threads}),
                           ("scale", {"service": svc.name, "replicas": svc.replicas})):
        try:
            run_executor_actuator(stack, actuator, args)
        except (RuntimeError, httpx.HTTPError, ValueError):
            pass  # best effort: the verdict stands; the next deploy applies the declared spec


def start_declared(stack: Any, svc: Any, url: str, timeout_s: float = 180.0) -> int | None:
    """Scale the service to its declared replica count and wait until its gateway routes to that many;
    the count it routes to at the end (None: unreadable). Why: a run before this one may have left more
    (a Planner whose own autoscale strategy scaled during S1's load); S2 calibrates one replica and
    judges the moves from the declared count."""
    if serving_replicas(url) == svc.replicas:
        return svc.replicas
    try:
        run_executor_actuator(stack, "scale", {"service": svc.name, "replicas": svc.replicas})
    except (RuntimeError, httpx.HTTPError, ValueError):
        return serving_replicas(url)  # the scenario reads what it starts from and says so
    deadline = time.monotonic() + timeout_s
    while (n := serving_replicas(url)) != svc.replicas and time.monotonic() < deadline:
        time.sleep(0.5)  # the gateway lists a replica once it is ready or drops it once drained: no event to await
    return n
