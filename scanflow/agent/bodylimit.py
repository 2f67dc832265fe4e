"""ASGI middleware of the agents' apps: request bodies bounded in size, JSON depth and time before
anyone parses them (scanflow.agent.app installs it on every agent).
"""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scanflow.agent.jsonsafe import MAX_JSON_DEPTH, raw_json_depth

DEFAULT_BODY_TIMEOUT_S = 10.0


class BodySizeLimit:
    """ASGI middleware: refuse request bodies over `max_bytes` with 413, and JSON bodies nested deeper
    than `max_depth` levels with 422, before anyone parses them; a body not in within `timeout_s`
    gets 408 and the connection is closed.

    Why the depth: a 900-deep event payload was accepted, then GET /events answered 500 for good
    (pydantic's serializer refuses the depth), and deeper bodies reach Python's recursion limit in
    the parser, the NaN check or FastAPI's error echo. The body is read here in full (it is bounded
    by `max_bytes`; the app would read it all anyway) and handed on unchanged. Why the deadline: a
    client sending its body slowly otherwise holds a connection and a task for as long as it likes
    (the replica and the gateway bound it the same way, scanflow.serving.asgi.BodyDeadlines; an agent
    is no hot path, so one `asyncio.timeout` per body read is cheap enough here).
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_depth: int = MAX_JSON_DEPTH, timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_type = b""
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await self._refuse(send, 413, f"request body is larger than {self.max_bytes} bytes")
                    return
            elif name == b"content-type":
                content_type = value.lower()
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    msg = await receive()
                    if msg["type"] != "http.request":  # the client left: nothing to answer
                        return
                    chunk = msg.get("body", b"")
                    received += len(chunk)
                    if received > self.max_bytes:
                        await self._refuse(send, 413, f"request body is larger than {self.max_bytes} bytes")
                        return
                    chunks.append(chunk)
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:  # the rest of the body was never read: the connection cannot carry another request
            await self._refuse(send, 408, f"request body not received within {self.timeout_s:g} s", close=True)
            return
        body = b"".join(chunks)
        # FastAPI reads a body as JSON when its content type says json, or says nothing
        if body and (not content_type or b"json" in content_type):
            # ~1 us for a small body; a big one (a few ms per MiB, ~130 ms for 1 MiB of brackets)
            # is measured off the event loop
            depth = (
                raw_json_depth(body) if len(body) < 65536 else await asyncio.to_thread(raw_json_depth, body)
            )
            if depth > self.max_depth:
                await self._refuse(
                    send,
                    422,
                    f"request body is nested {depth} levels deep; the limit is {self.max_depth} "
                    "levels of JSON objects/arrays (the body itself counts as one)",
                )
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, code: int, detail: str, close: bool = False) -> None:
        resp = JSONResponse({"detail": detail}, status_code=code, headers={"connection": "close"} if close else None)
        await resp({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:  # pragma: no cover - JSONResponse never reads
    return {"type": "http.disconnect"}
