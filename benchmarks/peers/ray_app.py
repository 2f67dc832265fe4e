"""Ray Serve peer for benchmarks/serving.py: the benchmark's MLflow model behind Ray Serve.

Run with the peer environment's Python (`make bench-peers`), never the project's:
    .bench-peers/ray/bin/python benchmarks/peers/ray_app.py MODEL_DIR PORT

Two applications on one Ray instance and one proxy: `/r1` with one replica and `/r2` with two, so
both replica counts are measured without starting Ray twice (the idle one costs nothing while the
other is driven). Each replica loads the model with `mlflow.pyfunc.load_model` (what a Ray Serve user
serving an MLflow model writes), runs torch on one thread (as our single-thread replicas do), and
answers `POST {"inputs": [[64 floats]]}` with `{"outputs": [class per row]}`; `GET` answers 200 once
the replica is up (the benchmark's readiness probe). The proxy mode comes from the environment
(RAY_SERVE_ENABLE_HA_PROXY, RAY_SERVE_THROUGHPUT_OPTIMIZED), set by the benchmark.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=64)
class Digits:
    def __init__(self, model_dir: str) -> None:
        import mlflow.pyfunc
        import torch

        torch.set_num_threads(1)
        self.model = mlflow.pyfunc.load_model(model_dir)

    async def __call__(self, request: Request) -> object:
        if request.method != "POST":
            return PlainTextResponse("ok")
        rows = np.asarray((await request.json())["inputs"], dtype=np.float32)
        out = np.asarray(self.model.predict(rows))
        return JSONResponse({"outputs": out.argmax(axis=1).tolist() if out.ndim == 2 else out.tolist()})


def main() -> None:
    model_dir, port = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Digits.options(num_replicas=1).bind(model_dir), name="r1", route_prefix="/r1")
    serve.run(Digits.options(num_replicas=2).bind(model_dir), name="r2", route_prefix="/r2")
    print("ray serve up", flush=True)
    threading.Event().wait()  # the benchmark stops the process group


if __name__ == "__main__":
    main()
