"""`AgentClient`: talk to an agent's REST API (async, httpx), with timeouts and bounded retries.

Retries (tenacity, exponential backoff with jitter) cover what may pass: connection errors, timeouts,
5xx and 429. A 4xx is the caller's mistake and raises `AgentHTTPError` at once with the server's
message. Retrying a POST is safe because every mutating call carries an idempotency key (generated
here when the caller gives none) and the agent deduplicates on it.

Who calls: scanflow.agent.context (peer calls from strategies and handlers), other areas (the
gateway posting events, the demo, notebooks through `run_sync`), tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

import httpx
from pydantic import SecretStr
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from scanflow.auth import bearer_header

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class AgentHTTPError(RuntimeError):
    """A call failed: `status` (0 for no response), the server's `detail`, and whether it may pass."""

    def __init__(self, status: int, detail: Any, url: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {detail}" if status else f"{url}: {detail}")
        self.status = status
        self.detail = detail
        self.url = url

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status in RETRY_STATUS


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, AgentHTTPError):
        return exc.retryable
    return isinstance(exc, httpx.TransportError)


def raise_for_status(r: httpx.Response, what: str) -> None:
    """AgentHTTPError carrying the server's `detail` (or the start of its body) for a 4xx/5xx answer."""
    if r.status_code >= 400:
        try:
            body = r.json()
            detail = body.get("detail", body) if isinstance(body, dict) else body
        except ValueError:
            detail = r.text[:500]
        raise AgentHTTPError(r.status_code, detail, what)


class AgentClient:
    """Async client of one agent. Use as `async with AgentClient(url, token) as c: await c.status()`."""

    def __init__(
        self,
        base_url: str,
        token: SecretStr | str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=bearer_header(token),
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, *, json: Any = None, params: Any = None) -> Any:
        """One call with bounded retries; returns the decoded JSON body (None for 204)."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential_jitter(initial=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                return await self._once(method, path, json, params)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, method: str, path: str, json: Any, params: Any) -> Any:
        r = await self._http.request(method, path, json=json, params=params)
        raise_for_status(r, f"{method} {self.base_url}{path}")
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

    # -- the API ------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        return await self.request("GET", "/health")  # type: ignore[no-any-return]

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/status")  # type: ignore[no-any-return]

    async def post_event(
        self,
        name: str,
        payload: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        source: str | None = None,
    ) -> dict[str, Any]:
        """Send an event to the agent's inbox -> {"id", "duplicate"}. A retried call keeps its key."""
        body: dict[str, Any] = {
            "name": name,
            "payload": payload or {},
            "idempotency_key": key or f"client:{uuid.uuid4().hex}",
        }
        if source:
            body["source"] = source
        return await self.request("POST", "/events", json=body)  # type: ignore[no-any-return]

    async def call_actuator(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        event: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run an actuator -> {"status", "result", "key", "duplicate"}; `event` becomes its ctx.event."""
        body: dict[str, Any] = {"args": args or {}, "idempotency_key": key or f"client:{uuid.uuid4().hex}"}
        if event is not None:
            body["event"] = event
        return await self.request("POST", f"/actuators/{name}", json=body)  # type: ignore[no-any-return]

    async def run_sensor(self, name: str) -> dict[str, Any]:
        return await self.request("POST", f"/sensors/{name}")  # type: ignore[no-any-return]

    async def events(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return await self.request("GET", "/events", params=params)  # type: ignore[no-any-return]

    async def decisions(self, limit: int = 100, strategy: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if strategy:
            params["strategy"] = strategy
        return await self.request("GET", "/decisions", params=params)  # type: ignore[no-any-return]

    async def strategies(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/strategies")  # type: ignore[no-any-return]

    async def add_strategy(self, spec: dict[str, Any] | Any) -> dict[str, Any]:
        """POST a StrategySpec (model or dict). An invalid constraint raises AgentHTTPError(422)."""
        body = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else spec
        return await self.request("POST", "/strategies", json=body)  # type: ignore[no-any-return]

    async def delete_strategy(self, name: str) -> None:
        await self.request("DELETE", f"/strategies/{name}")

    async def wait_ready(self, deadline_s: float = 30.0, interval_s: float = 0.05) -> dict[str, Any]:
        """Poll GET /health until it answers 200 or the deadline passes (TimeoutError)."""
        end = time.monotonic() + deadline_s
        last: Exception | None = None
        while time.monotonic() < end:
            try:
                return await self._once("GET", "/health", None, None)  # type: ignore[no-any-return]
            except (httpx.TransportError, AgentHTTPError) as exc:
                last = exc
            await asyncio.sleep(interval_s)
        raise TimeoutError(f"agent at {self.base_url} not ready after {deadline_s}s: {last}")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run one client coroutine from synchronous code (scripts, notebooks without a running loop).

    In Jupyter, where a loop already runs, use `await` directly instead.
    """
    return asyncio.run(coro)
