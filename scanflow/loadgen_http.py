"""The load generator's raw HTTP/1.1 client pieces: the request and answer records, the bytes of a
keep-alive POST, and the reading of an answer's head and body off an asyncio stream. Separate from the
engine (scanflow.loadgen_engine) because it is the wire format alone: no scheduling, no counting, pure
functions and one stream reader that test without a server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

JSON_HEADERS: Mapping[str, str] = {"content-type": "application/json"}


class ConnectError(OSError):
    """The endpoint could not be reached (refused, unreachable, or no connection within the timeout)."""


class ProtocolError(ValueError):
    """The endpoint answered something that is not an HTTP/1.x response."""


@dataclass(frozen=True)
class Request:
    """One request to send: the encoded body and whatever the judge needs to make sense of the answer."""

    content: bytes
    meta: Any = None
    headers: Mapping[str, str] = field(default_factory=lambda: JSON_HEADERS)


@dataclass(frozen=True)
class Response:
    """An answer: status, headers (names lower-cased) and body."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not JSON."""
        return orjson.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")



def http_request(url: str, body: bytes, headers: Mapping[str, str] = JSON_HEADERS) -> bytes:
    """The raw HTTP/1.1 POST of `body` to `url` (keep-alive, Content-Length)."""
    u = urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {u.netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers with lower-cased names, whether the connection stays open) of a response head;
    ProtocolError when it is not HTTP/1.x."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if parts[0] == b"HTTP/1.1" else connection == "keep-alive"
    return int(parts[1]), headers, keep


async def read_body(reader: asyncio.StreamReader, status: int, headers: Mapping[str, str]) -> tuple[bytes, bool]:
    """The body of an answer whose head was read, and whether its end was framed (False: it ran to the
    connection's end, which then cannot carry another request)."""
    if status < 200 or status in (204, 304):
        return b"", True
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the blank line
                    pass
                return b"".join(chunks), True
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ProtocolError(f"bad content-length {length[:40]!r}")
        return await reader.readexactly(int(length)), True
    return await reader.read(), False
