"""The wire format of `POST /predict_batch` (gateway -> replica): pure functions, no I/O.

Why: the gateway coalesces concurrent client requests into one upstream call, so a replica pays one
HTTP round trip per batch instead of one per request (see docs/serving.md). The client bodies travel
*unparsed* and length-framed (no JSON joining), so a malformed or malicious body can only ever affect
its own answer: each item is parsed and validated on its own by the replica exactly as `POST /predict`
would, with the same statuses and messages.

    request  (content-type application/x-scanflow-batch):
        {"sizes": [n1, n2, ...]}\\n<body 1><body 2>...
        {"infer_sizes": [...], "models": [null, ["digits", null], ...]}\\n...   (with v2 items)
    response (same content-type, status 200):
        {"model_version": "3", "items": [[status1, m1], [status2, m2], ...]}\\n<answer 1><answer 2>...

Every item answered 200 in one response was computed by the one model version named in the header.
`models` says, item by item, which bodies are Open Inference Protocol v2 infer requests and for which
`{name}` and `{version}` of their path (null: a native /predict body); the replica answers those items
in the protocol's shape. With it the sizes go under `infer_sizes`, not `sizes`: a replica from before
it finds no `sizes` and refuses the whole call (400), which the gateway answers by forwarding each
request alone to its own path; with `sizes` it would answer the v2 bodies as malformed native ones.
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


# Which v2 model an item asks for: ({name}, {version} or None); None for a native /predict body.
ItemModel = tuple[str, str | None] | None


def encode_request(bodies: Sequence[bytes], models: Sequence[ItemModel] | None = None) -> bytes:
    sizes = [len(b) for b in bodies]
    header: dict[str, object] = {"sizes": sizes}
    if models is not None:  # `infer_sizes`: see the module's docstring
        header = {"infer_sizes": sizes, "models": [None if m is None else list(m) for m in models]}
    return b"".join((orjson.dumps(header), b"\n", *bodies))


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
    return decode_request_items(payload)[0]


def decode_request_items(payload: bytes) -> tuple[list[bytes], list[ItemModel]]:
    """(the client bodies, the v2 model of each or None), in order; BatchWireError when the framing
    does not add up."""
    header, pos = _split(payload)
    if not isinstance(header, dict):
        header = {}
    sizes = header.get("infer_sizes") if "models" in header else header.get("sizes")
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
    return out, _models(header, len(sizes))  # type: ignore[arg-type]


def _models(header: dict[str, object], n: int) -> list[ItemModel]:
    if "models" not in header:
        return [None] * n
    raw = header["models"]
    if not isinstance(raw, list) or len(raw) != n:
        raise BatchWireError("batch 'models' must give one entry per item")
    out: list[ItemModel] = []
    for m in raw:
        if m is None:
            out.append(None)
        elif (isinstance(m, list) and len(m) == 2 and isinstance(m[0], str)
              and (m[1] is None or isinstance(m[1], str))):
            out.append((m[0], m[1]))
        else:
            raise BatchWireError("a batch 'models' entry must be null or [name, version or null]")
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
