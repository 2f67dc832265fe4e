"""What the replica and the gateway processes share: the ASGI entry that sends the hot paths around
FastAPI, the FastAPI app with /health and /metrics, a cached labelled counter, and `run_server`.

Why one module: both servers are built the same way (raw ASGI handlers for the few POSTs that carry
traffic, FastAPI for everything else, one uvicorn process each), and two copies of that drifted.
Who calls: scanflow.serving.replica_server and scanflow.serving.gateway_server (`create_app`),
scanflow.serving.replica and scanflow.serving.gateway (`main`), and
benchmarks/serving.py (its empty endpoint runs on `run_server`, the same HTTP stack).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.params import Depends as DependsParam
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import SecretStr

from scanflow.auth import require_token
from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S, with_head_timeout
from scanflow.serving.asgi import ASGIApp, Receive, Scope, Send

# Seconds; shared by the replica's and the gateway's latency histograms so their quantiles line up.
# Steps of <= 1.5x from 10 to 100 ms: the Checker reports a percentile as its bucket's upper bound, and an
# SLO of 50-100 ms with a scale-down below half of it needs bounds near both (0.025/0.05/0.1 alone turned a
# 26 ms p99 into "50 ms", and hid the overload of a replica capped near one 100 ms CFS period).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                   0.06, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)

HotPaths = Mapping[str, Callable[[Scope, Receive, Send], Any]]


class HotPathApp:
    """ASGI entry: `POST <path>` in `hot` goes straight to its raw handler, anything else to FastAPI.

    Why: FastAPI's request/response machinery costs tens of microseconds per call, more than the
    rest of a prediction (see docs/serving.md); admin, health and metrics keep FastAPI's validation.
    """

    def __init__(self, hot: HotPaths, api: FastAPI) -> None:
        self.hot = dict(hot)
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.hot.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await self.api(scope, receive, send)


def base_api(
    title: str,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
    render_metrics: Callable[[], bytes],
    health: Callable[[], dict[str, object]],
    token: SecretStr | None,
    allow_anonymous: bool,
) -> tuple[FastAPI, Sequence[DependsParam]]:
    """A FastAPI app with GET /health and GET /metrics, and the dependency list that guards /admin
    (the `serving:admin` scope: the Executor's token, or the operator's; never a replica's)."""
    api = FastAPI(title=title, lifespan=lifespan)

    @api.get("/health")
    async def _health() -> dict[str, object]:
        return health()

    @api.get("/metrics", response_class=PlainTextResponse)  # documented as text/plain (Prometheus)
    async def _metrics() -> Response:
        return Response(render_metrics(), media_type=CONTENT_TYPE_LATEST)

    return api, [Depends(require_token(token, allow_anonymous=allow_anonymous, scope="serving:admin"))]


def alive(**extra: object) -> Callable[[], dict[str, object]]:
    """The body of GET /health: alive, the pid, and whatever identifies the process."""
    return lambda: {"status": "alive", "pid": os.getpid(), **extra}


def run_server(app: ASGIApp | object, host: str, port: int, log_level: str, http: type | None = None,
               head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S) -> None:
    """One uvicorn process: uvloop + httptools, no access log (it would cost more than the model),
    no proxy-header rewriting (nothing here reads the client address), gc.freeze() once the
    imports are done so the collector stops re-scanning the long-lived objects of torch/FastAPI,
    and one socket write per answer (scanflow.serving.corked: uvicorn writes headers and body apart).
    `http`: a subclass of that protocol (the gateway's scanflow.serving.fastfront). `head_timeout_s`:
    a request head must arrive in full within it (scanflow.httpdeadline: 408 and close, else). On the
    socket handed to this process, when its starter reserved the port (scanflow.handoff)."""
    from scanflow.handoff import serve_uvicorn
    from scanflow.serving.corked import CorkedHttpToolsProtocol

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gc.collect()
    gc.freeze()
    serve_uvicorn(
        app, host=host, port=port, loop="uvloop", http=with_head_timeout(http or CorkedHttpToolsProtocol, head_timeout_s),
        lifespan="on", access_log=False, log_level="warning", backlog=2048, timeout_keep_alive=60,
        proxy_headers=False,
    )
