"""Open Inference Protocol v2 infer requests on a replica: which model a name means (`OipCatalog`), and
infer bodies as items of a coalesced call (`parse_items`, `parse_item`, `answer_item`).

Why: the gateway's fast front coalesces v2 infer requests with native `/predict` ones (POST
/predict_batch framed with `models`: scanflow.serving.batchwire), so a v2 request shares a model call and an HTTP round trip
with its neighbours instead of taking a FastAPI cycle on the gateway and another on the replica. The
item goes through the same steps as the replica's own v2 route (scanflow.serving.protocols): the name
checked against the loaded model, the body checked by `oip.parse_infer`, then the checks the native
`/predict` body it becomes would get (`payload.check_request_id`, `payload._to_float32`, the model's
width), with the same statuses and messages. So the two paths answer alike, byte for byte but for the
fresh request id. `parse_items` checks the common case (one float tensor of one row, nothing refused)
for all the call's items at once, with one numpy conversion instead of a handful per item, and leaves
every other item, or the whole group when a value is out of range, to `parse_item`. Who calls: scanflow.serving.replica_hotpath (`predict_batch`) and
scanflow.serving.protocols (`install_replica`, the catalog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from scanflow.serving import oip
from scanflow.serving.oip import InferCall, ModelMeta, OipError
from scanflow.serving.payload import _F32_MAX, PayloadError, PredictRequest, _to_float32, check_request_id

if TYPE_CHECKING:
    from scanflow.serving.model import LoadedModel
    from scanflow.serving.replica_server import Replica


class OipCatalog:
    """The replica's model as v2 publishes it: its metadata (rebuilt when a swap installs another
    model) and the check of a request's `{name}` / `{version}`."""

    def __init__(self, replica: Replica) -> None:
        cfg = replica.config
        self.replica = replica
        self.service = cfg.service
        self.startup_name = oip.model_name(cfg.model_uri, cfg.service)
        self._cache: tuple[LoadedModel | None, ModelMeta | None] = (None, None)

    def current(self) -> ModelMeta | None:
        model = self.replica.batcher.model
        if model is None:
            return None
        if self._cache[0] is not model:
            self._cache = (model, oip.metadata(model, self.service))
        return self._cache[1]

    def known(self, name: str, version: str | None) -> ModelMeta:
        """The metadata of the model `name` (and `version`) means, or OipError (404 unknown, 503 loading)."""
        meta = self.current()
        if meta is None:
            if name in (self.startup_name, self.service):
                err = self.replica.load_error
                raise OipError(503, f"model {name!r} not loaded yet{': ' + err if err else ''}")
            raise OipError(404, f"unknown model {name!r}; this service serves {self.startup_name!r}")
        if not meta.answers_to(name):
            raise OipError(404, f"unknown model {name!r}; this service serves {meta.name!r}")
        if version is not None and version != meta.version:
            raise OipError(404, f"model {name!r} has no version {version!r} here; serving {meta.version!r}")
        return meta


@dataclass(slots=True)
class V2Item:
    """What a checked v2 item needs once the model has answered: its metadata and its request."""

    meta: ModelMeta
    call: InferCall


def parse_item(
    body: bytes, name: str, version: str | None, catalog: OipCatalog, *, n_features: int | None, max_rows: int,
    max_body_bytes: int,
) -> tuple[PredictRequest, V2Item] | tuple[int, bytes]:
    """One v2 infer body of a coalesced call -> (the native request it becomes, what to answer with),
    or (status, v2 error body) when it is refused, as the replica's v2 route would refuse it."""
    if len(body) > max_body_bytes:
        return 413, oip.error_body(f"request body of {len(body)} bytes is over the limit of {max_body_bytes} bytes")
    try:
        meta = catalog.known(name, version)
        call = oip.parse_infer(body, meta, max_rows=max_rows)
    except OipError as exc:
        return exc.status, exc.body()
    try:  # what the native /predict body would be refused for (its 4xx become 400, as `native_error` says)
        if n_features is not None and call.rows.shape[1] != n_features:
            raise PayloadError(422, f"each row of 'inputs' must have {n_features} features; got {call.rows.shape[1]}")
        request_id = check_request_id(call.request_id)
        rows = _to_float32(call.rows)
    except PayloadError as exc:
        return oip.native_error(exc.status, orjson.dumps({"detail": exc.message}))
    want_probabilities = call.outputs is None or "probabilities" in call.outputs
    return PredictRequest(rows, request_id, want_probabilities), V2Item(meta, call)


Parsed = tuple[PredictRequest, V2Item] | tuple[int, bytes]


def parse_items(
    items: list[tuple[bytes, str, str | None]], catalog: OipCatalog, *, n_features: int | None, max_rows: int,
    max_body_bytes: int,
) -> list[Parsed]:
    """The v2 items (body, name, version) of one call, each answered as `parse_item` answers it.

    Why a joint path: per item, `parse_item` pays about ten numpy calls on a one-row tensor (the array,
    the finiteness and range checks, two casts), which made a coalesced v2 item cost the replica about
    twice a native one. Here the items whose body is the common case (`_one_float_row`) are checked
    together: one array for all their rows, one range check, one cast. Anything else, and every item
    of the group when that check fails (a NaN, an overflow, a ragged row), goes through `parse_item`,
    so every refusal keeps its own status and message."""
    out: list[Parsed | None] = [None] * len(items)
    simple: list[tuple[int, list[Any], str | None, list[str] | None, ModelMeta]] = []
    for k, (body, name, version) in enumerate(items):
        hit = _one_float_row(body, name, version, catalog, n_features, max_body_bytes)
        if hit is None:
            out[k] = parse_item(body, name, version, catalog, n_features=n_features, max_rows=max_rows,
                                max_body_bytes=max_body_bytes)
        else:
            simple.append((k, *hit))
    if simple:
        rows = _stacked([data for _, data, _, _, _ in simple])
        if rows is None:  # some value is refused: each item alone, for its own answer
            for k, *_ in simple:
                body, name, version = items[k]
                out[k] = parse_item(body, name, version, catalog, n_features=n_features, max_rows=max_rows,
                                    max_body_bytes=max_body_bytes)
        else:
            rows64, rows32 = rows
            for j, (k, _, request_id, outputs, meta) in enumerate(simple):
                want = outputs is None or "probabilities" in outputs
                out[k] = (PredictRequest(rows32[j : j + 1], request_id, want),
                          V2Item(meta, InferCall(rows64[j : j + 1], request_id, outputs)))
    return out  # type: ignore[return-value]


def _one_float_row(
    body: bytes, name: str, version: str | None, catalog: OipCatalog, n_features: int | None, max_body_bytes: int
) -> tuple[list[Any], str | None, list[str] | None, ModelMeta] | None:
    """(the row's values, the id, the requested outputs, the model's metadata) when the body is one
    FP32/FP64 tensor of shape [1, width] with a flat `data` list that `parse_item` would accept but for
    the values themselves; None for anything else (that item takes `parse_item`)."""
    if len(body) > max_body_bytes:
        return None
    try:
        meta = catalog.known(name, version)
        doc = orjson.loads(body)
    except (OipError, orjson.JSONDecodeError):
        return None
    if type(doc) is not dict or meta.columns or len(meta.inputs) != 1:
        return None
    request_id, params, inputs = doc.get("id"), doc.get("parameters", {}), doc.get("inputs")
    if request_id is not None and not (
        type(request_id) is str and 0 < len(request_id) <= oip.MAX_ID_CHARS and request_id.isascii()
    ):
        return None
    if type(params) is not dict or type(inputs) is not list or len(inputs) != 1 or type(inputs[0]) is not dict:
        return None
    t, declared = inputs[0], meta.inputs[0]
    datatype, shape, data = t.get("datatype"), t.get("shape"), t.get("data")
    if (
        t.get("name") != declared.name
        or datatype not in ("FP32", "FP64")
        or (meta.declared and datatype != declared.datatype)
        or type(t.get("parameters", {})) is not dict
        or type(shape) is not list or len(shape) != 2 or type(shape[0]) is not int or type(shape[1]) is not int
        or shape[0] != 1
        or type(data) is not list or not data or len(data) != shape[1]
        or type(data[0]) not in (float, int)  # an all-boolean row is refused; nested data takes the slow path
        or (n_features is not None and shape[1] != n_features)
        or (meta.n_features is not None and shape[1] != meta.n_features)
    ):
        return None
    try:
        outputs = oip._requested_outputs(doc.get("outputs"), meta)
    except OipError:
        return None
    return data, request_id, outputs, meta


def _stacked(rows: list[list[Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(float64, float32) arrays of the rows when every value is a finite number within float32's
    range and the rows are equally long; None otherwise."""
    try:
        arr = np.asarray(rows)
    except ValueError:  # ragged
        return None
    if arr.ndim != 2 or arr.dtype.kind not in "iuf":
        return None
    rows64 = arr.astype(np.float64, copy=False)
    if not np.abs(rows64).max() <= _F32_MAX:  # NaN compares false too
        return None
    return rows64, rows64.astype(np.float32)


def answer_item(native: dict[str, Any], item: V2Item) -> bytes:
    """The native answer document of a v2 item (as the batch path builds it) -> the infer response."""
    return orjson.dumps(oip.infer_answer(native, item.meta, item.call), option=orjson.OPT_SERIALIZE_NUMPY)


def error_item(status: int, native_body: bytes) -> tuple[int, bytes]:
    """A native error answer for a v2 item (model failure, swap) -> the protocol's shape."""
    return oip.native_error(status, native_body)
