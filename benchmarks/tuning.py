"""S3 tune: the default serving configuration against what the Planner can choose on this machine.

Default = one replica, torch's default threads (all cores), unpinned. Candidates come from
`scanflow.platform.topology.candidate_configs` (replicas x threads x pinning); all run behind the
same gateway (LocalPlatform: real processes, real sched_setaffinity) under the same closed-loop load
(C concurrent clients, one-row /predict requests, keep-alive). Configurations are switched in place
(scale + set_resources) and measured in interleaved rounds; each figure is the median over 1-second
windows (throughput) or over all requests (latency). Prints a table, then as its LAST line one JSON
object with best_gain_vs_default (0.30 = +30%) and the best config.

Usage: .venv/bin/python benchmarks/tuning.py [--quick] [--clients 16] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from scanflow.platform.local import LocalPlatform
from scanflow.platform.topology import Config, candidate_configs, default_config, read_topology
from scanflow.spec import Affinity, Resources, Service


def save_model(path: Path) -> str:
    """Tiny torch MLP on sklearn digits, saved as a local MLflow model (no tracking server needed)."""
    import logging

    import mlflow.pytorch
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # pickle/local-version warnings are expected
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    mlflow.pytorch.save_model(model, str(path), serialization_format="pickle", input_example=x[:2])
    return str(path)


async def closed_loop(url: str, clients: int, seconds: float, warmup_s: float = 0.5) -> dict[str, float]:
    """C clients each send the next request when the last one answered; count per 1-second window."""
    body = json.dumps({"inputs": [[0.25] * 64]}).encode()
    latencies: list[float] = []
    done_at: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        start = time.perf_counter()
        end = start + warmup_s + seconds

        async def worker() -> None:
            nonlocal errors
            while (t0 := time.perf_counter()) < end:
                try:
                    async with session.post(url + "/predict", data=body,
                                            headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        ok = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    ok = False
                t1 = time.perf_counter()
                if t0 >= start + warmup_s:
                    if ok:
                        latencies.append(t1 - t0)
                        done_at.append(t1)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
    t_begin = start + warmup_s
    windows = [0] * max(1, int(seconds))
    for t in done_at:
        k = int(t - t_begin)
        if 0 <= k < len(windows):
            windows[k] += 1
    lat = sorted(latencies) or [float("nan")]
    return {
        "rps": float(statistics.median(windows)),
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "errors": errors,
    }


def apply(platform: LocalPlatform, name: str, cfg: Config) -> None:
    platform.scale(name, cfg.replicas)
    platform.set_resources(name, Resources(cpu=cfg.cpus_per_replica, memory="2Gi"),
                           Affinity(policy=cfg.affinity), threads=cfg.threads)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round, 3 s windows, fewer configs (< 1 min)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 5.0)
    rounds = args.rounds or (1 if args.quick else 3)

    topo = read_topology()
    configs = candidate_configs(topo)
    if args.quick:  # the default and the split/pinned extremes only
        keep = {default_config(topo)} | {c for c in configs if c.threads == 1 and c.replicas == topo.total}
        keep |= {c for c in configs if c.replicas == 1 and c.threads == 1}
        configs = [c for c in configs if c in keep]
    configs.sort(key=lambda c: c.replicas)  # fewest process starts when switching
    base = default_config(topo)
    print(f"topology: {len(topo.sockets)} socket(s), {topo.total} cores; {len(configs)} configs, "
          f"{rounds} round(s) x {seconds:.0f}s, {args.clients} clients", file=sys.stderr)

    results: dict[Config, list[dict[str, float]]] = {c: [] for c in configs}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scanflow-tuning-") as tmp:
        model = save_model(Path(tmp) / "model")
        with LocalPlatform(Path(tmp) / "home", tracking_uri=f"file://{tmp}/mlruns", token="bench-token") as pf:
            spec = Service(name="tune", model_uri=model, replicas=1, max_replicas=max(2, topo.total),
                           threads=base.threads, resources=Resources(cpu=topo.total, memory="2Gi"))
            endpoint = pf.deploy(spec).endpoint
            assert endpoint is not None
            for r in range(rounds):
                order = configs if r % 2 == 0 else list(reversed(configs))
                for cfg in order:
                    apply(pf, "tune", cfg)
                    results[cfg].append(asyncio.run(closed_loop(endpoint, args.clients, seconds)))
    elapsed = time.monotonic() - t_start

    def med(cfg: Config, key: str) -> float:
        return statistics.median(m[key] for m in results[cfg])

    base_rps = med(base, "rps")
    print(f"{'config':<18}{'rps (median)':>14}{'vs default':>12}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for cfg in configs:
        gain = med(cfg, "rps") / base_rps - 1 if base_rps else 0.0
        print(f"{cfg.label:<18}{med(cfg, 'rps'):>14.0f}{gain:>+11.1%} {med(cfg, 'p50_ms'):>8.2f} "
              f"{med(cfg, 'p99_ms'):>8.2f}{sum(m['errors'] for m in results[cfg]):>8.0f}")
    best = max(configs, key=lambda c: med(c, "rps"))
    gain = med(best, "rps") / base_rps - 1 if base_rps else 0.0
    print(f"best: {best.label} {gain:+.1%} over default ({elapsed:.0f}s)")
    print(json.dumps({
        "benchmark": "tuning", "cores": topo.total, "clients": args.clients, "rounds": rounds,
        "default_rps": round(base_rps, 1), "best_rps": round(med(best, "rps"), 1),
        "best_gain_vs_default": round(gain, 3),
        "best_config": {"replicas": best.replicas, "threads": best.threads,
                        "cpus_per_replica": best.cpus_per_replica, "affinity": best.affinity},
        "configs": {c.label: round(med(c, "rps"), 1) for c in configs},
        "seconds": round(elapsed, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
