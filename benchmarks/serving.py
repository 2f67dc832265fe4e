"""Serving benchmark: Scanflow (gateway + N replicas) against the servers a user would pick instead, on the
same cores, with the same model and the same load.

    make bench-peers                                      # the peers' own environments (once)
    .venv/bin/python benchmarks/serving.py --quick        # ~25-30 minutes on 2 cores with every peer

The same registered digits MLP (torch, pickle format) is served by
- scanflow: `python -m scanflow.serving.gateway` (its default fast front) in front of N
  `scanflow.serving.replica` processes, on POST /predict and on the Open Inference Protocol v2 path;
- scanflow_asgi_front: a second gateway on the same replicas with `--front asgi` (every request through
  uvicorn's ASGI cycle); scanflow_one_by_one: a third with `--coalesce-max 0` (each client request
  forwarded on its own); scanflow_direct: one replica, no gateway (what the gateway hop costs);
- the peers (benchmarks/serving_peers.py, each in the settings its documentation recommends for
  throughput on a small machine, with and without its documented batching): `mlflow models serve`
  (--workers 1 and 2; it has no batching), MLServer with its MLflow runtime (parallel_workers 0 and 2,
  adaptive batching off and a small sweep of max_batch_size / max_batch_time), Ray Serve (1 and 2
  replicas, with and without @serve.batch, HAProxy ingress); a peer that cannot run is reported with
  the reason (`peers_not_run`) and the ratios are over those that ran.
Each is driven by the same closed-loop load generator at several concurrencies: Debian's `wrk` with a
Lua script for the POST body (`make bench-sysdeps`), or, when wrk is missing, the project's own
generator in its own process. One row (64 floats) per request. Every point lasts 10 s (shorter points
favoured whoever warms up fastest). Medians over `--repeats` (3) interleaved rounds, in which every
system of a phase is measured once (`--quick`: 8/64/128 clients).

Two phases: (1) before any peer starts, our systems and the empty endpoint alone -> fraction_of_limit;
(2) the peers started: a prescreen measures every configuration once at 8 and at 64 clients, and the
best configuration of each server at each of the two (one or two per server) goes on; then those, our
gateway path and the empty endpoint in rounds -> every ratio to a peer. Every configuration's prescreen
figures are printed and kept (`peer_configurations`).
The peers' processes stay alive while idle and take CPU from whatever runs, which taxes a path needing
both cores more than the one-process empty endpoint; so the fraction is measured without them, and
reported with them as well (`fraction_of_limit_peers_running`).

The limit on these cores is the lower of (a) the model's in-process batched throughput (rows/s at
batch 32) and (b) an empty endpoint on the same HTTP stack (uvicorn + uvloop + httptools, raw ASGI, one
process) under the same generator, measured in every round; `fraction_of_limit` is the median over
rounds of the best rps / that round's limit. The LAST line printed is one JSON object of figures.

OIP v2 infer against /predict on the same gateway (phase 1): `v2_throughput_ratio_vs_predict_c8` and
`_c64`, each to be >= 0.8 (`v2_target_met`; part of `target_met`, so `--check` fails without it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from scanflow.platform.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import serving_peers
from verdict import add_check, exit_code

WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, ' ..
    '"errors": %%d, "non2xx": %%d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(99), e.connect + e.read + e.write + e.timeout, e.status))
end
"""


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not up in {timeout_s}s")


class Started:
    """A spawned server: call it to wait until it answers; `pid` for /proc (benchmarks/serving_cpu.py)."""

    def __init__(self, proc: subprocess.Popen[bytes], ready_url: str, timeout_s: float = 120) -> None:
        self.proc, self.pid, self.ready_url, self.timeout_s = proc, proc.pid, ready_url, timeout_s

    def __call__(self) -> None:
        wait_http(self.ready_url, self.timeout_s, self.proc)


@contextmanager
def spawned(
    cmd: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None,
    timeout_s: float = 120,
) -> Iterator[Started]:
    """Start a server now; the yielded object waits until it answers when called. Stopped (group) on exit."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True, cwd=cwd)
    try:
        yield Started(proc, ready_url, timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


# ---- load generators ----------------------------------------------------------------------------
def run_wrk(url: str, body: str, concurrency: int, seconds: float, workdir: Path) -> dict[str, float]:
    script = workdir / "post.lua"
    script.write_text(WRK_LUA % body)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "5s", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout
    doc = json.loads(next(line for line in out.splitlines() if line.startswith("WRKJSON "))[8:])
    return {
        "rps": doc["requests"] / (doc["duration_us"] / 1e6),
        "p50_ms": doc["p50_us"] / 1000.0,
        "p99_ms": doc["p99_us"] / 1000.0,
        "errors": doc["errors"] + doc["non2xx"],
    }


def run_load(url: str, body: str, concurrency: int, seconds: float, workdir: Path) -> dict[str, float]:
    if shutil.which("wrk"):
        return run_wrk(url, body, concurrency, seconds, workdir)
    out = subprocess.run(
        [sys.executable, __file__, "--loadgen", url, str(concurrency), str(seconds)],
        input=body, capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(urls: dict[str, tuple[str, str]], bodies: dict[str, str], concurrencies: list[int], seconds: float,
            repeats: int, workdir: Path) -> dict[str, dict[int, list[dict[str, float]]]]:
    """Interleaved rounds: in each, every system at every concurrency once, so load from other processes
    hits all of them alike; {system: {concurrency: [one result per round]}}."""
    runs: dict[str, dict[int, list[dict[str, float]]]] = {k: {c: [] for c in concurrencies} for k in urls}
    for _ in range(repeats):
        for c in concurrencies:
            for name, (url, kind) in urls.items():
                runs[name][c].append(run_load(url, bodies[kind], c, seconds, workdir))
    return runs


PRESCREEN = (8, 64)  # the concurrencies the ratios to the best peer are taken at
V2_CLIENTS = (8, 64)  # the concurrencies OIP v2 infer is compared with /predict at
V2_TARGET = 0.8  # v2 infer's throughput over /predict's, at each of V2_CLIENTS


def finalists(prescreen: dict[str, dict[int, dict[str, float]]], family: dict[str, str]) -> list[str]:
    """Pure: per server (family) and per prescreen concurrency, its configuration with the highest
    throughput (ties: the lower p99); each server's number is then its best configuration's."""
    out: list[str] = []
    for fam in dict.fromkeys(family.values()):
        members = [n for n in prescreen if family[n] == fam]
        for c in PRESCREEN:
            best = max(members, key=lambda n: (prescreen[n][c]["rps"], -prescreen[n][c]["p99_ms"]))
            if best not in out:
                out.append(best)
    return out


def medians(runs: dict[str, dict[int, list[dict[str, float]]]]) -> dict[str, dict[int, dict[str, float]]]:
    """Per system and concurrency, the median over rounds of each figure."""
    return {k: {c: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for c, rs in v.items()}
            for k, v in runs.items()}


def fraction(runs: dict[str, dict[int, list[dict[str, float]]]], name: str, model_rows: float) -> float:
    """Median over rounds of (best rps of `name` over the concurrencies / the limit measured in the same
    round: the lower of the empty endpoint's best rps and the model's batched rows/s)."""
    concurrencies = list(runs[name])
    per_round = [
        max(runs[name][c][i]["rps"] for c in concurrencies)
        / min(max(runs["empty"][c][i]["rps"] for c in concurrencies), model_rows)
        for i in range(len(runs[name][concurrencies[0]]))
    ]
    return round(statistics.median(per_round), 2)


def print_table(title: str, table: dict[str, dict[int, dict[str, float]]], concurrencies: list[int]) -> None:
    print(f"\n{title}\n{'system':>20} | " + " | ".join(f"{c:>6} clients: rps / p50 / p99 ms" for c in concurrencies))
    for k in table:
        cells = [f"{table[k][c]['rps']:12.0f} / {table[k][c]['p50_ms']:6.2f} / {table[k][c]['p99_ms']:7.2f}"
                 for c in concurrencies]
        print(f"{k:>20} | " + " | ".join(cells))


# ---- the pieces ----------------------------------------------------------------------------------
def register_model(name: str) -> str:
    import mlflow
    import mlflow.pytorch
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    mlflow.set_experiment("serving-benchmark")
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(
            model, name="model", serialization_format="pickle", input_example=x[:2],
            registered_model_name=name, pip_requirements=["torch==2.13.0"],
        )
    return f"models:/{name}/{info.registered_model_version}"


def model_limit(uri: str, seconds: float) -> float:
    """Rows/s of the model alone, batch 32, in this process (one thread)."""
    import numpy as np
    import torch

    from scanflow.serving.model import load_model

    torch.set_num_threads(1)
    m = load_model(uri)
    x = np.random.default_rng(0).random((32, 64), dtype=np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        m.predict(x)
        n += 32
    return n / (time.perf_counter() - t0)


async def _empty_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b'{"outputs":[0],"model_version":"1","request_id":"x"}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> int:
    from scanflow.platform.children import stop_children_on_exit

    stop_children_on_exit()  # its servers stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs, three concurrencies (8, 64, 128)")
    p.add_argument("--replicas", type=int, default=2)
    add_check(p)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--loadgen", nargs=3, metavar=("URL", "CONCURRENCY", "SECONDS"), help=argparse.SUPPRESS)
    p.add_argument("--empty-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.loadgen:
        url, c, s = args.loadgen
        from scanflow.loadgen import measure_closed_loop

        print(json.dumps(measure_closed_loop(url, sys.stdin.read().encode(), int(c), float(s), warmup_s=0.0)))
        return
    if args.empty_server:
        from scanflow.serving.server import run_server

        run_server(_empty_app, "127.0.0.1", args.empty_server, "WARNING")
        return

    # 128 in both sweeps: the coalescing gateway fills its batches only with enough requests outstanding
    # (it gained ~10-20% from 64 to 128 clients here) while the empty endpoint is flat from 64 up, and
    # every system gets the same points, so the fraction (max over concurrencies per system) stays fair.
    concurrencies = [8, 64, 128] if args.quick else [1, 8, 32, 64, 128]
    seconds = 10.0  # wrk takes whole seconds
    repeats = args.repeats or 3
    py = sys.executable
    env_path = {"PATH": f"{Path(py).parent}:{os.environ.get('PATH', '')}"}
    import numpy as np
    from sklearn.datasets import load_digits

    row = (load_digits().data[:1] / 16.0).astype(np.float32).tolist()
    bodies = {
        "native": json.dumps({"inputs": row}),
        # the same row as one Open Inference Protocol v2 tensor (our /v2 path and MLServer's)
        "oip": json.dumps({"inputs": [{"name": "input", "shape": [1, len(row[0])], "datatype": "FP32",
                                       "data": row[0]}]}),
    }
    figures: dict[str, object] = {"loadgen": "wrk" if shutil.which("wrk") else "asyncio",
                                  "cpus": len(os.sched_getaffinity(0)), "replicas": args.replicas,
                                  "seconds_per_point": seconds, "repeats": repeats,
                                  "load_average_start": round(os.getloadavg()[0], 2)}
    from scanflow.tracking.server import MlflowServer

    with tempfile.TemporaryDirectory(prefix="scanflow-bench-") as tmp:
        work = Path(tmp)
        with MlflowServer(work / "mlflow") as mlflow_srv:
            import mlflow

            mlflow.set_tracking_uri(mlflow_srv.url)
            env = {**env_path, "MLFLOW_TRACKING_URI": mlflow_srv.url}
            uri = register_model("bench-digits")
            model_dir = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(work / "model")))
            print(f"model {uri}; load generator {figures['loadgen']}; {figures['cpus']} cpus", flush=True)
            peer_list, skipped = serving_peers.peers(model_dir, work, free_port, py, uri, env)

            # Start every server at once (they idle while another is measured), then measure one at a time.
            eport, gport, gport1, gport2 = free_port(), free_port(), free_port(), free_port()
            ports = [free_port() for _ in range(args.replicas)]
            threads = str(max(1, len(os.sched_getaffinity(0)) // args.replicas))
            quiet = {"SCANFLOW_LOG_LEVEL": "WARNING"}
            with ExitStack() as stack:
                ready = []
                for i, rp in enumerate(ports):
                    ready.append(stack.enter_context(spawned(
                        [py, "-m", "scanflow.serving.replica", "--model-uri", uri, "--port", str(rp),
                         "--threads", threads, "--service", "bench", "--replica-id", f"r{i}"],
                        f"http://127.0.0.1:{rp}/ready", work / f"replica-{i}.log", {**env, **quiet})))
                replica_args = [a for rp in ports for a in ("--replica", f"http://127.0.0.1:{rp}")]
                fronts = ((gport, ["--front", "fast"]), (gport1, ["--coalesce-max", "0", "--front", "asgi"]),
                          (gport2, ["--front", "asgi"]))
                for gp, extra in fronts:
                    ready.append(stack.enter_context(spawned(
                        [py, "-m", "scanflow.serving.gateway", "--port", str(gp), "--service", "bench",
                         *replica_args, *extra],
                        f"http://127.0.0.1:{gp}/ready", work / f"gateway-{gp}.log", quiet)))
                ready.append(stack.enter_context(spawned(
                    [py, __file__, "--empty-server", str(eport)], f"http://127.0.0.1:{eport}/", work / "empty.log")))
                for wait in ready:
                    wait()
                urls = {
                    "scanflow": (f"http://127.0.0.1:{gport}/predict", "native"),
                    "scanflow_oip": (f"http://127.0.0.1:{gport}/v2/models/bench-digits/infer", "oip"),
                    "scanflow_asgi_front": (f"http://127.0.0.1:{gport2}/predict", "native"),
                    "scanflow_one_by_one": (f"http://127.0.0.1:{gport1}/predict", "native"),
                    "scanflow_direct": (f"http://127.0.0.1:{ports[0]}/predict", "native"),
                    "empty": (f"http://127.0.0.1:{eport}/", "native"),
                }
                # Phase 1, before any peer starts: our systems and the empty endpoint alone, in interleaved
                # rounds -> fraction_of_limit. Why apart: the peers' processes stay alive while idle (Ray's
                # raylet, GCS and proxy; MLServer; two mlflow servers) and take CPU from whatever runs; that
                # taxes a path that needs both cores (wrk + gateway + replicas) more than the one-process
                # empty endpoint it is divided by (measured: 0.51 of the limit with them idle, 0.57 without,
                # the same code), so the fraction is measured without them (and reported with them too).
                runs = measure(urls, bodies, concurrencies, seconds, repeats, work)
                # Phase 2: the peers, one process per group (Ray's two applications share one), each waited
                # for alone; one that does not come up is reported with the reason and left out. Then every
                # peer, our gateway path (native and OIP v2) and the empty endpoint in interleaved rounds, so
                # each ratio to a peer compares systems measured in the same rounds, under the same load.
                peer_ready: dict[str, list[Started]] = {}
                procs: dict[str, Started] = {}
                for peer in peer_list:
                    key = peer.group or peer.name
                    if key not in procs:
                        procs[key] = stack.enter_context(spawned(
                            peer.cmd, peer.ready_urls[0], work / f"peer-{key}.log", peer.env, peer.cwd, 300))
                    peer_ready[peer.name] = [Started(procs[key].proc, u, 300) for u in peer.ready_urls]
                side = {k: urls[k] for k in ("scanflow", "scanflow_oip", "empty")}
                configs: dict[str, str] = {}
                candidates: dict[str, serving_peers.Peer] = {}
                for peer in peer_list:
                    try:
                        for wait in peer_ready[peer.name]:
                            wait()
                        check = run_load(peer.url, bodies[peer.body], 1, 1, work)
                        if check["errors"] or not check["rps"]:
                            raise RuntimeError(f"{check['errors']:.0f} failed requests in a 1 s check")
                    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
                        log_tail = (work / f"peer-{peer.group or peer.name}.log").read_text(errors="replace")[-600:]
                        skipped[peer.name] = f"{exc}; log: {log_tail}"
                        print(f"peer {peer.name} left out: {exc}", flush=True)
                        continue
                    candidates[peer.name] = peer
                prescreen = {name: {c: run_load(peer.url, bodies[peer.body], c, seconds, work) for c in PRESCREEN}
                             for name, peer in candidates.items()}
                for name in finalists(prescreen, {n: p.family for n, p in candidates.items()}):
                    side[name] = (candidates[name].url, candidates[name].body)
                    configs[name] = candidates[name].config
                side_runs = measure(side, bodies, concurrencies, seconds, repeats, work) if configs else {}
            model_rows = model_limit(uri, 1.0)

    table = medians(runs)
    side = medians(side_runs)
    print("\nprescreen: every peer configuration once, rps / p99 ms at " + " and ".join(map(str, PRESCREEN)) + " clients")
    for name, by_c in prescreen.items():
        mark = "*" if name in configs else " "
        figs = "  ".join(f"{by_c[c]['rps']:7.0f} / {by_c[c]['p99_ms']:6.1f}" for c in PRESCREEN)
        print(f" {mark} {name:<24} {figs}   {candidates[name].config}")
    print_table("phase 1: ours and the empty endpoint, no peer running", table, concurrencies)
    if side:
        print_table("phase 2: the peers, our gateway path and the empty endpoint (peers running)", side,
                    concurrencies)
    empty_rps = statistics.median(max(runs["empty"][c][i]["rps"] for c in concurrencies) for i in range(repeats))
    limit = min(empty_rps, model_rows)
    print(f"\nlimit: empty endpoint {empty_rps:.0f} rps (median over rounds of the best concurrency), "
          f"model batched {model_rows:.0f} rows/s -> {limit:.0f} rps")
    for name, reason in skipped.items():
        print(f"peer {name} did not run: {reason}")
    top = max(concurrencies)
    errors = {k: sum(v[c]["errors"] for c in concurrencies) for k, v in table.items()}
    errors |= {f"{k}@phase2" if k in table else k: sum(v[c]["errors"] for c in concurrencies) for k, v in side.items()}
    ran = list(configs)
    # Against the best peer at each concurrency (the highest throughput among the peers that ran there),
    # all from phase 2's rounds: the lower throughput ratio of 8 and 64 clients, and the higher p99 ratio.
    vs_best: dict[str, dict[str, object]] = {}
    for c in (8, 64):
        if c in concurrencies and ran:
            best = max(ran, key=lambda k: side[k][c]["rps"])
            vs_best[str(c)] = {
                "best_peer": best,
                "throughput_ratio": round(side["scanflow"][c]["rps"] / side[best][c]["rps"], 2),
                "p99_ratio": round(side["scanflow"][c]["p99_ms"] / side[best][c]["p99_ms"], 3),
            }
    mlflows = [k for k in ran if k.startswith("mlflow")]
    best_mlflow = max(mlflows, key=lambda k: side[k][top]["rps"]) if mlflows else None
    figures.update({
        "min_throughput_ratio_vs_best_peer": min((v["throughput_ratio"] for v in vs_best.values()), default=None),
        "max_p99_ratio_vs_best_peer": max((v["p99_ratio"] for v in vs_best.values()), default=None),
        "vs_best_peer": vs_best,
        "throughput_ratio_vs_mlflow": round(side["scanflow"][top]["rps"] / side[best_mlflow][top]["rps"], 2)
        if best_mlflow else None,
        "p99_ratio_vs_mlflow": round(side["scanflow"][top]["p99_ms"] / side[best_mlflow][top]["p99_ms"], 3)
        if best_mlflow else None,
        "best_mlflow": best_mlflow,
        "fraction_of_limit": fraction(runs, "scanflow", model_rows),
        "fraction_of_limit_peers_running": fraction(side_runs, "scanflow", model_rows) if side else None,
        "oip_fraction_of_limit": fraction(runs, "scanflow_oip", model_rows),
        # OIP v2 infer beside /predict on the same gateway, phase 1 (no peer running), medians over rounds
        **{f"v2_throughput_ratio_vs_predict_c{c}": round(table["scanflow_oip"][c]["rps"] / table["scanflow"][c]["rps"], 2)
           for c in V2_CLIENTS},
        "asgi_front_fraction_of_limit": fraction(runs, "scanflow_asgi_front", model_rows),
        "fast_front_gain": round(table["scanflow"][top]["rps"] / table["scanflow_asgi_front"][top]["rps"], 2),
        "one_by_one_fraction_of_limit": fraction(runs, "scanflow_one_by_one", model_rows),
        "coalescing_gain": round(table["scanflow"][top]["rps"] / table["scanflow_one_by_one"][top]["rps"], 2),
        "direct_fraction_of_limit": fraction(runs, "scanflow_direct", model_rows),
        "at_concurrency": top,
        "limit_rps": round(limit),
        "empty_endpoint_rps": round(empty_rps),
        "model_batched_rows_per_s": round(model_rows),
        "load_average_end": round(os.getloadavg()[0], 2),
        "peers": {k: {"config": configs[k], **{str(c): {m: round(x, 2) for m, x in side[k][c].items()}
                                                for c in concurrencies}} for k in ran},
        "peers_not_run": {k: v[:300] for k, v in skipped.items()},
        "peer_configurations": {k: {"family": candidates[k].family, "config": candidates[k].config,
                                    "finalist": k in configs,
                                    **{str(c): {m: round(x, 2) for m, x in prescreen[k][c].items()} for c in PRESCREEN}}
                                for k in prescreen},
        "errors": errors,
        "results": {k: {str(c): {m: round(x, 2) for m, x in r.items()} for c, r in v.items()}
                    for k, v in table.items()},
        "results_phase2": {k: {str(c): {m: round(x, 2) for m, x in r.items()} for c, r in v.items()}
                           for k, v in side.items() if k not in configs},
    })
    # the verdict counts only when the peers a user would pick instead all ran: without MLServer and Ray
    # the best peer is mlflow, and beating it twice over is no claim
    figures["peers_ran"] = ran
    kinds_ran = all(any(k.startswith(kind) for k in ran) for kind in ("mlflow", "mlserver", "ray"))
    ratio, p99 = figures["min_throughput_ratio_vs_best_peer"], figures["max_p99_ratio_vs_best_peer"]
    # failed requests count against ours only: a peer's (MLServer timing out at 128 clients) is its own figure
    ours_failed = sum(v for k, v in errors.items() if k.split("@")[0] not in configs)
    # the standard protocol at native speed (#27 item 8): v2 infer >= 0.8 of /predict at 8 and 64 clients
    v2_ok = all(figures[f"v2_throughput_ratio_vs_predict_c{c}"] >= V2_TARGET for c in V2_CLIENTS)
    figures["v2_target_met"] = v2_ok
    figures["target_met"] = bool(kinds_ran and ratio is not None and p99 is not None and ratio >= 2.0
                                 and p99 <= 1.0 and figures["fraction_of_limit"] >= 0.7 and not ours_failed
                                 and v2_ok)
    print(json.dumps(figures))
    return exit_code(figures, args.check)


if __name__ == "__main__":
    sys.exit(main())
