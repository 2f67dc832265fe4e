"""CPU per client request of each serving process, from /proc/<pid>/stat around a wrk run.

    flock /tmp/scanflow-bench.lock .venv/bin/python benchmarks/serving_cpu.py [--rounds 3] [--seconds 3] \
        [--concurrency 64 128] [--direct] [--baseline-tree OTHER_CHECKOUT] [--model-uri LOCAL_MODEL_DIR] [--quick]

Why: `benchmarks/serving.py` gives the throughput and `fraction_of_limit`; this says where the CPU
of one client request goes (gateway, each replica, wrk; the empty endpoint and its wrk), which is the
evidence for the CPU bound of the gateway path on a small machine (docs/benchmarks/serving.md, fifth pass). It
starts the same processes as serving.py (throw-away MLflow, the digits MLP, gateway + N single-thread
replicas, the empty endpoint on the same HTTP stack), then measures interleaved rounds: for each
concurrency, the gateway path, then the empty endpoint. CPU is utime+stime of the whole process (all
threads) from /proc/<pid>/stat, wrk's own from wait4's rusage. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import WRK_LUA, Started, free_port, register_model, spawned

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a whole process (every thread), seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of proc(5), after pid and comm


def per_request_us(cpu_s: float, requests: int) -> float:
    """CPU microseconds per client request (pure: the arithmetic the table prints)."""
    return cpu_s / requests * 1e6 if requests else float("nan")


def coalesced(state_url: str | None) -> tuple[float, float] | None:
    """(coalesced calls, coalesced requests) so far, from a gateway's GET /admin/state; None without one."""
    if state_url is None:
        return None
    import httpx

    counts = httpx.get(state_url, timeout=5).json()["counts"]
    return float(counts["coalesced_calls"]), float(counts["coalesced_requests"])


def wrk_measured(url: str, script: Path, concurrency: int, seconds: int, pids: dict[str, int],
                 state_url: str | None = None) -> dict[str, float]:
    """One wrk run; rps, p99, CPU us per request of each process in `pids` and of wrk itself, and for a
    gateway (`state_url`) the mean number of client requests per coalesced upstream call."""
    calls_before = coalesced(state_url)
    before = {k: proc_cpu_s(p) for k, p in pids.items()}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "5s", "-s", str(script), url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    after = {k: proc_cpu_s(p) for k, p in pids.items()}
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited with {proc.returncode}")
    doc = json.loads(next(line for line in out.splitlines() if line.startswith("WRKJSON "))[8:])
    n = int(doc["requests"])
    row = {"rps": n / (doc["duration_us"] / 1e6), "p99_ms": doc["p99_us"] / 1000.0,
           "errors": doc["errors"] + doc["non2xx"]}
    total = 0.0
    for k in pids:
        row[f"{k}_us"] = per_request_us(after[k] - before[k], n)
        row[f"{k}_cores"] = (after[k] - before[k]) / wall
        total += row[f"{k}_us"]
    row["wrk_us"] = per_request_us(usage.ru_utime + usage.ru_stime, n)
    row["total_us"] = total + row["wrk_us"]
    calls_after = coalesced(state_url)
    if calls_before is not None and calls_after is not None and calls_after[0] > calls_before[0]:
        row["batch"] = (calls_after[1] - calls_before[1]) / (calls_after[0] - calls_before[0])
    return row


def start_path(
    stack: ExitStack, tag: str, uri: str, replicas: int, env: dict[str, str], work: Path,
    gateway_args: list[str], cwd: Path | None,
) -> tuple[str, dict[str, int], list[Started]]:
    """Gateway + `replicas` single-thread replicas (from the source tree `cwd`, default this one):
    (predict URL, {process name: pid}, waiters)."""
    py = sys.executable
    rports = [free_port() for _ in range(replicas)]
    gport = free_port()
    pids: dict[str, int] = {}
    ready: list[Started] = []
    for i, rp in enumerate(rports):
        srv = stack.enter_context(spawned(
            [py, "-m", "scanflow.serving.replica", "--model-uri", uri, "--port", str(rp),
             "--threads", "1", "--service", "bench", "--replica-id", f"r{i}"],
            f"http://127.0.0.1:{rp}/ready", work / f"{tag}-replica-{i}.log", env, cwd=cwd))
        ready.append(srv)
        pids[f"replica{i}"] = srv.pid
    gw = stack.enter_context(spawned(
        [py, "-m", "scanflow.serving.gateway", "--port", str(gport), "--service", "bench",
         *[a for rp in rports for a in ("--replica", f"http://127.0.0.1:{rp}")], *gateway_args],
        f"http://127.0.0.1:{gport}/ready", work / f"{tag}-gateway.log", env, cwd=cwd))
    ready.append(gw)
    pids["gateway"] = gw.pid
    return f"http://127.0.0.1:{gport}/predict", pids, ready


def main() -> None:
    from scanflow.platform.children import stop_children_on_exit

    stop_children_on_exit()  # its servers stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 128])
    p.add_argument("--gateway-arg", action="append", default=[], help="extra flag for the gateway (repeatable)")
    p.add_argument("--model-uri", default=None,
                   help="a model the replicas load as is (e.g. a local MLflow model directory): no MLflow server")
    p.add_argument("--direct", action="store_true",
                   help="also wrk each path's first replica directly (POST /predict, no gateway)")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="another checkout: its gateway + replicas measured in the same rounds (paired A/B)")
    p.add_argument("--quick", action="store_true", help="one round of 2 s points (`make bench` runs this)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2
    if not shutil.which("wrk"):
        # /proc CPU per request needs a load generator whose own CPU is apart: skip (make bench goes on)
        print("serving_cpu: skipped, wrk is not installed (apt-get install -y wrk)")
        return
    import numpy as np
    from sklearn.datasets import load_digits

    from scanflow.tracking.server import MlflowServer

    py = sys.executable
    row = (load_digits().data[:1] / 16.0).astype(np.float32).tolist()
    body = json.dumps({"inputs": row})
    runs: dict[str, dict[int, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="scanflow-cpu-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(WRK_LUA % body)
        env = {"PATH": f"{Path(py).parent}:{os.environ.get('PATH', '')}", "SCANFLOW_LOG_LEVEL": "WARNING"}
        uri = args.model_uri
        if uri is None:
            import mlflow

            mlflow_srv = stack.enter_context(MlflowServer(work / "mlflow"))
            mlflow.set_tracking_uri(mlflow_srv.url)
            uri = register_model("cpu-digits")
            env["MLFLOW_TRACKING_URI"] = mlflow_srv.url
        paths = {"gateway_path": start_path(stack, "new", uri, args.replicas, env, work, args.gateway_arg, None)}
        if args.baseline_tree is not None:
            paths["baseline_path"] = start_path(stack, "old", uri, args.replicas, env, work, args.gateway_arg,
                                                args.baseline_tree.resolve())
        eport = free_port()
        empty = stack.enter_context(spawned(
            [py, str(ROOT / "benchmarks" / "serving.py"), "--empty-server", str(eport)],
            f"http://127.0.0.1:{eport}/", work / "empty.log"))
        for _, _, waiters in paths.values():
            for w in waiters:
                w()
        empty()
        targets: dict[str, tuple[str, dict[str, int], str | None]] = {
            name: (url, pids, url.replace("/predict", "/admin/state")) for name, (url, pids, _) in paths.items()}
        if args.direct:
            for name, (_, pids, waiters) in paths.items():
                targets[name.replace("_path", "_direct")] = (waiters[0].ready_url.replace("/ready", "/predict"),
                                                             {"replica0": pids["replica0"]}, None)
        targets["empty"] = (f"http://127.0.0.1:{eport}/", {"empty": empty.pid}, None)
        for r in range(args.rounds):
            for c in args.concurrency:
                # alternate the order each round so neither path always runs first
                order = list(targets.items()) if r % 2 == 0 else list(reversed(targets.items()))
                for name, (url, pids, state_url) in order:
                    runs.setdefault(name, {}).setdefault(c, []).append(
                        wrk_measured(url, script, c, args.seconds, pids, state_url))
    table = {k: {c: {m: statistics.median(r[m] for r in rs if m in r) for m in rs[0]} for c, rs in v.items()}
             for k, v in runs.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds, {args.seconds} s each")
    for name, per_c in table.items():
        for c, med in per_c.items():
            cells = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in med.items() if k.endswith("_us"))
            cores = ", ".join(f"{k[:-6]} {v:.2f}" for k, v in med.items() if k.endswith("_cores"))
            batch = f" | batch {med['batch']:.1f}" if "batch" in med else ""
            print(f"{name:>12} c={c:<4} {med['rps']:8.0f} rps  p99 {med['p99_ms']:6.1f} ms | us/request: {cells}"
                  f" | cores: {cores}{batch}")
    print(json.dumps({"load_average": os.getloadavg(), "rounds": args.rounds, "seconds": args.seconds,
                      "medians": {k: {str(c): {m: round(x, 2) for m, x in r.items()} for c, r in v.items()}
                                  for k, v in table.items()},
                      "runs": {k: {str(c): rs for c, rs in v.items()} for k, v in runs.items()}}))


if __name__ == "__main__":
    main()
