"""The standard protocols on replicas and gateways: Open Inference Protocol v2 (scanflow.serving.oip) and
MLflow's scoring format (scanflow.serving.invocations), mounted as FastAPI routes beside the native API.

Replica: a request in either protocol is checked and turned into a native `/predict` body, which the
replica's own raw `/predict` handler answers in-process (`call_native`: no socket, no second code
path). So drain, micro-batching, metrics and exactly one Tracker record per served request hold as for
`/predict`, and the native hot path is not touched. The record's request id is the infer `id` when given.

Gateway: protocol requests are forwarded unchanged, one by one, to the replica the balancer picks, with the same retries and failover to the
backup as `/predict` (`forward`); the replica that answers does the protocol work and the record.
The common v2 infer request does not reach these routes on a gateway with the fast front: it is
coalesced there with `/predict` (scanflow.serving.fastfront, answered by the replica's /predict_batch with
scanflow.serving.oip_items, which shares `OipCatalog` and `oip.parse_infer` with the route below).
Metadata and model-ready GETs go to a healthy replica (then the backup). Who calls: `create_app` of
scanflow.serving.replica_server and scanflow.serving.gateway_server (`install_replica`, `install_gateway`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.requests import ClientDisconnect

from scanflow import __version__
from scanflow.serving import invocations, oip, openapi
from scanflow.serving.asgi import BodyTooLarge, Message
from scanflow.serving.invocations import ScoringError
from scanflow.serving.oip import OipError
from scanflow.serving.oip_items import OipCatalog
from scanflow.serving.routing import MAX_ATTEMPTS, choose_attempt

if TYPE_CHECKING:
    from scanflow.serving.gateway_server import Gateway
    from scanflow.serving.replica_server import Replica

NativeHandler = Callable[[Any, Any, Any], Awaitable[None]]
_RETRY_STATUSES = frozenset({502, 503})  # as the gateway's /predict: another upstream can answer
_CLIENT_GONE = 499

# OpenAPI descriptions of the protocol routes (their bodies are read by hand; see scanflow.serving.openapi)
_OIP_ERR = {400: {"model": openapi.OipErrorBody, "description": "bad request (shape, datatype, JSON)"},
            404: {"model": openapi.OipErrorBody, "description": "unknown model or version"},
            413: {"model": openapi.OipErrorBody, "description": "body or rows over the limit"},
            503: {"model": openapi.OipErrorBody, "description": "model loading, replica draining, no upstream"}}
_MLFLOW_ERR = {400: {"model": openapi.MlflowError, "description": "bad request"},
               413: {"model": openapi.MlflowError, "description": "body or rows over the limit"},
               415: {"model": openapi.MlflowError, "description": "not JSON or CSV"},
               503: {"model": openapi.MlflowError, "description": "model loading, replica draining, no upstream"}}
_INFER_DOC: dict[str, Any] = {
    "tags": ["open inference protocol v2"],
    "responses": {200: {"model": openapi.InferResponse, "description": "output tensors"}, **_OIP_ERR},
    "openapi_extra": {"requestBody": openapi.json_body(openapi.InferRequest)},
}
_INVOCATIONS_DOC: dict[str, Any] = {
    "tags": ["mlflow scoring"],
    "responses": {200: {"model": openapi.InvocationResponse, "description": "one prediction per row"},
                  **_MLFLOW_ERR},
    "openapi_extra": {"requestBody": {"required": True, "content": {
        "application/json": {"schema": openapi.ref(openapi.InvocationRequest)},
        "text/csv": {"schema": {"type": "string", "description": "a header line, then one row per line"}},
    }}, "parameters": [{"name": "X-Request-Id", "in": "header", "required": False,
                        "description": "the client's own id (a body `request_id` wins): echoed as "
                                       "`client_request_id`", "schema": {"type": "string", "maxLength": 200}}]},
}
_META_DOC: dict[str, Any] = {"tags": ["open inference protocol v2"],
                             "responses": {200: {"model": openapi.ModelMetadata, "description": "metadata"},
                                           404: _OIP_ERR[404], 503: _OIP_ERR[503]}}
_MODEL_READY_DOC: dict[str, Any] = {
    "tags": ["open inference protocol v2"],
    "responses": {200: {"model": openapi.ModelReady, "description": "ready"},
                  400: {"model": openapi.ModelReady, "description": "not ready (loading, draining)"},
                  404: _OIP_ERR[404]}}
_HEALTH_DOC: dict[str, Any] = {"tags": ["open inference protocol v2"]}


def _json(status: int, doc: object, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers=headers, media_type="application/json")


def _raw(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status, headers=headers, media_type="application/json")


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refusing (BodyTooLarge) as soon as Content-Length or the bytes read pass `limit`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def call_native(handler: NativeHandler, body: bytes) -> tuple[int, bytes]:
    """Run a raw ASGI `POST /predict` handler in-process on `body` -> (status, answer body)."""
    scope = {"type": "http", "method": "POST", "path": "/predict",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    delivered = False
    status = 500
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            chunks.append(message.get("body", b""))

    await handler(scope, receive, send)
    return status, b"".join(chunks)


def _server_metadata() -> dict[str, object]:
    return {**oip.SERVER_METADATA, "version": __version__}


# ---- replica ---------------------------------------------------------------------------------------


def install_replica(api: FastAPI, replica: Replica) -> None:
    """Mount OIP v2 and /invocations on a replica's FastAPI app, and document every route."""
    cfg = replica.config
    catalog = replica.oip_catalog = OipCatalog(replica)  # the replica's /predict_batch reads it too
    current, known = catalog.current, catalog.known

    def model_metadata(name: str, version: str | None) -> Response:
        try:
            return _json(200, known(name, version).doc())
        except OipError as exc:
            return _raw(exc.status, exc.body())

    def model_ready(name: str, version: str | None) -> Response:
        try:
            known(name, version)
        except OipError as exc:
            if exc.status == 404:
                return _raw(404, exc.body())
            return _json(400, {"name": name, "ready": False})
        ok = not replica.draining
        return _json(200 if ok else 400, {"name": name, "ready": ok})

    async def infer(request: Request, name: str, version: str | None) -> Response:
        try:
            meta = known(name, version)
            body = await read_limited(request, cfg.max_body_bytes)
            call = oip.parse_infer(body, meta, max_rows=cfg.max_rows)
        except OipError as exc:
            return _raw(exc.status, exc.body())
        except BodyTooLarge as exc:
            return _raw(413, oip.error_body(str(exc)))
        except ClientDisconnect:
            return Response(status_code=_CLIENT_GONE)
        status, answer = await call_native(replica.predict, call.native_body())
        if status != 200:
            return _raw(*oip.native_error(status, answer))
        return _json(200, oip.infer_answer(orjson.loads(answer), meta, call))

    async def score(request: Request) -> Response:
        try:
            body = await read_limited(request, cfg.max_body_bytes)
            meta = current()
            columns = [t.name for t in meta.inputs] if meta is not None and meta.columns else None
            rows, client_id = invocations.parse_scoring(body, request.headers.get("content-type", ""), columns,
                                                        request.headers.get(invocations.REQUEST_ID_HEADER))
        except ScoringError as exc:
            return _raw(exc.status, exc.body())
        except BodyTooLarge as exc:
            return _raw(413, invocations.error_body(str(exc)))
        except ClientDisconnect:
            return Response(status_code=_CLIENT_GONE)
        native = {"inputs": rows} if client_id is None else {"inputs": rows, "request_id": client_id}
        status, answer = await call_native(replica.predict, orjson.dumps(native))
        if status != 200:
            return _raw(*invocations.native_error(status, answer))
        return _json(200, invocations.scoring_answer(orjson.loads(answer)))

    def ready() -> bool:
        return replica.batcher.model is not None and not replica.draining

    _mount(api, ready, model_metadata, model_ready, infer, score)
    openapi.install(api, ["/predict", "/predict_batch"])


def _mount(
    api: FastAPI,
    ready: Callable[[], bool],
    model_metadata: Callable[[str, str | None], Awaitable[Response] | Response],
    model_ready: Callable[[str, str | None], Awaitable[Response] | Response],
    infer: Callable[[Request, str, str | None], Awaitable[Response]],
    score: Callable[[Request], Awaitable[Response]],
) -> None:
    """The same routes on replicas and gateways; only the handlers differ."""

    async def _await(r: Awaitable[Response] | Response) -> Response:
        return await r if not isinstance(r, Response) else r

    @api.get("/v2/health/live", responses={200: {"model": openapi.Live}}, **_HEALTH_DOC)
    async def live() -> Response:
        return _json(200, {"live": True})

    @api.get("/v2/health/ready", responses={200: {"model": openapi.Ready}, 400: {"model": openapi.Ready}},
             **_HEALTH_DOC)
    async def server_ready() -> Response:
        ok = ready()
        return _json(200 if ok else 400, {"ready": ok})

    @api.get("/v2", responses={200: {"model": openapi.ServerMetadata}}, **_HEALTH_DOC)
    async def server_metadata() -> Response:
        return _json(200, _server_metadata())

    @api.get("/v2/models/{name}", **_META_DOC)
    async def metadata(name: str) -> Response:
        return await _await(model_metadata(name, None))

    @api.get("/v2/models/{name}/versions/{version}", **_META_DOC)
    async def version_metadata(name: str, version: str) -> Response:
        return await _await(model_metadata(name, version))

    @api.get("/v2/models/{name}/ready", **_MODEL_READY_DOC)
    async def ready_model(name: str) -> Response:
        return await _await(model_ready(name, None))

    @api.get("/v2/models/{name}/versions/{version}/ready", **_MODEL_READY_DOC)
    async def ready_version(name: str, version: str) -> Response:
        return await _await(model_ready(name, version))

    @api.post("/v2/models/{name}/infer", **_INFER_DOC)
    async def infer_model(request: Request, name: str) -> Response:
        return await infer(request, name, None)

    @api.post("/v2/models/{name}/versions/{version}/infer", **_INFER_DOC)
    async def infer_version(request: Request, name: str, version: str) -> Response:
        return await infer(request, name, version)

    @api.post("/invocations", **_INVOCATIONS_DOC)
    async def invocations_route(request: Request) -> Response:
        return await score(request)

    @api.get("/ping", tags=["mlflow scoring"], response_class=PlainTextResponse,
             responses={200: {"description": "ready"}, 503: {"description": "not ready"}})
    async def ping() -> Response:
        # a plain-text newline: MLflow's own labels it JSON, which it is not (schemathesis: MalformedJson)
        return PlainTextResponse("\n", 200 if ready() else 503)


# ---- gateway ---------------------------------------------------------------------------------------


async def forward(gw: Gateway, path: bytes, body: bytes) -> tuple[tuple[int, bytes, bytes] | None, Any, str | None]:
    """Send one protocol request upstream with the retries and failover of the gateway's `/predict`
    (`routing.choose_attempt`: another replica, the last attempt on the backup) -> (result, upstream,
    route); result None when no upstream could answer."""
    exclude: frozenset[str] = frozenset()
    result: tuple[int, bytes, bytes] | None = None
    up = route = None
    for attempt in range(MAX_ATTEMPTS):
        gw._tick += 1
        route, candidate = choose_attempt(gw.mode, gw.replicas, gw.backup, exclude, gw._tick,
                                          last=attempt == MAX_ATTEMPTS - 1)
        if candidate is None:
            break
        up = candidate
        if route is not None and route != gw.routed_to:
            gw._update_route(route)
        result = await gw._forward(up, body, path)
        if result is not None and result[0] not in _RETRY_STATUSES:
            break
        if attempt < MAX_ATTEMPTS - 1:
            gw.metrics.retries.inc()
            gw.counts["retries"] += 1
        exclude = exclude | {up.url}
    return result, up, route


def install_gateway(api: FastAPI, gw: Gateway) -> None:
    """Mount OIP v2 and /invocations on a gateway's FastAPI app, and document every route."""
    cfg = gw.config

    def ready() -> bool:
        return any(r.healthy for r in gw.replicas) or (gw.backup is not None and gw.backup.healthy)

    async def proxy_get(path: str) -> Response | None:
        """GET `path` from a healthy replica (then the backup); None when none answers."""
        ups = [r for r in gw.replicas if r.healthy] if gw.mode != "backup" else []
        if gw.backup is not None and gw.backup.healthy:
            ups.append(gw.backup)
        session = gw._health_session
        assert session is not None
        for up in ups:
            try:
                async with session.get(up.url + path, timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                    body, status = await r.read(), r.status
            except (aiohttp.ClientError, TimeoutError):
                continue
            if status in _RETRY_STATUSES:
                continue
            return _raw(status, body, {"x-scanflow-upstream": up.url})
        return None

    def _path(name: str, version: str | None, tail: str = "") -> str:
        v = f"/versions/{quote(version, safe='')}" if version is not None else ""
        return f"/v2/models/{quote(name, safe='')}{v}{tail}"

    async def model_metadata(name: str, version: str | None) -> Response:
        answer = await proxy_get(_path(name, version))
        return answer or _raw(503, oip.error_body(f"service {cfg.service!r} has no healthy replica"))

    async def model_ready(name: str, version: str | None) -> Response:
        answer = await proxy_get(_path(name, version, "/ready"))
        return answer or _json(400, {"name": name, "ready": False})

    async def relay(request: Request, path: str, body: bytes, err: Callable[[int, bytes], tuple[int, bytes]],
                    err_body: Callable[[str], bytes], t0: float) -> Response:
        result, up, route = await forward(gw, path.encode(), body)
        if result is None:
            msg = "upstream replicas failed; try again" if up else f"service {cfg.service!r} has no healthy replica"
            status, payload, headers = 503, err_body(msg), None
        else:
            status, payload, _ = result
            headers = {"x-scanflow-upstream": up.url}
            if status == 504:  # the gateway's own timeout answer is native-shaped
                status, payload = err(status, payload)
        gw.metrics.requests.inc(str(status), route or "none")
        gw.metrics.latency.observe(time.perf_counter() - t0)
        return _raw(status, payload, headers)

    async def infer(request: Request, name: str, version: str | None) -> Response:
        t0 = time.perf_counter()
        try:
            body = await read_limited(request, cfg.max_body_bytes)
        except BodyTooLarge as exc:
            return _raw(413, oip.error_body(str(exc)))
        except ClientDisconnect:
            return Response(status_code=_CLIENT_GONE)
        return await relay(request, _path(name, version, "/infer"), body, oip.native_error, oip.error_body, t0)

    async def score(request: Request) -> Response:
        t0 = time.perf_counter()
        ctype = request.headers.get("content-type", "")
        try:
            invocations.check_content_type(ctype)
            body = await read_limited(request, cfg.max_body_bytes)
            header_id = request.headers.get(invocations.REQUEST_ID_HEADER)
            if invocations.is_csv(ctype):  # upstream calls carry JSON only
                body = orjson.dumps(invocations.with_request_id(invocations.csv_to_split(body), header_id))
            elif header_id is not None:  # rare: the header's id goes upstream in the body
                body = invocations.body_with_request_id(body, header_id)
        except ScoringError as exc:
            return _raw(exc.status, exc.body())
        except BodyTooLarge as exc:
            return _raw(413, invocations.error_body(str(exc)))
        except ClientDisconnect:
            return Response(status_code=_CLIENT_GONE)
        return await relay(request, "/invocations", body, invocations.native_error, invocations.error_body, t0)

    _mount(api, ready, model_metadata, model_ready, infer, score)
    openapi.install(api, ["/predict"])
