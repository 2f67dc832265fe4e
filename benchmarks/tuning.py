"""S3 tune decided by the agents: what the Planner's choice buys at the workload's load, against a mis-sized
start and against the workflow's untuned default.

    .venv/bin/python benchmarks/tuning.py --quick [--check]   # 3 rounds
    .venv/bin/python benchmarks/tuning.py                     # 5 rounds

On the embedded stack (MLflow, the four agents, the digits service as `scanflow demo` runs it: the
Planner's autoscale strategy off until a round turns it on, its durations divided by 10), each round:
1. the Executor holds the replica to --start-cpu (0.1) of a core, one thread, one replica (`set_resources`,
   `scale`, read back from its cgroup), and a rate ramp measures what it serves
   (`scanflow.demo.s2_stack.calibrate`);
2. the workload: an open-loop load at LOAD_FACTOR (2) times that, from a child process;
3. the start is measured: its capacity (a closed-loop probe, `scanflow.demo.s3_tune.capacity_probe`: an
   open loop cannot show it, a mis-sized replica that keeps up at a higher latency serves the same
   answers per second), then under the load (answers per second served, the gateway's p99);
4. the Planner's autoscale strategy goes on: Checker observations -> Planner (vertical-first) -> Executor
   `set_resources` / `scale`, read back. The round waits until the Planner settled
   (`scanflow.demo.s3_tune.settled`), turns the strategy off, and measures what the replicas run now,
   the agents' choice, the same two ways;
5. the untuned default (the workflow's declared resources and replicas) is applied and measured the same.
Keys (medians over rounds): `gain_vs_start` (capacity, choice / start - 1), `gain_vs_untuned_default`
(answers per second served at the workload's load, choice / default - 1: both should serve it all, so the
agents' choice is never worse beyond noise), `p99_ratio_vs_untuned_default` (at that load),
`capacity_vs_untuned_default` (what the choice could serve beyond the load, over the default's: a
smaller choice has less headroom, by design), `cores_vs_untuned_default` (the cores the choice uses over
the default's), each configuration's figures, `agent_decided` (every round: the Planner's first move
a grow, every plan the Executor ran applied and read back), `flaps` (the Planner's own counter over every
round), failed requests. `target_met`: agent_decided, gain_vs_start >= 0.5, gain_vs_untuned_default >=
-0.05, 0 flaps, 0 failed; `--check` exits 1 when it is not met. benchmarks/tuning_sweep.py is the oracle
beside it: every configuration measured, the best chosen by measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from verdict import add_check, exit_code

START_CPU = 0.1  # as S3's mis-sized start (scanflow/demo/s3_tune.py MIS_CPU)
LOAD_FACTOR = 2.0  # the workload, in multiples of what the start serves
MEASURE_S = 5.0  # seconds of each measurement under the load (after SETTLE_S)
SETTLE_S = 2.0  # after a change, before measuring: the backlog drains
GAIN_MIN, UNTUNED_TOLERANCE = 0.5, -0.05


def measure(load: Any, url: str, rate: float) -> dict[str, float | None]:
    """The configuration now: its capacity (closed-loop probe), then at the workload's `rate` the answers
    per second served and the gateway's median per-second p99 over MEASURE_S."""
    from scanflow.demo.s2_stack import gateway_p99s
    from scanflow.demo.s3_tune import capacity_probe, served

    time.sleep(SETTLE_S)  # the change settles and its backlog drains: not measured
    cap = capacity_probe(load)  # leaves the load idle
    load.rate(rate)
    time.sleep(SETTLE_S)  # the open loop reaches its rate: not measured
    t0 = time.monotonic()
    p99s = gateway_p99s(url, MEASURE_S)
    got = served(load.seconds(), t0 + 1.0, time.monotonic())
    return {"capacity_rps": cap, "rps": got, "p99_ms": statistics.median(p99s) if p99s else None}


def replicas_now(stack: Any, name: str) -> tuple[float | None, int]:
    """(the cores per replica the replicas run with, read back from their cgroups; how many are ready)."""
    from scanflow.demo.s2_stack import limited_replicas

    reps = [r for r in limited_replicas(stack.get("executor", "/services"), name) if r.get("ready")]
    return (reps[0].get("cpu_quota") if reps else None), len(reps)


def one_round(stack: Any, load: Any, svc: Any, declared: dict[str, Any], start_cpu: float) -> dict[str, Any]:
    from scanflow.demo.s2_capacity import MAX_RATE, capacity
    from scanflow.demo.s2_stack import (
        STRATEGY,
        agent_request,
        autoscale_strategy,
        calibrate,
        limited_replicas,
        run_executor_actuator,
    )
    from scanflow.demo.s3_tune import DECIDE_S, SETTLE_WAIT_S, chain, flaps_since, settled

    url = stack.service_url
    run_executor_actuator(stack, "scale", {"service": svc.name, "replicas": 1})
    run_executor_actuator(stack, "set_resources", {"service": svc.name, "threads": 1, "resources": {**declared, "cpu": start_cpu}})
    pid = int(limited_replicas(stack.get("executor", "/services"), svc.name)[0]["pid"])
    cap = capacity(calibrate(load, url, pid, start_cpu, slo_ms=float("inf")), start_cpu, slo_ms=float("inf"))
    if cap is None:
        raise RuntimeError("the start's capacity could not be measured (the rate ramp found no saturation)")
    rate = round(min(MAX_RATE, LOAD_FACTOR * cap), 1)
    start = measure(load, url, rate)  # leaves the load at `rate`
    wall = time.time()
    added = agent_request(stack, "POST", "planner", "/strategies", autoscale_strategy())
    if added.status_code != 201:
        raise RuntimeError(f"could not turn the Planner's autoscale on: {added.status_code} {added.text[:200]}")
    try:
        def decided() -> bool:
            c = chain(list(stack.get("planner", "/plans")), stack.decisions("executor", limit=1000), wall)
            return bool(c.resources_ok or c.resources_failed or c.scales)

        _wait(decided, DECIDE_S)
        was_settled = _wait(lambda: settled(list(stack.get("planner", "/plans")), wall, time.time()), SETTLE_WAIT_S)
    finally:
        agent_request(stack, "DELETE", "planner", f"/strategies/{STRATEGY}")
    plans = list(stack.get("planner", "/plans"))
    c = chain(plans, stack.decisions("executor", limit=1000), wall)
    cpu, replicas = replicas_now(stack, svc.name)
    choice = measure(load, url, rate)
    run_executor_actuator(stack, "set_resources", {"service": svc.name, "resources": declared, "threads": svc.threads})
    run_executor_actuator(stack, "scale", {"service": svc.name, "replicas": svc.replicas})
    default = measure(load, url, rate)
    load.rate(0)
    decided_ok = bool(c.moves) and c.moves[0].get("action") == "grow" and c.resources_failed == 0
    return {"rate": rate, "start": start, "choice": choice, "default": default, "choice_cpu": cpu,
            "choice_replicas": replicas, "agent_decided": decided_ok, "settled": was_settled,
            "moves": [f"{p.get('action')} cpu {p.get('current_cpu')}->{p.get('cpu')}" for p in c.moves],
            "flaps": flaps_since(plans, wall)}


def _wait(cond: Any, timeout_s: float) -> bool:
    from scanflow.demo.common import wait_for

    return wait_for(cond, timeout_s, interval_s=0.5)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b - 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds (the fewest the medians are taken over)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 3)")
    ap.add_argument("--start-cpu", type=float, default=START_CPU, help="the mis-sized start's CPU quota (cores)")
    add_check(ap)
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    from scanflow.agentkit.env import primary_service
    from scanflow.demo.common import clean_rows
    from scanflow.demo.load import OpenLoad
    from scanflow.demo.runner import demo_workflow
    from scanflow.platform.children import stop_children_on_exit
    from scanflow.stack import EmbeddedStack

    stop_children_on_exit()  # the stack's processes stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    failed = 0
    with tempfile.TemporaryDirectory(prefix="scanflow-tuning-") as tmp, \
            EmbeddedStack(Path(tmp) / "stack", demo_workflow(), quick=True) as stack:
        svc = primary_service(stack.workflow)
        declared = svc.resources.model_dump(mode="json")
        with OpenLoad(stack.service_url, clean_rows(), Path(tmp) / "load") as load:
            for i in range(rounds):
                res = one_round(stack, load, svc, declared, args.start_cpu)
                results.append(res)
                print(f"round {i + 1}: {res['rate']:.0f} rps offered; start {res['start']}, agents' choice "
                      f"{res['choice_cpu']} core x {res['choice_replicas']} ({'; '.join(res['moves'])}) {res['choice']}, "
                      f"untuned default {res['default']}; flaps {res['flaps']}", file=sys.stderr, flush=True)
            failed = sum(s.failed for s in load.seconds())
    seconds = time.monotonic() - t0

    def med(key: str, of: str) -> float | None:
        vals = [r[of][key] for r in results if r[of][key] is not None]
        return round(statistics.median(vals), 2) if vals else None

    def ratios(key: str, of: str, to: str) -> list[float]:
        return [g for g in (ratio(r[of][key], r[to][key]) for r in results) if g is not None]

    gains = ratios("capacity_rps", "choice", "start")
    vs_default = ratios("rps", "choice", "default")
    p99_vs_default = [g + 1.0 for g in ratios("p99_ms", "choice", "default")]
    cap_vs_default = [g + 1.0 for g in ratios("capacity_rps", "choice", "default")]
    declared_cores = float(svc.resources.cpu) * svc.replicas  # the untuned default: the declared size
    cores = [(r["choice_cpu"] or 0.0) * r["choice_replicas"] / declared_cores for r in results if r["choice_cpu"]]
    figures: dict[str, Any] = {
        "benchmark": "tuning", "rounds": rounds, "start_cpu": args.start_cpu,
        "gain_vs_start": round(statistics.median(gains), 3) if gains else None,
        "gain_vs_untuned_default": round(statistics.median(vs_default), 3) if vs_default else None,
        "p99_ratio_vs_untuned_default": round(statistics.median(p99_vs_default), 3) if p99_vs_default else None,
        "capacity_vs_untuned_default": round(statistics.median(cap_vs_default), 3) if cap_vs_default else None,
        "cores_vs_untuned_default": round(statistics.median(cores), 3) if cores else None,
        "start_capacity_rps": med("capacity_rps", "start"), "choice_capacity_rps": med("capacity_rps", "choice"),
        "default_capacity_rps": med("capacity_rps", "default"),
        "start_rps": med("rps", "start"), "choice_rps": med("rps", "choice"), "default_rps": med("rps", "default"),
        "start_p99_ms": med("p99_ms", "start"), "choice_p99_ms": med("p99_ms", "choice"),
        "default_p99_ms": med("p99_ms", "default"),
        "agent_decided": bool(results) and all(r["agent_decided"] for r in results),
        "flaps": sum(r["flaps"] for r in results), "failed_requests": int(failed),
        "choices": [f"{r['choice_cpu']} core x {r['choice_replicas']}" for r in results],
        "offered_rps": [r["rate"] for r in results], "seconds": round(seconds, 1),
    }
    figures["target_met"] = bool(figures["agent_decided"] and figures["gain_vs_start"] is not None
                                 and figures["gain_vs_start"] >= GAIN_MIN
                                 and figures["gain_vs_untuned_default"] is not None
                                 and figures["gain_vs_untuned_default"] >= UNTUNED_TOLERANCE
                                 and figures["flaps"] == 0 and failed == 0)
    print(json.dumps(figures))
    return exit_code(figures, args.check)


if __name__ == "__main__":
    sys.exit(main())
