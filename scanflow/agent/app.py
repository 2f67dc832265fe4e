"""`create_app(agent, ...)`: the FastAPI app of one agent (REST API, lifespan running its loop).

Endpoints (mutating ones need `Authorization: Bearer <token>` with the scope named, see scanflow.auth,
unless allow_anonymous):
  GET  /health, /status, /events?status&limit, /decisions?limit&strategy, /strategies, /metrics, /docs
  POST /events [events:write]  {name, payload: {}, idempotency_key?, source?} -> 202 {id, duplicate}
  POST /actuators/{name} [actuate] {args: {}, idempotency_key?} -> 200 {status, result, key, duplicate}
                               (503 + Retry-After for a temporary failure, 422 for a permanent one)
  POST /sensors/{name} [actuate] run a sensor now -> {events: [ids]}
  POST /strategies [strategies] a StrategySpec -> 201 (422 for an invalid constraint, 409 if it exists)
  DELETE /strategies/{name}    -> 204 (a strategy added over REST; 409 for one declared in code)
Bad input is a 4xx with a message (strict pydantic models; a body over the size limit is 413, a JSON
body nested deeper than 64 levels 422, before it is parsed, a body not in within the body timeout 408); an
unexpected error is a JSON 500 that says where to look, never the exception text (it may hold secrets).
The agent author's `agent.router` is mounted too, its non-GET routes behind any accepted token (a route
that needs a scope names it with its own `require_token(..., scope=...)`, as the Tracker's do).
Who calls: `serve()` / `scanflow agent run`, tests (httpx ASGITransport or a real uvicorn).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from scanflow.agent.agent import Agent, AgentDefinitionError, build_strategy
from scanflow.agent.bodylimit import BodySizeLimit
from scanflow.agent.context import Context
from scanflow.agent.jsonsafe import (
    MAX_JSON_DEPTH,
    check_finite,
    clip_depth,
    non_finite_path,
    too_deep_path,
)
from scanflow.agent.runtime import Runtime
from scanflow.agent.store import Store
from scanflow.agent.typed_inbox import TypedInbox
from scanflow.agent.types import Event
from scanflow.apierrors import document_errors
from scanflow.auth import TokenTable, require_token
from scanflow.settings import Settings
from scanflow.spec import StrategySpec

EVENT_NAME_RE = r"^[A-Za-z0-9_.:/-]{1,200}$"
# statuses every mutating route can answer besides its own (documented in the OpenAPI: schemathesis)
_MUTATING: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or unknown bearer token"},
    403: {"description": "the token lacks this route's scope, or the agent has no token configured"},
    413: {"description": "body over the size limit"},
}
DEFAULT_MAX_BODY = 1 << 20  # 1 MiB
READY_TIMEOUT_S = 2.0  # under a probe's default 1 s timeout x its retries; a store slower than this is not ready
log = logging.getLogger(__name__)


class EventIn(BaseModel):
    """Body of POST /events."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=EVENT_NAME_RE, description="event name, e.g. 'drift.checked'")
    payload: dict[str, Any] = Field(default_factory=dict, description="a JSON object")
    idempotency_key: str | None = Field(None, min_length=1, max_length=255)
    source: str | None = Field(None, max_length=200)

    @field_validator("payload")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        # Python's json reads NaN/Infinity; stored, they would make GET /events a 500 later
        check_finite(v, "payload")
        return v


class EventAccepted(BaseModel):
    id: int
    duplicate: bool


class EventRef(BaseModel):
    """The event that made a peer call this actuator; the handler sees it as `ctx.event`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=EVENT_NAME_RE)
    payload: dict[str, Any] = Field(default_factory=dict)
    id: int | None = None
    source: str | None = Field(None, max_length=200)

    @field_validator("payload")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_finite(v, "event.payload")
        return v


class ActuatorCall(BaseModel):
    """Body of POST /actuators/{name}."""

    model_config = ConfigDict(extra="forbid")
    args: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, min_length=1, max_length=255)
    event: EventRef | None = None

    @field_validator("args")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_finite(v, "args")
        return v


class ActuatorResult(BaseModel):
    status: Literal["succeeded"]
    result: dict[str, Any]
    key: str
    duplicate: bool


def get_context(request: Request) -> Context:
    """FastAPI dependency for routes on `agent.router`: `ctx: Context = Depends(get_context)`."""
    runtime: Runtime = request.app.state.runtime
    return runtime.ctx


async def get_runtime(request: Request) -> Runtime:
    # async on purpose: FastAPI runs a plain `def` dependency in its thread pool, one hop per request
    return request.app.state.runtime  # type: ignore[no-any-return]


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def create_app(
    agent: Agent,
    settings: Settings | None = None,
    store: Store | None = None,
    peers: Mapping[str, str] | None = None,
    allow_anonymous: bool = False,
    *,
    clock: Callable[[], float] = time.time,
    max_body_bytes: int | None = None,
    retry_backoff_s: float = 0.5,
) -> FastAPI:
    """Build the agent's app. Nothing runs until the app's lifespan starts (uvicorn, TestClient...).

    `max_body_bytes`: the body limit of every route; default the agent's own (`Agent(max_body_bytes=)`)
    or 1 MiB."""
    max_body_bytes = max_body_bytes or agent.max_body_bytes or DEFAULT_MAX_BODY
    settings = settings or Settings()
    agent.check()
    own_store = store is None
    the_store = store or Store(settings.store_url_for(agent.name))
    runtime = Runtime(agent, the_store, settings, peers, clock, retry_backoff_s=retry_backoff_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()
            if own_store:
                the_store.close()

    app = FastAPI(
        title=f"scanflow agent {agent.name}",
        description=agent.description or f"A Scanflow agent (role {agent.role}).",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    inbox = TypedInbox(agent.name, agent.messages)
    generated_openapi = app.openapi

    def openapi() -> dict[str, Any]:  # what the routes answer on errors (scanflow.apierrors)
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(inbox.document(generated_openapi()), app.routes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, timeout_s=settings.body_timeout_s)
    tokens = TokenTable.from_env(settings.token)

    def needs(scope: str | None) -> list[Any]:
        return [Depends(_on_loop(require_token(tokens, allow_anonymous=allow_anonymous, scope=scope)))]

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        error_id = uuid.uuid4().hex[:12]
        log.error(
            "unhandled error %s on %s %s: %s",
            error_id,
            request.method,
            request.url.path,
            type(exc).__name__,
            exc_info=exc,
        )
        return JSONResponse(
            {"detail": f"internal error {error_id}; see the agent's log", "error_id": error_id},
            status_code=500,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own 422 echoes the input; one holding NaN/infinity cannot be encoded (a 500)
        return JSONResponse({"detail": jsonable_encoder(_json_safe_errors(exc.errors()))}, status_code=422)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness: the process serves (a Kubernetes livenessProbe restarts it when this stops)."""
        return {"status": "ok", "agent": agent.name}

    @app.get("/ready", responses={503: {"description": "the agent's store does not answer"}})
    async def ready(rt: RuntimeDep) -> JSONResponse:
        """Readiness: the agent can take events now, i.e. its store answers within READY_TIMEOUT_S. A
        Kubernetes readinessProbe takes an agent whose database is gone out of its Service (callers
        then fail fast and retry) without restarting it, which would not bring the database back."""
        try:
            depth = await asyncio.wait_for(rt.queue_depth(), READY_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001  # any store failure is "not ready", never a 500
            log.warning("not ready: the store does not answer (%s)", type(exc).__name__)
            return JSONResponse({"status": "unready", "agent": agent.name,
                                 "reason": f"store: {type(exc).__name__}"}, status_code=503)
        return JSONResponse({"status": "ready", "agent": agent.name, "queue_depth": depth})

    @app.get("/status")
    async def get_status(rt: RuntimeDep) -> dict[str, Any]:
        return {
            "name": agent.name,
            "role": agent.role,
            "state": rt.state,
            "queue_depth": await rt.queue_depth(),
            "processed": rt.processed,
            "strategies": sorted(rt.strategies),
            "sensors": sorted(agent.sensors),
            "actuators": sorted(agent.actuators),
            "peers": sorted(rt.peers),
            "uptime_s": max(0.0, rt.clock() - rt.started_at),
        }

    @app.post("/events", status_code=status.HTTP_202_ACCEPTED, dependencies=needs("events:write"),
              responses=_MUTATING)
    async def post_event(body: EventIn, rt: RuntimeDep) -> EventAccepted:
        inbox.check(body.name, body.payload)
        event_id, dup = await rt.submit_event(body.name, body.payload, body.idempotency_key, body.source)
        return EventAccepted(id=event_id, duplicate=dup)

    @app.get("/events")
    async def list_events(
        rt: RuntimeDep,
        status_: Literal["pending", "done"] | None = Query(None, alias="status"),
        limit: int = Query(100, ge=1, le=1000),
    ) -> list[dict[str, Any]]:
        return await _thread(_clipped, rt.store.list_events, status_, limit)

    @app.post("/actuators/{name}", dependencies=needs("actuate"), responses={
        **_MUTATING, 404: {"description": "no such actuator"},
        422: {"description": "invalid body, or the action failed permanently"},
        503: {"description": "the action failed for now: retry after Retry-After"}})
    async def call_actuator(name: str, body: ActuatorCall, rt: RuntimeDep) -> Response:
        if name not in agent.actuators:
            raise HTTPException(
                404, f"agent {agent.name!r} has no actuator {name!r} (has {sorted(agent.actuators)})"
            )
        key = body.idempotency_key or f"rest:{uuid.uuid4().hex}"
        event = None
        if body.event is not None:
            e = body.event
            event = Event(e.name, e.payload, id=e.id or 0, source=e.source)
        outcome, dup = await rt.run_actuator(name, body.args, key, event=event)
        if outcome.status == "ok":
            return JSONResponse(
                ActuatorResult(status="succeeded", result=outcome.result, key=key, duplicate=dup).model_dump()
            )
        if outcome.status == "retry":
            return JSONResponse(
                {"detail": outcome.error, "status": "retry", "key": key},
                status_code=503,
                headers={"Retry-After": str(max(1, round(outcome.retry_after_s)))},
            )
        return JSONResponse(
            {"detail": outcome.error, "status": "failed", "key": key, "duplicate": dup}, status_code=422
        )

    @app.post("/sensors/{name}", dependencies=needs("actuate"), responses={
        **_MUTATING, 404: {"description": "no such sensor"}, 502: {"description": "the sensor raised (see the log)"}})
    async def run_sensor(name: str, rt: RuntimeDep) -> dict[str, Any]:
        if name not in agent.sensors:
            raise HTTPException(
                404, f"agent {agent.name!r} has no sensor {name!r} (has {sorted(agent.sensors)})"
            )
        try:
            ids = await rt.run_sensor(name)
        except Exception as exc:  # noqa: BLE001 - user code: report, never crash the endpoint
            rt.log.warning("sensor %s failed: %s: %s", name, type(exc).__name__, exc)
            raise HTTPException(502, f"sensor {name!r} failed with {type(exc).__name__}; see the agent's log")
        return {"sensor": name, "events": ids}

    @app.get("/strategies")
    async def list_strategies(rt: RuntimeDep) -> list[dict[str, Any]]:
        return [s.to_json() for s in rt.strategies.values()]

    @app.post("/strategies", status_code=status.HTTP_201_CREATED, dependencies=needs("strategies"),
              responses={**_MUTATING, 409: {"description": "a strategy of that name exists"}})
    async def add_strategy(spec: StrategySpec, rt: RuntimeDep) -> dict[str, Any]:
        if spec.name in rt.strategies:
            raise HTTPException(409, f"strategy {spec.name!r} exists; DELETE it first to replace it")
        try:
            s = build_strategy(
                spec.name,
                spec.event,
                spec.constraint,
                list(spec.actions),
                spec.cooldown_s,
                spec.max_per_minute,
                source="rest",
            )
        except AgentDefinitionError as exc:
            raise HTTPException(422, str(exc)) from None
        for a in s.actions:
            if a.agent in (None, agent.name) and a.actuator not in agent.actuators:
                raise HTTPException(
                    422,
                    f"action {a.actuator!r}: agent {agent.name!r} has no such actuator "
                    f"(has {sorted(agent.actuators)})",
                )
            if a.agent not in (None, agent.name) and a.agent not in rt.peers:
                raise HTTPException(
                    422, f"action {a.actuator!r}: unknown peer agent {a.agent!r} (peers: {sorted(rt.peers)})"
                )
        await rt.add_strategy(s)
        return s.to_json()

    @app.delete("/strategies/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=needs("strategies"),
                responses={**_MUTATING, 404: {"description": "no such strategy"},
                           409: {"description": "declared in code: cannot be deleted over REST"}})
    async def delete_strategy(name: str, rt: RuntimeDep) -> Response:
        s = rt.strategies.get(name)
        if s is None:
            raise HTTPException(404, f"no strategy {name!r}")
        if s.source != "rest":
            # Only strategies added over REST are stored; one declared in the agent's code would come
            # back at the next start, so a 204 would be a lie. Change the code to remove it.
            raise HTTPException(
                409,
                f"strategy {name!r} is declared in the agent's code, not added over REST: it cannot "
                "be deleted here (remove it from the code and restart the agent)",
            )
        await rt.remove_strategy(name)
        return Response(status_code=204)

    @app.get("/decisions")
    async def list_decisions(
        rt: RuntimeDep,
        limit: int = Query(100, ge=1, le=1000),
        strategy: str | None = Query(None, max_length=100),
        before_id: int | None = Query(None, ge=1, description="page back: only decisions older than this id"),
    ) -> list[dict[str, Any]]:
        """The newest decisions first; pass the last row's `id` as `before_id` for the page before."""
        return await _thread(_clipped, rt.store.list_decisions, limit, strategy, before_id)

    @app.get("/metrics", response_class=PlainTextResponse)  # documented as text/plain (Prometheus)
    async def metrics(rt: RuntimeDep) -> Response:
        rt.metrics.queue_depth.set(await rt.queue_depth())
        return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # any accepted token; a route that needs more names its scope itself (the Tracker's do)
    guarded = [Depends(_unsafe_methods_only(require_token(tokens, allow_anonymous=allow_anonymous)))]
    app.include_router(agent.router, dependencies=guarded)
    for factory in agent.router_factories:
        app.include_router(factory(settings, runtime.resources), dependencies=guarded)
    return app


def _json_safe_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pure: validation errors without the echoed input where it holds NaN/infinity or nests too deep
    to encode (or `ctx`, which may hold the exception object)."""
    out = []
    for e in errors:
        e = {k: v for k, v in dict(e).items() if k != "ctx"}
        if too_deep_path(e.get("input")) is not None or non_finite_path(e.get("input")) is not None:
            e.pop("input")
        out.append(e)
    return out


def _on_loop(check: Callable[..., None]) -> Callable[..., Awaitable[None]]:
    """The token check as an async dependency. It only compares strings; as a plain `def` FastAPI
    would run it in the thread pool, a thread hop (and a wait for a free core) on every mutating call."""

    async def dependency(authorization: str | None = Header(default=None)) -> None:
        check(authorization)

    return dependency


def _unsafe_methods_only(check: Callable[..., None]) -> Callable[..., Awaitable[None]]:
    """Apply the token check to the author's routes, except for reads (GET, HEAD, OPTIONS)."""

    async def dependency(request: Request) -> None:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return
        check(request.headers.get("authorization"))

    return dependency


async def _thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _clipped(read: Callable[..., list[dict[str, Any]]], *args: Any) -> list[dict[str, Any]]:
    """Rows of a store read with anything nested deeper than the body bound cut off (rows stored
    before the bound existed: a 900-deep payload made GET /events a 500 at every limit). Run in a
    worker thread with the read."""
    return [clip_depth(row, MAX_JSON_DEPTH + 2) for row in read(*args)]  # row + payload/inputs
