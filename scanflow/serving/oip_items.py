"""Open Inference Protocol v2 infer requests on a replica: which model a name means (`OipCatalog`), and
an infer body as one item of a coalesced call (`parse_item`, `answer_item`).

Why: the gateway's fast front coalesces v2 infer requests with native `/predict` ones (POST
/predict_batch framed with `models`: scanflow.serving.batchwire), so a v2 request shares a model call and an HTTP round trip
with its neighbours instead of taking a FastAPI cycle on the gateway and another on the replica. The
item goes through the same steps as the replica's own v2 route (scanflow.serving.protocols): the name
checked against the loaded model, the body checked by `oip.parse_infer`, then the checks the native
`/predict` body it becomes would get (`payload.check_request_id`, `payload._to_float32`, the model's
width), with the same statuses and messages. So the two paths answer alike, byte for byte but for the
fresh request id. Who calls: scanflow.serving.replica_hotpath (`predict_batch`) and
scanflow.serving.protocols (`install_replica`, the catalog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from scanflow.serving import oip
from scanflow.serving.oip import InferCall, ModelMeta, OipError
from scanflow.serving.payload import PayloadError, PredictRequest, _to_float32, check_request_id

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


def answer_item(native: dict[str, Any], item: V2Item) -> bytes:
    """The native answer document of a v2 item (as the batch path builds it) -> the infer response."""
    probs = native.get("probabilities")
    if probs is not None and not isinstance(probs, list):  # an array: as the JSON round trip would give it
        native = {**native, "probabilities": probs.tolist()}
    return orjson.dumps(oip.infer_answer(native, item.meta, item.call))


def error_item(status: int, native_body: bytes) -> tuple[int, bytes]:
    """A native error answer for a v2 item (model failure, swap) -> the protocol's shape."""
    return oip.native_error(status, native_body)
