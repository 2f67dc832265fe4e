"""Ray Serve peer for benchmarks/serving.py: the benchmark's MLflow model behind Ray Serve.

Run with the peer environment's Python (`make bench-peers`), never the project's:
    .bench-peers/ray/bin/python benchmarks/peers/ray_app.py MODEL_DIR PORT ['{"max_batch_size": 32, ...}']

Four applications on one Ray instance and one proxy: `/r1` with one replica and `/r2` with two, and
the same with Ray Serve's documented request batching (`@serve.batch`, its arguments from the JSON
argument): `/b1`, `/b2`; so every configuration is measured without starting Ray again (an idle one
costs nothing while another is driven). Each replica asks for 0.25 of Ray's logical CPUs, so the six
fit the two Ray is given (a logical share: it limits scheduling, not what a replica may use). Each replica loads the model with `mlflow.pyfunc.load_model` (what a Ray Serve user
serving an MLflow model writes), runs torch on one thread (as our single-thread replicas do), and
answers `POST {"inputs": [[64 floats]]}` with `{"outputs": [class per row]}`; `GET` answers 200 once
the replica is up (the benchmark's readiness probe). The proxy mode comes from the environment
(RAY_SERVE_ENABLE_HA_PROXY, RAY_SERVE_THROUGHPUT_OPTIMIZED), set by the benchmark.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse


class _Digits:
    def __init__(self, model_dir: str) -> None:
        import mlflow.pyfunc
        import torch

        torch.set_num_threads(1)
        self.model = mlflow.pyfunc.load_model(model_dir)

    def _labels(self, rows: np.ndarray) -> np.ndarray:
        out = np.asarray(self.model.predict(rows))
        return out.argmax(axis=1) if out.ndim == 2 else out

    async def __call__(self, request: Request) -> object:
        if request.method != "POST":
            return PlainTextResponse("ok")
        rows = np.asarray((await request.json())["inputs"], dtype=np.float32)
        return JSONResponse({"outputs": await self.predict(rows)})

    async def predict(self, rows: np.ndarray) -> list:
        return self._labels(rows).tolist()


Digits = serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=64)(_Digits)


def batched(max_batch_size: int, batch_wait_timeout_s: float) -> object:
    """The same deployment with its model call behind @serve.batch: concurrent requests' rows are
    predicted in one call, each request gets its own rows' answers."""

    class _DigitsBatched(_Digits):
        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
        async def predict(self, batch: list[np.ndarray]) -> list[list]:  # type: ignore[override]
            labels = self._labels(np.concatenate(batch))
            ends = np.cumsum([len(rows) for rows in batch])
            return [part.tolist() for part in np.split(labels, ends[:-1])]

    return serve.deployment(ray_actor_options={"num_cpus": 0.25},
                            max_ongoing_requests=max(64, 2 * max_batch_size))(_DigitsBatched)


def main() -> None:
    model_dir, port = sys.argv[1], int(sys.argv[2])
    batching = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {"max_batch_size": 32, "batch_wait_timeout_s": 0.005}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Digits.options(num_replicas=1).bind(model_dir), name="r1", route_prefix="/r1")
    serve.run(Digits.options(num_replicas=2).bind(model_dir), name="r2", route_prefix="/r2")
    with_batching = batched(**batching)
    serve.run(with_batching.options(num_replicas=1).bind(model_dir), name="b1", route_prefix="/b1")  # type: ignore[attr-defined]
    serve.run(with_batching.options(num_replicas=2).bind(model_dir), name="b2", route_prefix="/b2")  # type: ignore[attr-defined]
    print("ray serve up", flush=True)
    threading.Event().wait()  # the benchmark stops the process group


if __name__ == "__main__":
    main()
