"""S3 tune, the oracle: from a mis-sized start, what the best serving configuration buys on this machine.

No agent decides here: every candidate is measured and the best is chosen by measurement, the upper bound
of what a tuner can buy. benchmarks/tuning.py measures what the agents choose (the S3 loop) instead.

The service starts mis-sized (one replica held to `--start-cpu` (0.1) of a core by its CFS quota, one
thread), as a service deployed with a small CPU limit would be; 0.1 as S3's mis-sized start (on a
shared machine whose other work keeps both cores busy, a 0.3 quota no longer binds: every process
gets less than that anyway, and measured 0.3 vs 2 cores came out even). Candidates
come from `scanflow.platform.topology.candidate_configs` (replicas x threads x pinning, the machine's
cores split evenly); all run behind the same gateway (LocalPlatform: real processes, real
sched_setaffinity and cgroup quotas) under the same closed-loop load (C concurrent clients, one-row
/predict requests, keep-alive). Configurations are switched in place (scale + set_resources).

Two phases, so a lucky probe cannot be quoted as a gain:
1. probe: every candidate measured in interleaved rounds; the best median is chosen;
2. confirm: the choice, the start and the untuned default (one replica on every core) are measured
   again in alternation, at least 3 rounds each; the quoted gains are ratios of those medians.
Each figure is the median over 1-second windows (throughput) or over all requests (latency). Prints a
table, then as its LAST line one JSON object with best_gain_vs_default (vs the mis-sized start; the
acceptance bar is >= 0.5) and gain_vs_untuned_default.

Usage: .venv/bin/python benchmarks/tuning_sweep.py [--quick] [--clients 16] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import add_check, exit_code

from scanflow.loadgen import measure_closed_loop
from scanflow.platform.local import LocalPlatform
from scanflow.platform.topology import Config, candidate_configs, default_config, read_topology
from scanflow.spec import Affinity, Resources, Service

HIDDEN = 2048  # width of the benchmark model's hidden layers (--hidden)


def save_model(path: Path, hidden: int = HIDDEN) -> str:
    """An MLP on sklearn digits' 64 inputs with three `hidden`-wide layers (~8.5M multiply-adds per row
    at 2048: ~600 rows/s on one thread here), saved as a local MLflow model (no tracking server needed). Why this size: with the tiny
    digits MLP the model costs microseconds and the gateway's HTTP work bounds every configuration
    alike (measured: 0.3 of a core served as much as 2 cores), so the benchmark would measure the
    client, not the serving configuration. Untrained: throughput does not depend on the weights."""
    import logging

    import mlflow.pytorch
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # pickle/local-version warnings are expected
    x, _y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    mlflow.pytorch.save_model(model.eval(), str(path), serialization_format="pickle", input_example=x[:2])
    return str(path)


def closed_loop(url: str, clients: int, seconds: float, warmup_s: float = 0.5) -> dict[str, float]:
    """`clients` back to back against url/predict (scanflow.loadgen's closed loop): median rps of the
    measured seconds, p50/p99 and errors."""
    body = json.dumps({"inputs": [[0.25] * 64]}).encode()
    return measure_closed_loop(url + "/predict", body, clients, seconds, warmup_s=warmup_s)


@dataclass(frozen=True)
class Setting:
    """One serving configuration: replicas x threads x CPU quota per replica (cores) x pinning."""

    replicas: int
    threads: int
    cpu: float
    affinity: str

    @property
    def label(self) -> str:
        return f"{self.replicas}x{self.threads}t-{self.cpu:g}c-{self.affinity}"

    @staticmethod
    def of(cfg: Config) -> Setting:
        return Setting(cfg.replicas, cfg.threads, float(cfg.cpus_per_replica), cfg.affinity)


START_CPU = 0.1  # the mis-sized start's quota, as S3's (scanflow/demo/s3_tune.py MIS_CPU); --start-cpu


def apply(platform: LocalPlatform, name: str, cfg: Setting) -> None:
    platform.scale(name, cfg.replicas)
    platform.set_resources(name, Resources(cpu=cfg.cpu, memory="2Gi"),
                           Affinity(policy=cfg.affinity), threads=cfg.threads)  # type: ignore[arg-type]


def measure(pf: LocalPlatform, endpoint: str, cfg: Setting, clients: int, seconds: float) -> dict[str, float]:
    apply(pf, "tune", cfg)
    return closed_loop(endpoint, clients, seconds)


def main() -> int:
    from scanflow.platform.children import stop_children_on_exit

    stop_children_on_exit()  # its servers stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer configs, 3 s windows, 1 probe round (~2 min)")
    add_check(ap)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=None, help="probe rounds (confirmation: at least 3)")
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="the model's hidden width (its cost per row)")
    ap.add_argument("--start-cpu", type=float, default=START_CPU, help="the mis-sized start's CPU quota (cores)")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    rounds = args.rounds or (1 if args.quick else 3)
    confirm_rounds = max(3, rounds)

    start = Setting(replicas=1, threads=1, cpu=args.start_cpu, affinity="none")  # the mis-sized start
    topo = read_topology()
    configs = candidate_configs(topo)
    if args.quick:  # the default and the split/pinned extremes only
        keep = {default_config(topo)} | {c for c in configs if c.threads == 1 and c.replicas == topo.total}
        keep |= {c for c in configs if c.replicas == 1 and c.threads == 1}
        configs = [c for c in configs if c in keep]
    configs.sort(key=lambda c: c.replicas)  # fewest process starts when switching
    untuned = Setting.of(default_config(topo))
    cands = [Setting.of(c) for c in configs]
    print(f"topology: {len(topo.sockets)} socket(s), {topo.total} cores; start {start.label}; {len(cands)} "
          f"candidates, {rounds} probe round(s) + {confirm_rounds} confirmation rounds x {seconds:.0f}s, "
          f"{args.clients} clients", file=sys.stderr)

    probes: dict[Setting, list[dict[str, float]]] = {c: [] for c in cands}
    confirm: dict[Setting, list[dict[str, float]]] = {}
    quota_applies = False
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scanflow-tuning-") as tmp:
        model = save_model(Path(tmp) / "model", args.hidden)
        with LocalPlatform(Path(tmp) / "home", tracking_uri=f"file://{tmp}/mlruns", token="bench-token") as pf:
            quota_applies = pf.cgroup_support.usable
            if not quota_applies:
                print(f"note: no cgroup CPU quota here ({pf.cgroup_support.reason}): the start is not "
                      f"held to {start.cpu:g} core, so the gain measures threads and placement only", file=sys.stderr)
            spec = Service(name="tune", model_uri=model, replicas=1, max_replicas=max(2, topo.total),
                           threads=start.threads, resources=Resources(cpu=start.cpu, memory="2Gi"))
            endpoint = pf.deploy(spec).endpoint
            assert endpoint is not None
            for r in range(rounds):
                for cfg in cands if r % 2 == 0 else list(reversed(cands)):
                    probes[cfg].append(measure(pf, endpoint, cfg, args.clients, seconds))
            chosen = max(cands, key=lambda c: statistics.median(m["rps"] for m in probes[c]))
            trio = list(dict.fromkeys([start, chosen, untuned]))
            confirm = {c: [] for c in trio}
            for r in range(confirm_rounds):  # alternation: drift of the machine's load hits each alike
                for cfg in trio if r % 2 == 0 else list(reversed(trio)):
                    confirm[cfg].append(measure(pf, endpoint, cfg, args.clients, seconds))
    elapsed = time.monotonic() - t_start

    def med(results: dict[Setting, list[dict[str, float]]], cfg: Setting, key: str) -> float:
        return statistics.median(m[key] for m in results[cfg])

    print("probe (choice):")
    print(f"{'config':<22}{'rps (median)':>14}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for cfg in cands:
        print(f"{cfg.label:<22}{med(probes, cfg, 'rps'):>14.0f} {med(probes, cfg, 'p50_ms'):>8.2f} "
              f"{med(probes, cfg, 'p99_ms'):>8.2f}{sum(m['errors'] for m in probes[cfg]):>8.0f}")
    start_rps, chosen_rps, untuned_rps = (med(confirm, c, "rps") for c in (start, chosen, untuned))
    print(f"confirmation, {confirm_rounds} alternating rounds (medians):")
    for name, cfg in (("start", start), ("chosen", chosen), ("untuned default", untuned)):
        print(f"  {name:<16}{cfg.label:<22}{med(confirm, cfg, 'rps'):>8.0f} rps  rounds "
              + " ".join(f"{m['rps']:.0f}" for m in confirm[cfg]))
    gain = chosen_rps / start_rps - 1 if start_rps else 0.0
    gain_untuned = chosen_rps / untuned_rps - 1 if untuned_rps else 0.0
    errors = sum(m["errors"] for runs in (probes, confirm) for ms in runs.values() for m in ms)
    print(f"chosen: {chosen.label} {gain:+.1%} over the mis-sized start, {gain_untuned:+.1%} over the untuned "
          f"default ({elapsed:.0f}s)")
    figures = {
        "benchmark": "tuning", "cores": topo.total, "clients": args.clients, "probe_rounds": rounds,
        "confirm_rounds": confirm_rounds, "start": start.label, "default": start.label,
        "default_rps": round(start_rps, 1), "best_rps": round(chosen_rps, 1),
        # without a CFS quota the start is not mis-sized, and a gain bought with failed requests is none
        "best_gain_vs_default": round(gain, 3), "target_met": gain >= 0.5 and quota_applies and errors == 0,
        "untuned_default": untuned.label, "untuned_default_rps": round(untuned_rps, 1),
        "gain_vs_untuned_default": round(gain_untuned, 3),
        "best_config": {"replicas": chosen.replicas, "threads": chosen.threads,
                        "cpus_per_replica": chosen.cpu, "affinity": chosen.affinity},
        "configs": {c.label: round(med(probes, c, "rps"), 1) for c in cands},
        "cgroup_quota": quota_applies, "hidden": args.hidden, "errors": int(errors), "seconds": round(elapsed, 1),
    }
    print(json.dumps(figures))
    return exit_code(figures, args.check)


if __name__ == "__main__":
    sys.exit(main())
