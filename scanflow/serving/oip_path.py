"""Which OIP v2 infer URLs the gateway's fast front takes, and the path it forwards them to.

Why a module of its own: the fast front (scanflow.serving.fastfront) reads the raw request target from
httptools, before any ASGI routing, and must take only the URLs whose `{name}` and `{version}` mean the
same there as in the FastAPI routes of scanflow.serving.protocols (`/v2/models/{name}/infer` and
`/v2/models/{name}/versions/{version}/infer`). So only names of URL-unreserved characters (letters,
digits, `-._~`) are taken: they are the same raw, percent-decoded and quoted again. Anything else
(a percent-escape, a query string, another path) goes through the ASGI app as before.
"""

from __future__ import annotations

import re

import orjson

from scanflow.serving import oip
from scanflow.serving.batchwire import ItemModel

_INFER = re.compile(rb"/v2/models/([A-Za-z0-9._~-]+)(?:/versions/([A-Za-z0-9._~-]+))?/infer")


def infer_target(url: bytes) -> ItemModel:
    """(name, version or None) of a v2 infer request target the fast front takes; None otherwise."""
    m = _INFER.fullmatch(url)
    if m is None:
        return None
    version = m.group(2)
    return m.group(1).decode(), None if version is None else version.decode()


def infer_path(model: tuple[str, str | None]) -> bytes:
    """The upstream path of a v2 infer request (`infer_target` took only names that need no quoting)."""
    name, version = model
    return f"/v2/models/{name}{'' if version is None else '/versions/' + version}/infer".encode()


def v2_shaped(status: int, payload: bytes) -> tuple[int, bytes]:
    """A server-side refusal in the native shape ({"detail"}: the gateway's own 503 when no replica
    answers, its 504 on an upstream timeout, a draining replica's 503) -> the protocol's {"error"}
    shape, as the gateway's v2 route answers them; any other answer passes unchanged."""
    if status >= 500:
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return status, payload
        if isinstance(doc, dict) and "detail" in doc and "error" not in doc:
            return oip.native_error(status, payload)
    return status, payload
