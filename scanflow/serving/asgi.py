"""Raw ASGI helpers for the two hot paths (replica `/predict`, gateway `/predict`).

Why not FastAPI routes there: its request/response machinery costs tens of microseconds per call and
HTTP handling is what bounds a server on a small machine (see docs/serving.md). Everything else (admin,
health, metrics) stays in FastAPI. Who calls: scanflow.serving.replica and scanflow.serving.gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]


class BodyTooLarge(Exception):
    """The request body is over the limit: answer 413."""


class ClientGone(Exception):
    """The client disconnected before its body was read."""


class UnsupportedMediaType(Exception):
    """The body is declared (Content-Type) as something other than JSON: answer 415."""


class BodyTimeout(Exception):
    """The body did not arrive in full within the server's body deadline: answer 408 and close."""


class BodyDeadlines:
    """Bounds the time a request may take to deliver its body (a slow-body client otherwise holds a
    connection, a task and its buffers for as long as it likes: 300 such connections were held for
    30 s in an attack on a running stack).

    Why not `asyncio.timeout()` per request: that arms and cancels a timer handle on every request
    (~2-3 us). Here a request costs a dict insert and delete; one sweep every `tick_s` (armed only
    while some body is being read) cancels the reads that are past their deadline, so a deadline is
    enforced within `timeout_s + tick_s`. Who uses it: `read_body`, for the replica and the gateway.
    """

    def __init__(self, timeout_s: float, tick_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.tick_s = tick_s if tick_s is not None else min(1.0, max(0.05, timeout_s / 4))
        self._watched: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweep_armed = False

    def watch(self, task: asyncio.Task[Any]) -> None:
        loop = task.get_loop()
        self._watched[task] = loop.time() + self.timeout_s
        if not self._sweep_armed:
            self._sweep_armed = True
            loop.call_later(self.tick_s, self._sweep, loop)

    def unwatch(self, task: asyncio.Task[Any]) -> bool:
        """Stop watching; True when the task's read was cancelled by its deadline."""
        self._watched.pop(task, None)
        if task in self._expired:
            self._expired.discard(task)
            return True
        return False

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for task, deadline in list(self._watched.items()):
            if deadline <= now:
                del self._watched[task]
                self._expired.add(task)
                task.cancel("request body deadline")
        self._sweep_armed = bool(self._watched)
        if self._sweep_armed:
            loop.call_later(self.tick_s, self._sweep, loop)


def is_json_media_type(value: bytes) -> bool:
    """application/json (any parameters, e.g. charset) or a structured +json type."""
    if value == b"application/json":
        return True
    media = value.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(
    scope: Scope, receive: Receive, limit: int, *, json_only: bool = False, deadlines: BodyDeadlines | None = None
) -> bytes:
    """The whole body, refusing early (413) when Content-Length or the bytes read exceed `limit`.

    `json_only`: a body declared as anything but JSON is refused (UnsupportedMediaType, 415) before it
    is read; a missing Content-Type is taken as JSON (curl-less clients, raw sockets). `deadlines`:
    the body must be in within its timeout (BodyTimeout, 408)."""
    declared = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"content-type" and json_only and not is_json_media_type(value):
            raise UnsupportedMediaType(
                f"Content-Type {value.decode('latin-1')[:100]!r} is not JSON; send application/json"
            )
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
    if deadlines is None:
        return await _read_chunks(receive, limit)
    task = asyncio.current_task()
    assert task is not None
    deadlines.watch(task)
    try:
        return await _read_chunks(receive, limit)
    except asyncio.CancelledError:
        if deadlines.unwatch(task):
            task.uncancel()
            raise BodyTimeout(f"request body not received within {deadlines.timeout_s:g} s") from None
        raise
    finally:
        deadlines.unwatch(task)


async def _read_chunks(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        chunk = msg.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_raw(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, doc: Any) -> None:
    await send_raw(send, status, orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))


async def send_error(send: Send, status: int, message: str) -> None:
    """Same shape as FastAPI's HTTPException answers, so clients parse one format."""
    await send_json(send, status, {"detail": message})


async def send_error_and_close(send: Send, status: int, message: str) -> None:
    """An error after which the connection is closed: the rest of the request body was never read,
    so the connection cannot carry another request (used for 408)."""
    await send_raw(send, status, orjson.dumps({"detail": message}), [*JSON_HEADERS, (b"connection", b"close")])
