"""Raw ASGI helpers for the two hot paths (replica `/predict`, gateway `/predict`).

Why not FastAPI routes there: its request/response machinery costs tens of microseconds per call and
HTTP handling is what bounds a server on a small machine (see docs/serving.md). Everything else (admin,
health, metrics) stays in FastAPI. Who calls: scanflow.serving.replica and scanflow.serving.gateway.
"""

from __future__ import annotations

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


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, refusing early (413) when Content-Length or the bytes read exceed `limit`."""
    declared = content_length(scope)
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the limit of {limit} bytes")
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
