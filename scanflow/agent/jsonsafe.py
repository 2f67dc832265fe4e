"""JSON has no NaN or infinity: find them before they reach a store, a response or a peer.

Why: Python's `json` writes `NaN`/`Infinity` by default, so a non-finite float slips into the store and
only fails later, where it hurts: Starlette's JSONResponse refuses it (a 500 on GET /events or on an
actuator call) and httpx refuses to encode it (an outbox message that can never be sent). These pure
helpers let every entry point refuse such values at once, naming where they are.
Who calls: scanflow.agent.app (POST /events -> 422), scanflow.agent.store (add_event refuses),
scanflow.agent.runtime (actuator outcomes), scanflow.embedded.outbox (dead-letters what cannot be sent).
"""

from __future__ import annotations

import json
import math
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
