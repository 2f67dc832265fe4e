"""Parse and validate a `POST /predict` body: pure functions, no I/O.

Who calls: the replica's hot path (scanflow.serving.replica). Everything a client can get wrong ends
here as a `PayloadError` carrying the HTTP status (413 too large, 422 malformed) and a message that
says what to send instead; nothing reaches the model unless it is a finite float32 (n, n_features)
matrix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson


class PayloadError(ValueError):
    """A request the replica refuses; `status` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class PredictRequest:
    inputs: np.ndarray  # float32, shape (n, n_features), all finite
    request_id: str | None
    labels: list[int] | None
    want_probabilities: bool


def decode_json(body: bytes) -> Any:
    """orjson first (fast); on failure the stdlib, which also reads NaN/Infinity so they can be named."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(422, f"body is not valid JSON: {exc}") from None


def parse_predict(body: bytes, *, n_features: int | None, max_rows: int) -> PredictRequest:
    """Validate a predict body -> PredictRequest, or raise PayloadError (422/413)."""
    doc = decode_json(body)
    if not isinstance(doc, dict):
        raise PayloadError(422, 'body must be a JSON object: {"inputs": [[...], ...]}')
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise PayloadError(422, "'inputs' must be a non-empty list of rows (lists of numbers)")
    if len(inputs) > max_rows:
        raise PayloadError(413, f"'inputs' has {len(inputs)} rows; at most {max_rows} per request")
    if not isinstance(inputs[0], list):
        raise PayloadError(422, "'inputs' must be a list of rows, e.g. [[0.0, 0.5, ...]]; got a flat list")
    try:
        arr = np.asarray(inputs)
    except ValueError:
        arr = None
    if arr is None or arr.dtype.kind not in "iuf" or arr.ndim != 2:
        raise PayloadError(
            422, "'inputs' must be rows of numbers of equal length (no strings, booleans, nulls or ragged rows)"
        )
    if n_features is not None and arr.shape[1] != n_features:
        raise PayloadError(
            422, f"each row of 'inputs' must have {n_features} features; got {arr.shape[1]}"
        )
    with np.errstate(over="ignore"):  # overflow becomes inf, refused just below with its row
        arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).any(axis=1).argmax())
        raise PayloadError(422, f"'inputs' row {bad} contains NaN or infinite values (or a float32 overflow)")
    request_id = doc.get("request_id")
    if request_id is not None and (not isinstance(request_id, str) or not 0 < len(request_id) <= 200):
        raise PayloadError(422, "'request_id' must be a string of 1 to 200 characters")
    labels = doc.get("labels")
    if labels is not None and (
        not isinstance(labels, list)
        or len(labels) != arr.shape[0]
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in labels)
    ):
        raise PayloadError(422, f"'labels' must be a list of {arr.shape[0]} integers, one per row")
    probs = doc.get("probabilities", False)
    if not isinstance(probs, bool):
        raise PayloadError(422, "'probabilities' must be true or false")
    return PredictRequest(arr, request_id, labels, probs)


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN: used when echoing model outputs."""
    return x if math.isfinite(x) else None
