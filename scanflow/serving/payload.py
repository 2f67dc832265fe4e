"""Parse and validate a `POST /predict` body: pure functions, no I/O.

Who calls: the replica's hot path (scanflow.serving.replica). Everything a client can get wrong ends
here as a `PayloadError` carrying the HTTP status (413 too large, 422 malformed) and a message that
says what to send instead; nothing reaches the model unless it is a finite float32 (n, n_features)
matrix.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

log = logging.getLogger("scanflow.serving.payload")

# JSON nesting a body may have when the stdlib parser (recursive, in Python) has to read it. A predict
# body needs 3 levels; orjson, which reads every body first, refuses more than 1024 levels by itself.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # linear: one character per step, no nesting

class PayloadError(ValueError):
    """A request the replica refuses; `status` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class PredictRequest:
    """Not frozen: a frozen dataclass sets each field through object.__setattr__ (~4x the cost of
    a plain one), paid once per item of every coalesced call; nothing mutates these."""

    inputs: np.ndarray  # float32, shape (n, n_features), all finite
    request_id: str | None
    want_probabilities: bool


@dataclass(slots=True)
class ParsedBatch:
    """The items of a coalesced call, answer for answer, and `x`: the float32 rows of every valid
    item stacked in item order (None when no item is valid), ready for one model call."""

    items: list[PredictRequest | PayloadError]
    x: np.ndarray | None


def decode_json(body: bytes) -> Any:
    """orjson first (fast); on failure the stdlib, which also reads NaN/Infinity so they can be named.

    The stdlib parser recurses once per level of nesting, so a body it would have to read is first
    held to MAX_JSON_DEPTH (a 30 KB body of brackets used to raise RecursionError, a 500). Only bodies
    orjson refused get here: the check costs nothing on the hot path."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise PayloadError(422, f"body is nested {depth} levels deep; at most {MAX_JSON_DEPTH}")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise PayloadError(422, f"body is not valid JSON: {exc}") from None


def json_depth(body: bytes) -> int:
    """The deepest nesting of [ and { in a JSON text, outside strings (vectorised: no recursion)."""
    b = np.frombuffer(_JSON_STRING.sub(b'""', body), dtype=np.uint8)
    if not b.size:
        return 0
    step = ((b == 0x5B) | (b == 0x7B)).astype(np.int32) - ((b == 0x5D) | (b == 0x7D))
    return int(max(0, np.cumsum(step).max()))


_F32_MAX = float(np.finfo(np.float32).max)
LABELS_REFUSED = "labels are feedback: POST them to the Tracker's /feedback with the request_id"


def parse_predict(body: bytes, *, n_features: int | None, max_rows: int) -> PredictRequest:
    """Validate a predict body -> PredictRequest, or raise PayloadError (422/413; 400 for a body that
    breaks the parser in a way no rule names, so the caller never answers 500 for a client's bytes)."""
    try:
        req = _parse_unchecked(body, n_features=n_features, max_rows=max_rows)
        return PredictRequest(_to_float32(req.inputs), req.request_id, req.want_probabilities)
    except PayloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - `unexpected` logs it with its traceback
        raise unexpected(exc) from None


def parse_many(
    bodies: list[bytes], *, n_features: int | None, max_rows: int, max_body_bytes: int
) -> list[PredictRequest | PayloadError]:
    """`parse_predict` for each body of a coalesced call, answer for answer (same rules, statuses and
    messages); `parse_batch` without the stacked rows."""
    return parse_batch(bodies, n_features=n_features, max_rows=max_rows, max_body_bytes=max_body_bytes).items


def parse_batch(bodies: list[bytes], *, n_features: int | None, max_rows: int, max_body_bytes: int) -> ParsedBatch:
    """`parse_predict` for each body of a coalesced call, answer for answer (same rules, statuses and
    messages), with one range check and one float32 cast for all the valid rows together, which are
    also returned stacked (`ParsedBatch.x`) so the caller does not concatenate them again.

    Fast path first (`_parse_many_fast`): when every body is a plain valid request, all rows become
    one array in one conversion. Any body that is not (or any row the conversion refuses) sends the
    whole call through the per-item path below, which names each item's own error.
    Who calls: the replica's POST /predict_batch."""
    try:
        fast = _parse_many_fast(bodies, n_features=n_features, max_rows=max_rows, max_body_bytes=max_body_bytes)
    except Exception:  # noqa: BLE001 - whatever it was, the per-item path below pins it on its own body
        fast = None
    if fast is not None:
        return fast
    out: list[PredictRequest | PayloadError] = []
    for body in bodies:
        if len(body) > max_body_bytes:
            out.append(PayloadError(413, f"request body of {len(body)} bytes is over the limit of {max_body_bytes} bytes"))
            continue
        try:
            out.append(_parse_unchecked(body, n_features=n_features, max_rows=max_rows))
        except PayloadError as exc:
            out.append(exc)
        except Exception as exc:  # noqa: BLE001 - one body's surprise is its own answer (`unexpected` logs it)
            out.append(unexpected(exc))
    valid = [i for i, r in enumerate(out) if type(r) is PredictRequest]
    if not valid:
        return ParsedBatch(out, None)
    arrays = [out[i].inputs for i in valid]  # type: ignore[union-attr]
    x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    ok = not x.size or np.abs(x).max() <= _F32_MAX  # False: NaN, inf or a float32 overflow somewhere
    x32 = x.astype(np.float32) if ok else None
    start = 0
    for i in valid:
        req = out[i]
        assert isinstance(req, PredictRequest)
        n = len(req.inputs)
        try:
            inputs = x32[start : start + n] if x32 is not None else _to_float32(req.inputs)
        except PayloadError as exc:
            out[i] = exc
        else:
            out[i] = PredictRequest(inputs, req.request_id, req.want_probabilities)
        start += n
    if x32 is None:  # some row was refused: stack what stayed valid
        kept = [r.inputs for r in out if type(r) is PredictRequest]
        x32 = None if not kept else kept[0] if len(kept) == 1 else np.concatenate(kept)
    return ParsedBatch(out, x32)


def _parse_many_fast(
    bodies: list[bytes], *, n_features: int | None, max_rows: int, max_body_bytes: int
) -> ParsedBatch | None:
    """Every body valid: one `np.asarray` over all their rows and one float32 cast; else None.

    Why: converting item by item (dtype discovery, array set-up, a dataclass per step) was most of a
    replica's per-item CPU under coalescing (docs/serving.md, "Replica per-item cost"). Same rules as
    `_parse_unchecked`: this path only ever accepts what that one accepts. The one case where a joint
    conversion is more lenient than a per-item one, an item of booleans only (bool alone, float64
    beside numbers), is kept off this path by refusing any item whose first value is a boolean;
    strings, nulls, ragged or nested rows and ints too large for int64 make the joint array non-numeric
    or fail, and the caller falls back.
    """
    rows: list[list[object]] = []
    items: list[tuple[int, str | None, bool]] = []
    for body in bodies:
        if len(body) > max_body_bytes:
            return None
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if type(doc) is not dict:
            return None
        inputs = doc.get("inputs")
        if type(inputs) is not list or not inputs or len(inputs) > max_rows:
            return None
        first = inputs[0]
        if type(first) is not list or not first or type(first[0]) is bool:
            return None
        if len(doc) == 1:  # {"inputs": ...} alone, the usual body: nothing else to check
            request_id, probs = None, False
        else:
            try:
                request_id, probs = _extras(doc)
            except PayloadError:
                return None
        rows.extend(inputs)
        items.append((len(inputs), request_id, probs))
    try:
        arr = np.asarray(rows)
    except ValueError:
        return None
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or (n_features is not None and arr.shape[1] != n_features):
        return None
    if arr.size and not np.abs(arr).max() <= _F32_MAX:
        return None
    x = arr.astype(np.float32, copy=False)
    out: list[PredictRequest | PayloadError] = []
    start = 0
    for n, request_id, probs in items:
        out.append(PredictRequest(x[start : start + n], request_id, probs))
        start += n
    return ParsedBatch(out, x)


def unexpected(exc: Exception) -> PayloadError:
    """A body that made the parser fail in a way the rules above did not foresee: logged (it is a gap
    in the rules) and refused as that request's own 400, so the requests batched with it still pass."""
    log.error("unexpected error parsing a predict body", exc_info=exc)
    return PayloadError(400, f"request body could not be parsed ({type(exc).__name__})")


def _to_float32(arr: np.ndarray) -> np.ndarray:
    """float32 copy of a numeric matrix; PayloadError naming the first row with NaN/inf/overflow."""
    if arr.size and not np.abs(arr).max() <= _F32_MAX:
        bad = int((~(np.abs(arr) <= _F32_MAX)).any(axis=1).argmax())
        raise PayloadError(422, f"'inputs' row {bad} contains NaN or infinite values (or a float32 overflow)")
    return arr.astype(np.float32, copy=False)


def _parse_unchecked(body: bytes, *, n_features: int | None, max_rows: int) -> PredictRequest:
    """Everything but the value range: `inputs` is a numeric (n, n_features) array of any dtype."""
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
    request_id, probs = _extras(doc)
    return PredictRequest(arr, request_id, probs)


def check_request_id(request_id: Any) -> str | None:
    """A client's own request id as given (None: none given), or PayloadError(422): 1 to 200 characters
    of valid Unicode. Shared by /predict and the protocols (/invocations) so the rule is one."""
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not 0 < len(request_id) <= 200:
        raise PayloadError(422, "'request_id' must be a string of 1 to 200 characters")
    if not request_id.isascii():  # rare: only then pay for the check below
        try:
            request_id.encode()
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): the answer could not be encoded
            raise PayloadError(422, "'request_id' must be valid Unicode (no lone surrogates)") from None
    return request_id


def _extras(doc: dict[str, Any]) -> tuple[str | None, bool]:
    """(request_id, probabilities) of a predict body, or PayloadError.

    `labels` is refused whatever its value: true labels are feedback, sent later to the Tracker by
    request_id, and a replica that took them would pass them on as if it knew them."""
    if "labels" in doc:
        raise PayloadError(422, LABELS_REFUSED)
    request_id = check_request_id(doc.get("request_id"))
    probs = doc.get("probabilities", False)
    if not isinstance(probs, bool):
        raise PayloadError(422, "'probabilities' must be true or false")
    return request_id, probs


def finite_or_none(x: float) -> float | None:
    """JSON has no NaN: used when echoing model outputs."""
    return x if math.isfinite(x) else None
