"""S2 autoscaling benchmark: HPA vs the horizontal-only Planner vs the vertical-first Planner, on observations.

A SIMULATION, not a load test: the three controllers drive the same discrete-event queueing model of
inference replicas on the same arrival trace (Poisson, low -> high -> low step), same seeds, same
time-scale factor. Who runs it: people and CI (`python benchmarks/scaling.py --quick`).

What the controllers see is exactly what the deployed agents send (scanflow.agentkit.observe, the
Checker's `latency.checked`), never the trace's true rate or service time; the observation model and
the controllers are scanflow.policies.simulated, shared with the demo's comparison (scanflow/demo/sim.py):
- measured over the Checker's interval (1 s nominal): the arrival rate (arrivals / interval), CPU per
  request (CPU used / requests answered), the replicas' CPU utilization of their limit, throttling, the
  requests in flight, the node's unallocated cores, and the p99 latency of the requests answered, as
  the gateway's histogram gives it (the upper bound of the bucket it falls in);
- DELAYED by one interval (the Planner decides on the scrape before last: scrape, forward, decide);
- NOISY: the rates and CPU figures carry a lognormal error (sd 10%, `--noise`), as two scrapes taken a
  few milliseconds apart from the gateway and the replicas do.
The HPA sees the replicas' average CPU utilization over its own 15 s sync period, through the same delay.

Model (calibration in docs/policies.md):
- a replica given `c` cores runs ceil(c) worker threads, each at speed c / ceil(c) (a quota below one
  core slows its one thread; CFS throttles it while it is busy: `throttled_share`); a request costs a CPU time drawn from
  a gamma law, mean `--service-ms` (1 ms, ~1,000 one-row requests/s per core measured) and CV 0.5;
- the gateway sends each request to the earliest free worker of a ready replica (join-shortest-queue);
- a new replica serves after a start-up delay (10 s nominal: process start + model load); an in-place
  resize takes effect after 2 s nominal (plan delivery, cgroup write or `pods/resize`, read back);
  a removed replica takes no new request and finishes its queue, costing cores until it is empty;
- every replica runs on its own node of 8 CPUs (`--node-cpus`), so it may grow to 8 cores in place;
- every duration (trace phases, start-up, resize, controller periods and windows, interval) is
  divided by `--time-scale`, identically for all three.

Controllers: `hpa` (scanflow.policies.hpa, target 70% CPU, 1-core replicas), `horizontal` (the
Planner's scanflow.policies.elastic with vertical=False: 1-core replicas), `vertical` (the same policy
vertical-first, as workflows/digits runs it). Figures per controller (median over seeds):
SLO-violation seconds (1 s windows, by arrival time, whose p99 exceeds the SLO), core-seconds (cores
allocated x time), replica-seconds, flaps (a capacity move followed by one in the opposite direction
within 60 s nominal), max replicas, max cores per replica. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verdict import add_check, exit_code

from scanflow.policies.simulated import (
    STEP_TRACE,
    TICK_S,
    Controller,
    Observer,
    count_flaps,
    elastic_controller,
    hpa_controller,
    throttled_share,
)

NOMINAL_TRACE = STEP_TRACE  # (seconds, requests/s)
STARTUP_S = 10.0
RESIZE_S = 2.0
FLAP_WINDOW_S = 60.0
VIOLATION_WINDOW_S = 1.0
DECLARED_CPU = 1.0


@dataclass
class RunResult:
    controller: str
    violation_s: float
    core_s: float
    replica_s: float
    flaps: int
    max_replicas: int
    max_cpu: float
    moves: list[tuple[float, float, float]] = field(default_factory=list)  # (time, cores before, after)


def make_policy(slo_ms: float, max_replicas: int, time_scale: float, node_cpus: float, *,
                vertical: bool) -> Controller:
    """The Planner's policy with its shipped defaults (the digits workflow's settings); only the bounds,
    the time scale and vertical on/off are the benchmark's."""
    return elastic_controller(slo_ms, max_replicas, time_scale, node_cpus, vertical=vertical)


def make_hpa(max_replicas: int, time_scale: float) -> Controller:
    return hpa_controller(max_replicas, time_scale, tick_s=TICK_S)


def make_trace(seed: int, time_scale: float, service_ms: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Arrival times (Poisson per phase) and CPU costs (gamma, CV 0.5); the trace length."""
    rng = np.random.default_rng(seed)
    times, t0 = [], 0.0
    for dur, rate in NOMINAL_TRACE:
        d = dur / time_scale
        n = rng.poisson(rate * d)
        times.append(np.sort(rng.uniform(t0, t0 + d, n)))
        t0 += d
    arrivals = np.concatenate(times)
    shape = 4.0  # CV = 1/sqrt(shape) = 0.5
    service = rng.gamma(shape, service_ms / 1000.0 / shape, len(arrivals))
    return arrivals, service, t0


@dataclass
class _Replica:
    cpu: float
    ready_at: float
    created_at: float
    workers: list[float] = field(default_factory=list)  # free-at time of each worker thread
    cost_s: float = 0.0  # core-seconds up to `cpu_since`
    cpu_since: float = 0.0
    # resizes asked and not yet in effect, in the order asked: (takes effect at, new cores). Each lands
    # on its own time, as the Executor applies plans one after another (a later ask never postpones an
    # earlier one).
    pending: list[tuple[float, float]] = field(default_factory=list)

    def set_cpu(self, cpu: float, now: float) -> None:
        self.cost_s += self.cpu * (now - self.cpu_since)
        self.cpu, self.cpu_since = cpu, now
        k = max(1, math.ceil(cpu - 1e-9))
        if k > len(self.workers):
            self.workers += [now] * (k - len(self.workers))
        elif k < len(self.workers):  # the busiest workers keep their queued work; idle ones go
            self.workers = sorted(self.workers)[len(self.workers) - k:]

    @property
    def speed(self) -> float:
        return self.cpu / len(self.workers)

    def cost_until(self, t: float) -> float:
        return self.cost_s + self.cpu * max(0.0, t - self.cpu_since)


def simulate(controller: Controller, name: str, arrivals: np.ndarray, service: np.ndarray, end: float, *,
             slo_ms: float, time_scale: float, node_cpus: float = 8.0, noise: float = 0.1, seed: int = 0,
             start_cpu: float = DECLARED_CPU) -> RunResult:
    observer = Observer(noise=noise, seed=seed)
    tick = TICK_S / time_scale
    startup, resize = STARTUP_S / time_scale, RESIZE_S / time_scale
    n_ticks = math.ceil(end / tick)
    comp: list[list[tuple[float, float]]] = [[] for _ in range(n_ticks + 100_000)]  # (latency, cpu cost)
    latency = np.empty(len(arrivals))

    reps: dict[int, _Replica] = {0: _Replica(start_cpu, 0.0, 0.0)}
    reps[0].set_cpu(start_cpu, 0.0)
    next_id = 1
    retired_cost, retired_rs = 0.0, 0.0
    moves: list[tuple[float, float, float]] = []
    completed_before, i, n = 0, 0, len(arrivals)
    target_cpu, max_replicas, max_cpu = start_cpu, 1, start_cpu

    for k in range(n_ticks):
        t0, t_end = k * tick, (k + 1) * tick
        for r in reps.values():  # resizes that take effect by now
            while r.pending and r.pending[0][0] <= t0 + 1e-12:
                at, cores = r.pending.pop(0)
                r.set_cpu(cores, at)
        ready = [rid for rid, r in reps.items() if r.ready_at <= t0]
        heap = [(f, rid, w) for rid in ready for w, f in enumerate(reps[rid].workers)]
        heapq.heapify(heap)
        rep_busy = dict.fromkeys(ready, 0.0)
        first = i
        while i < n and arrivals[i] < t_end:
            a, x = arrivals[i], service[i]
            f, rid, w = heap[0]
            rep = reps[rid]
            start = max(f, a)
            done = start + x / rep.speed
            heapq.heapreplace(heap, (done, rid, w))
            rep.workers[w] = done
            latency[i] = done - a
            comp[int(done / tick)].append((done - a, x))
            rep_busy[rid] += x
            i += 1
        done_now = comp[k]
        completed_before += len(done_now)
        observer.observe(
            interval_s=tick, arrivals=i - first,
            p99_ms=float(np.percentile([d for d, _ in done_now], 99)) * 1000.0 if done_now else None,
            in_flight=float(i - completed_before),
            cpu_per_request_ms=sum(c for _, c in done_now) / len(done_now) * 1000.0 if done_now else None,
            cpu_used_s=sum(rep_busy.values()), cpu_capacity_s=sum(reps[rid].cpu for rid in ready) * tick,
            throttled=[throttled_share(rep_busy[rid] / tick, reps[rid].cpu) for rid in ready],
            headroom_cores_per_replica=max(0.0, node_cpus - max((reps[rid].cpu for rid in ready), default=0.0)))
        want_r, want_cpu = controller(observer.view(t_end, len(reps), len(ready), target_cpu))
        before = len(reps) * target_cpu
        if want_cpu != target_cpu:
            for r in reps.values():
                if r.ready_at <= t_end:
                    r.pending.append((t_end + resize, want_cpu))
                else:  # still starting: it starts with the new size
                    r.set_cpu(want_cpu, t_end)
            target_cpu = want_cpu
        if want_r > len(reps):
            for _ in range(want_r - len(reps)):
                rep = _Replica(target_cpu, t_end + startup, t_end, cpu_since=t_end)
                rep.set_cpu(target_cpu, t_end)
                reps[next_id] = rep
                next_id += 1
        elif want_r < len(reps):
            # drop replicas still starting first, then the ones with the least queued work
            order = sorted(reps, key=lambda rid: (reps[rid].ready_at <= t_end, max(reps[rid].workers)))
            for rid in order[: len(reps) - want_r]:
                rep = reps.pop(rid)
                gone = max(t_end, max(rep.workers))
                retired_cost += rep.cost_until(gone)
                retired_rs += gone - rep.created_at
        after = len(reps) * target_cpu
        if abs(after - before) > 1e-9:
            moves.append((t_end, before, after))
        max_replicas = max(max_replicas, len(reps))
        max_cpu = max(max_cpu, target_cpu)

    final = n_ticks * tick
    core_s = retired_cost + sum(r.cost_until(max(final, max(r.workers))) for r in reps.values())
    replica_s = retired_rs + sum(max(final, max(r.workers)) - r.created_at for r in reps.values())
    # SLO-violation seconds: 1 s windows (scaled like the rest) by arrival time whose p99 breaks the SLO
    win = VIOLATION_WINDOW_S / time_scale
    idx = (arrivals / win).astype(np.int64)
    bounds = np.flatnonzero(np.diff(idx)) + 1
    violated = sum(1 for chunk in np.split(latency, bounds) if len(chunk)
                   and np.percentile(chunk, 99) * 1000.0 > slo_ms)
    return RunResult(name, violated * win * time_scale, core_s * time_scale, replica_s * time_scale,
                     count_flaps(moves, FLAP_WINDOW_S / time_scale), max_replicas, max_cpu, moves)


CONTROLLERS = ("hpa", "horizontal", "vertical")


def run(seeds: int, time_scale: float, service_ms: float, slo_ms: float, max_replicas: int, *,
        node_cpus: float = 8.0, noise: float = 0.1) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {c: [] for c in CONTROLLERS}
    for seed in range(seeds):
        arrivals, service, end = make_trace(seed, time_scale, service_ms)
        ctls: dict[str, Controller] = {
            "hpa": make_hpa(max_replicas, time_scale),
            "horizontal": make_policy(slo_ms, max_replicas, time_scale, node_cpus, vertical=False),
            "vertical": make_policy(slo_ms, max_replicas, time_scale, node_cpus, vertical=True),
        }
        for name, ctl in ctls.items():
            out[name].append(simulate(ctl, name, arrivals, service, end, slo_ms=slo_ms, time_scale=time_scale,
                                      node_cpus=node_cpus, noise=noise, seed=seed))
    return out


def median(results: list[RunResult], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in results))


def ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b > 0 else (0.0 if a == 0 else math.inf)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="time scale 5 (about half a minute)")
    p.add_argument("--seeds", type=int, default=7)
    p.add_argument("--time-scale", type=float, default=None, help="divide every duration by this")
    p.add_argument("--service-ms", type=float, default=1.0, help="mean CPU time per request at one core")
    p.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency SLO")
    p.add_argument("--max-replicas", type=int, default=10)
    p.add_argument("--node-cpus", type=float, default=8.0, help="CPUs of each replica's node (its vertical ceiling)")
    p.add_argument("--noise", type=float, default=0.1, help="lognormal sd of the measured rates and CPU")
    add_check(p)
    a = p.parse_args(argv)
    ts = a.time_scale or (5.0 if a.quick else 1.0)
    if a.seeds < 1 or ts <= 0 or a.service_ms <= 0 or a.slo_ms <= 0 or a.max_replicas < 1 or a.node_cpus < 1 \
            or a.noise < 0:
        p.error("seeds, time-scale, service-ms, slo-ms, max-replicas and node-cpus must be positive, noise >= 0")
    t0 = time.perf_counter()
    res = run(a.seeds, ts, a.service_ms, a.slo_ms, a.max_replicas, node_cpus=a.node_cpus, noise=a.noise)
    wall = time.perf_counter() - t0

    phases = " -> ".join(f"{r:.0f} rps x {d / ts:.0f}s" for d, r in NOMINAL_TRACE)
    print(f"S2 autoscale SIMULATION on observations (1-interval delay, {a.noise:.0%} noise): {phases}; "
          f"{a.service_ms} ms CPU/request (gamma CV 0.5), p99 SLO {a.slo_ms} ms, start-up {STARTUP_S:g}s, "
          f"resize {RESIZE_S:g}s, {a.node_cpus:g}-CPU nodes, time scale {ts:g}, {a.seeds} seeds "
          f"(figures in nominal seconds)")
    print(f"{'controller':<11} {'violation_s':>12} {'core_s':>8} {'replica_s':>10} {'flaps':>6} {'max_repl':>9} "
          f"{'max_cpu':>8}   (medians; flaps: max)")
    for name, rs in res.items():
        print(f"{name:<11} {median(rs, 'violation_s'):>12.1f} {median(rs, 'core_s'):>8.0f} "
              f"{median(rs, 'replica_s'):>10.0f} {max(r.flaps for r in rs):>6d} {median(rs, 'max_replicas'):>9.0f} "
              f"{median(rs, 'max_cpu'):>8.2f}")
    for name, rs in res.items():
        moves = ", ".join(f"{t * ts:.0f}s:{f:g}->{to:g}" for t, f, to in rs[0].moves[:10])
        print(f"  {name} seed 0 capacity moves (cores): {moves}")
    v = {c: median(res[c], "violation_s") for c in CONTROLLERS}
    cs = {c: median(res[c], "core_s") for c in CONTROLLERS}
    flaps = {c: max(r.flaps for r in res[c]) for c in CONTROLLERS}
    figures = {
        "benchmark": "scaling", "simulation": True, "observed_inputs": True, "seeds": a.seeds, "time_scale": ts,
        "service_ms": a.service_ms, "slo_ms": a.slo_ms, "noise": a.noise, "node_cpus": a.node_cpus,
        "planner": "vertical",  # the policy workflows/digits runs
        **{f"{c}_violation_s": round(v[c], 1) for c in CONTROLLERS},
        **{f"{c}_core_s": round(cs[c], 1) for c in CONTROLLERS},
        **{f"{c}_flaps": flaps[c] for c in CONTROLLERS},
        "violation_ratio_vs_hpa": ratio(v["vertical"], v["hpa"]),
        "core_seconds_ratio_vs_hpa": ratio(cs["vertical"], cs["hpa"]),
        "flaps": flaps["vertical"],
        "horizontal_violation_ratio_vs_hpa": ratio(v["horizontal"], v["hpa"]),
        "horizontal_core_seconds_ratio_vs_hpa": ratio(cs["horizontal"], cs["hpa"]),
        "vertical_violation_ratio_vs_horizontal": ratio(v["vertical"], v["horizontal"]),
    }
    # a trace on which the baseline never violates the SLO measures nothing: its ratios are 0/0
    figures["target_met"] = bool(v["hpa"] > 0 and figures["violation_ratio_vs_hpa"] <= 0.34
                                 and figures["flaps"] == 0 and figures["core_seconds_ratio_vs_hpa"] <= 1.0)
    figures["vertical_target_met"] = bool(v["horizontal"] > 0
                                          and figures["vertical_violation_ratio_vs_horizontal"] <= 0.5)
    figures["wall_s"] = round(wall, 2)
    print(f"vertical-first vs HPA: violations x{figures['violation_ratio_vs_hpa']} (target <= 0.34), core-seconds "
          f"x{figures['core_seconds_ratio_vs_hpa']} (<= 1), flaps {figures['flaps']} (0); vs horizontal-only: "
          f"violations x{figures['vertical_violation_ratio_vs_horizontal']} (target <= 0.5); {wall:.1f}s wall")
    print(json.dumps(figures))
    return exit_code(figures, a.check)


if __name__ == "__main__":
    raise SystemExit(main())
