"""The wire format of `POST /predict_batch` (gateway -> replica): pure functions, no I/O.

Why: the gateway coalesces concurrent client requests into one upstream call, so a replica pays one
HTTP round trip per batch instead of one per request (see docs/serving.md). The client bodies travel
*unparsed* and length-framed (no JSON joining), so a malformed or malicious body can only ever affect
its own answer: each item is parsed and validated on its own by the replica exactly as `POST /predict`
would, with the same statuses and messages.

    request  (content-type application/x-scanflow-batch):
        {"sizes": [n1, n2, ...]}\\n<body 1><body 2>...
    response (same content-type, status 200):
        {"model_version": "3", "items": [[status1, m1], [status2, m2], ...]}\\n<answer 1><answer 2>...

Every item answered 200 in one response was computed by the one model version named in the header.
Who calls: scanflow.serving.gateway (encode_request, decode_response) and scanflow.serving.replica
(decode_request, encode_response).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

CONTENT_TYPE = b"application/x-scanflow-batch"
MAX_ITEMS = 4096


class BatchWireError(ValueError):
    """The batch framing itself is wrong (not an item's payload): the whole call is refused (400)."""


def encode_request(bodies: Sequence[bytes]) -> bytes:
    return b"".join((orjson.dumps({"sizes": [len(b) for b in bodies]}), b"\n", *bodies))


def _split(payload: bytes) -> tuple[object, int]:
    nl = payload.find(b"\n")
    if nl < 0:
        raise BatchWireError("batch body must start with a JSON header line")
    try:
        header = orjson.loads(payload[:nl])
    except orjson.JSONDecodeError as exc:
        raise BatchWireError(f"batch header is not JSON: {exc}") from None
    return header, nl + 1


def decode_request(payload: bytes) -> list[bytes]:
    """The client bodies, in order; BatchWireError when the framing does not add up."""
    header, pos = _split(payload)
    sizes = header.get("sizes") if isinstance(header, dict) else None
    if (
        not isinstance(sizes, list)
        or not 0 < len(sizes) <= MAX_ITEMS
        or not all(type(n) is int and n >= 0 for n in sizes)
    ):
        raise BatchWireError(f'batch header must be {{"sizes": [byte counts]}} with 1 to {MAX_ITEMS} items')
    if pos + sum(sizes) != len(payload):
        raise BatchWireError("batch sizes do not add up to the body length")
    out: list[bytes] = []
    for n in sizes:
        out.append(payload[pos : pos + n])
        pos += n
    return out


def encode_response(version: str | None, answers: Sequence[tuple[int, bytes]]) -> bytes:
    header = orjson.dumps({"model_version": version, "items": [[s, len(b)] for s, b in answers]})
    return b"".join((header, b"\n", *(b for _, b in answers)))


def decode_response(payload: bytes, expected: int) -> list[tuple[int, bytes]]:
    """[(status, body)] per item, in request order; BatchWireError if it is not `expected` items."""
    header, pos = _split(payload)
    items = header.get("items") if isinstance(header, dict) else None
    if not isinstance(items, list) or len(items) != expected:
        raise BatchWireError(f"batch answer must carry {expected} items")
    out: list[tuple[int, bytes]] = []
    for item in items:
        status, n = item
        out.append((status, payload[pos : pos + n]))
        pos += n
    if pos != len(payload):
        raise BatchWireError("batch answer sizes do not add up to the body length")
    return out
