"""JSON has no NaN or infinity: find them before they reach a store, a response or a peer.

Why: Python's `json` writes `NaN`/`Infinity` by default, so a non-finite float slips into the store and
only fails later, where it hurts: Starlette's JSONResponse refuses it (a 500 on GET /events or on an
actuator call) and httpx refuses to encode it (an outbox message that can never be sent). These pure
helpers let every entry point refuse such values at once, naming where they are.
The same goes for nesting depth (MAX_JSON_DEPTH, below).
Who calls: scanflow.agent.app (POST /events -> 422; every JSON body's depth; reads clipped),
scanflow.agent.store (add_event refuses NaN and too deep payloads),
scanflow.agent.outcomes (actuator outcomes), scanflow.agentkit.outbox (dead-letters what cannot be sent).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from typing import Any


class NotJSONError(ValueError):
    """A value JSON cannot carry (NaN, infinity); the message names where it is."""


def non_finite_path(value: Any, path: str = "$") -> str | None:
    """Pure: the path of the first NaN/infinite float inside `value` (dicts, lists, tuples), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = non_finite_path(v, f"{path}.{k}")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = non_finite_path(v, f"{path}[{i}]")
            if found:
                return found
    return None


def check_finite(value: Any, what: str = "value") -> None:
    """Raise NotJSONError if `value` holds a NaN or infinite float."""
    where = non_finite_path(value)
    if where is not None:
        raise NotJSONError(f"{what} holds a non-finite number at {where} (JSON has no NaN or infinity)")


def to_json_value(value: Any, what: str = "value") -> Any:
    """Round-trip through strict JSON: non-JSON objects (datetimes, numpy scalars) become strings,
    NaN/infinity raise NotJSONError naming the path."""
    check_finite(value, what)
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False))
    except ValueError as exc:  # e.g. a numpy float64 subclass the walk did not see inside an object
        raise NotJSONError(f"{what} cannot be written as JSON: {exc}") from None


# -- nesting depth -----------------------------------------------------------------------------------
# Why: a 900-deep payload was accepted by POST /events and then every GET /events answered 500
# (pydantic's serializer refuses such depth), and recursive walks (the NaN check above, FastAPI's error
# echo) hit Python's recursion limit on deeper ones. Every JSON body is bounded before it is parsed.

MAX_JSON_DEPTH = 64  # levels of objects/arrays in one JSON document (a request body, a payload)

# A JSON string, escapes included: what lies inside may hold brackets that do not nest anything.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def raw_json_depth(body: bytes) -> int:
    """Pure: the deepest nesting of arrays/objects in a JSON text, without parsing it (so a body too
    deep for the parser is measured too). Brackets inside strings do not count. C-level passes only
    (count, regex, translate, accumulate): ~1 us for a small body, a few ms for 1 MiB."""
    opens = body.count(b"[") + body.count(b"{")
    if opens <= 1:
        return opens
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def too_deep_path(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Pure: the path of the first container nested deeper than `limit` levels in `value` (dicts,
    lists, tuples; the top one is level 1), or None. Iterative: any depth is measured."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, Mapping):
            if depth > limit:
                return path
            stack.extend((x, depth + 1, f"{path}.{k}") for k, x in v.items() if isinstance(x, _CONTAINERS))
        elif isinstance(v, (list, tuple)):
            if depth > limit:
                return path
            stack.extend(
                (x, depth + 1, f"{path}[{i}]") for i, x in enumerate(v) if isinstance(x, _CONTAINERS)
            )
    return None


def check_depth(value: Any, what: str = "value", limit: int = MAX_JSON_DEPTH) -> None:
    """Raise NotJSONError if `value` nests deeper than `limit` levels, naming where."""
    where = too_deep_path(value, limit)
    if where is not None:
        raise NotJSONError(f"{what} is nested deeper than {limit} levels (at {where[:200]})")


def clip_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> Any:
    """Pure: `value` with every container below level `limit` replaced by a string saying so. For
    reads of rows stored before the bound (GET /events, GET /decisions): they answer instead of 500.
    Recursion stops at `limit`, so any stored depth is safe."""
    if not isinstance(value, _CONTAINERS):
        return value
    if limit <= 0:
        return f"<nested deeper than {MAX_JSON_DEPTH} levels: not shown>"
    if isinstance(value, Mapping):
        return {k: clip_depth(v, limit - 1) for k, v in value.items()}
    return [clip_depth(v, limit - 1) for v in value]


_CONTAINERS = (Mapping, list, tuple)
