"""The replica's request handlers: POST /predict and POST /predict_batch, and what an answered request
produces (its request id, its answer document, its Tracker record).

Separate from scanflow.serving.replica_server because it is the code every request runs, and nothing
else: the replica's state, model loading, thread pool and admin API live there, and `Replica` takes
these handlers in as a mixin (`ReplicaHotPath`), so they still read the replica's state as `self`.
Who calls: the ASGI entry of scanflow.serving.replica_server (`ReplicaApp`) and, through `predict`,
scanflow.serving.protocols.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING

import numpy as np
import orjson

from scanflow.serving import batchwire
from scanflow.serving.asgi import (
    BodyDeadlines,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    UnsupportedMediaType,
    read_body,
    send_error,
    send_error_and_close,
    send_json,
    send_raw,
)
from scanflow.serving.batching import BatchResult, MicroBatcher, ModelNotReady
from scanflow.serving.model import as_probabilities
from scanflow.serving.oip_items import OipCatalog, V2Item, answer_item, error_item, parse_items
from scanflow.serving.payload import (
    ParsedBatch,
    PayloadError,
    PredictRequest,
    parse_batch,
    parse_predict,
)
from scanflow.serving.sink import TrackerSink
from scanflow.tracking.record_ids import new_request_id

if TYPE_CHECKING:
    from scanflow.serving.replica_server import ReplicaConfig, _Metrics

log = logging.getLogger("scanflow.serving.replica")


class ReplicaHotPath:
    """The request handlers of `scanflow.serving.replica_server.Replica` (a mixin: the attributes below
    are the replica's, set by its `__init__`)."""

    config: ReplicaConfig
    metrics: _Metrics
    batcher: MicroBatcher
    sink: TrackerSink | None
    body_deadlines: BodyDeadlines
    draining: bool
    load_error: str | None
    in_flight: int
    _idle: asyncio.Event
    oip_catalog: OipCatalog | None = None  # set by scanflow.serving.protocols.install_replica

    # ---- hot path ---------------------------------------------------------------------------
    async def predict(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        self.in_flight += 1
        self._idle.clear()
        status = 200
        try:
            status = await self._predict(scope, receive, send, t0)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            self._count(status)

    async def _predict(self, scope: Scope, receive: Receive, send: Send, t0: float) -> int:
        if self.draining:
            await send_error(send, 503, "replica is draining; send to another replica")
            return 503
        model = self.batcher.model
        if model is None:
            await send_error(send, 503, f"model not loaded yet{': ' + self.load_error if self.load_error else ''}")
            return 503
        try:
            body = await read_body(scope, receive, self.config.max_body_bytes, json_only=True,
                                   deadlines=self.body_deadlines)
            req = parse_predict(body, n_features=model.n_features, max_rows=self.config.max_rows)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc))
            return 413
        except PayloadError as exc:
            await send_error(send, exc.status, exc.message)
            return exc.status
        except UnsupportedMediaType as exc:
            await send_error(send, 415, str(exc))
            return 415
        except BodyTimeout as exc:
            await send_error_and_close(send, 408, str(exc))
            return 408
        except ClientGone:
            return 499
        try:
            result = await self.batcher.submit(req.inputs)
        except ModelNotReady as exc:
            await send_error(send, 503, str(exc))
            return 503
        except Exception as exc:  # the model itself failed on valid input
            log.exception("model call failed")
            await send_error(send, 500, f"model call failed: {type(exc).__name__}: {exc}")
            return 500
        request_id, doc = self._answer(req, result.outputs, result.probabilities, result.version)
        latency = time.perf_counter() - t0
        if self.sink is not None:  # before the answer: with a spool, the record is on disk when it leaves
            self.sink.record(self._record(req, request_id, req.inputs.tolist(), result.outputs, result.version,
                                          latency))
        await send_json(send, 200, doc)
        self.metrics.latency.observe(latency)
        return 200

    def _answer(
        self, req: PredictRequest, outputs: list, probabilities: np.ndarray | None, version: str
    ) -> tuple[str, dict[str, object]]:
        """(request_id, the /predict answer document) for one request. The request_id is always made
        here (see `_new_id`): a client's own id is echoed as `client_request_id` and kept in the record,
        never used as the record's identity, so no client can claim or overwrite another's record."""
        request_id = self._new_id()
        doc: dict[str, object] = {"outputs": outputs, "model_version": version, "request_id": request_id}
        if req.request_id is not None:
            doc["client_request_id"] = req.request_id
        if req.want_probabilities and probabilities is not None:
            doc["probabilities"] = as_probabilities(probabilities)
        return request_id, doc

    def _record(
        self, req: PredictRequest, request_id: str, inputs: list, outputs: list, version: str, latency: float
    ) -> dict[str, object]:
        """One Tracker record per client request (after its answer is built; never awaits).
        `inputs`: the request's rows as lists (a coalesced call converts all its rows at once)."""
        return {
            "record_id": request_id,
            "request_id": request_id,
            "client_request_id": req.request_id,
            "service": self.config.service,
            "replica_id": self.config.replica_id,
            "inputs": inputs,
            "outputs": outputs,
            "model_version": version,
            "latency_ms": round(latency * 1000.0, 3),
            "ts": time.time(),
        }

    async def predict_batch(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /predict_batch: many client requests (framed by scanflow.serving.batchwire) in one call.

        Each item is validated exactly as POST /predict would (same statuses and messages); the valid
        ones share ONE model call, so every 200 item of a response carries the same model version.
        One Tracker record per valid item. Who calls: the gateway's coalescing path.
        """
        t0 = time.perf_counter()
        self.in_flight += 1
        self._idle.clear()
        try:
            await self._predict_batch(scope, receive, send, t0)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _predict_batch(self, scope: Scope, receive: Receive, send: Send, t0: float) -> None:
        if self.draining:
            await send_error(send, 503, "replica is draining; send to another replica")
            return
        model = self.batcher.model
        if model is None:
            await send_error(send, 503, f"model not loaded yet{': ' + self.load_error if self.load_error else ''}")
            return
        try:
            bodies, models = batchwire.decode_request_items(
                await read_body(scope, receive, self.config.max_batch_body_bytes, deadlines=self.body_deadlines)
            )
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc))
            return
        except batchwire.BatchWireError as exc:
            await send_error(send, 400, str(exc))
            return
        except BodyTimeout as exc:
            await send_error_and_close(send, 408, str(exc))
            return
        except ClientGone:
            return
        v2: dict[int, V2Item] = {}
        if any(m is not None for m in models):
            parsed, answers, valid = self._parse_mixed(bodies, models, model.n_features, v2)
        else:
            parsed, answers, valid = self._parse_native(bodies, model.n_features)
        version: str | None = None
        if parsed.x is not None:
            x = parsed.x  # the valid items' rows, already stacked in item order
            try:
                result = await self.batcher.submit(x)
            except ModelNotReady as exc:
                await send_error(send, 503, str(exc))
                return
            except Exception:  # the model failed on the batch: find out which items it fails on
                log.exception("model call failed on a coalesced batch of %d items; retrying them one by one",
                              len(valid))
                version = await self._items_alone(valid, answers, t0, v2)
            else:
                version = result.version
                self._answer_items(valid, answers, x, result, time.perf_counter() - t0, v2)
        for i in v2:  # a v2 item refused after its parse (model failure, swap): the protocol's error shape
            answer = answers[i]
            if answer is not None and answer[0] != 200:
                answers[i] = error_item(*answer)
        done = [a for a in answers if a is not None]
        await send_raw(send, 200, batchwire.encode_response(version, done), [(b"content-type", batchwire.CONTENT_TYPE)])
        for status, n in collections.Counter(status for status, _ in done).items():
            self.metrics.requests.inc(str(status), amount=n)
        if version is not None:  # one observation per coalesced call: its items share that latency
            self.metrics.latency.observe(time.perf_counter() - t0)

    def _parse_native(
        self, bodies: list[bytes], n_features: int | None
    ) -> tuple[ParsedBatch, list[tuple[int, bytes] | None], list[tuple[int, PredictRequest]]]:
        """The items of a call of native bodies only -> (parsed, answers with the refusals filled in,
        the valid items with their index)."""
        try:
            parsed = parse_batch(
                bodies, n_features=n_features, max_rows=self.config.max_rows,
                max_body_bytes=self.config.max_body_bytes,
            )
        except Exception:  # e.g. rows of different widths for a model that declares none: item by item
            log.exception("batch parse failed; parsing its items one by one")
            parsed = self._parse_one_by_one(bodies, n_features)
        answers: list[tuple[int, bytes] | None] = []
        valid: list[tuple[int, PredictRequest]] = []
        for i, req in enumerate(parsed.items):
            if isinstance(req, PayloadError):
                answers.append((req.status, _error_body(req.message)))
            else:
                answers.append(None)
                valid.append((i, req))
        return parsed, answers, valid

    def _parse_mixed(
        self, bodies: list[bytes], models: list[batchwire.ItemModel], n_features: int | None, v2: dict[int, V2Item]
    ) -> tuple[ParsedBatch, list[tuple[int, bytes] | None], list[tuple[int, PredictRequest]]]:
        """A call with OIP v2 infer items (batchwire `models`): the native bodies as `_parse_native` does,
        each v2 body as the replica's v2 route would check it (`oip_items.parse_items`), then
        the valid rows of both stacked in item order for the one model call. `v2` gets the checked v2
        items by index."""
        native = [i for i, m in enumerate(models) if m is None]
        _, native_answers, native_valid = self._parse_native([bodies[i] for i in native], n_features)
        answers: list[tuple[int, bytes] | None] = [None] * len(bodies)
        reqs: dict[int, PredictRequest] = {native[j]: req for j, req in native_valid}
        for j, i in enumerate(native):
            answers[i] = native_answers[j]
        cfg, catalog = self.config, self.oip_catalog
        v2_index = [i for i, m in enumerate(models) if m is not None]
        if catalog is None:  # an app built without the protocols (tests): nothing knows the v2 names
            for i in v2_index:
                answers[i] = (404, orjson.dumps({"error": f"unknown model {models[i][0]!r}"}))  # type: ignore[index]
            v2_index = []
        parsed = parse_items([(bodies[i], *models[i]) for i in v2_index], catalog,  # type: ignore[misc, arg-type]
                             n_features=n_features, max_rows=cfg.max_rows, max_body_bytes=cfg.max_body_bytes)
        for i, out in zip(v2_index, parsed):
            if isinstance(out[0], PredictRequest):
                reqs[i], v2[i] = out  # type: ignore[assignment]
            else:
                answers[i] = out  # type: ignore[assignment]
        valid: list[tuple[int, PredictRequest]] = []
        width: int | None = None
        for i in sorted(reqs):
            req = reqs[i]
            width = req.inputs.shape[1] if width is None else width
            if req.inputs.shape[1] != width:  # only for a model that declares no width
                refused = (422, _error_body(f"rows of {req.inputs.shape[1]} features cannot share a model "
                                            f"call with rows of {width}; send this request alone"))
                answers[i] = error_item(*refused) if v2.pop(i, None) is not None else refused
                continue
            valid.append((i, req))
        x = np.concatenate([req.inputs for _, req in valid]) if valid else None
        return ParsedBatch([], x), answers, valid

    def _parse_one_by_one(self, bodies: list[bytes], n_features: int | None) -> ParsedBatch:
        """The items of a call that `parse_batch` could not stack: each parsed alone; the valid ones
        stacked with the first valid item's width, any other width refused on its own (it could only
        share a model call with rows as wide as its own)."""
        items: list[PredictRequest | PayloadError] = []
        width: int | None = None
        for body in bodies:
            try:
                if len(body) > self.config.max_body_bytes:
                    raise PayloadError(413, f"request body of {len(body)} bytes is over the limit of "
                                            f"{self.config.max_body_bytes} bytes")
                req = parse_predict(body, n_features=n_features, max_rows=self.config.max_rows)
            except PayloadError as exc:  # parse_predict turns any surprise into one too
                items.append(exc)
                continue
            width = req.inputs.shape[1] if width is None else width
            if req.inputs.shape[1] != width:
                items.append(PayloadError(422, f"rows of {req.inputs.shape[1]} features cannot share a model "
                                               f"call with rows of {width}; send this request to /predict"))
            else:
                items.append(req)
        kept = [r.inputs for r in items if isinstance(r, PredictRequest)]
        return ParsedBatch(items, np.concatenate(kept) if kept else None)

    async def _items_alone(
        self, valid: list[tuple[int, PredictRequest]], answers: list[tuple[int, bytes] | None], t0: float,
        v2: dict[int, V2Item],
    ) -> str | None:
        """After a failed model call on a whole batch: each valid item alone, so an input the model
        cannot take fails only its own request (500, as on /predict). Returns the version of the items
        answered 200 (a swap between these calls: the later items keep their own version's answer
        only if it is the same one, else they get 503 and the gateway retries them)."""
        version: str | None = None
        failed = 0
        for i, req in valid:
            try:
                result = await self.batcher.submit(req.inputs)
            except ModelNotReady as exc:
                answers[i] = (503, _error_body(str(exc)))
                continue
            except Exception as exc:
                if not failed:  # one traceback per call: a broken model would otherwise log one per item
                    log.exception("model call failed on an item alone")
                failed += 1
                answers[i] = (500, _error_body(f"model call failed: {type(exc).__name__}: {exc}"))
                continue
            if version is not None and result.version != version:
                answers[i] = (503, _error_body("model swapped during this call; send it again"))
                continue
            version = result.version
            self._answer_items([(i, req)], answers, req.inputs, result, time.perf_counter() - t0, v2)
        return version

    def _answer_items(
        self,
        valid: list[tuple[int, PredictRequest]],
        answers: list[tuple[int, bytes] | None],
        x: np.ndarray,
        result: BatchResult,
        latency: float,
        v2: dict[int, V2Item],
    ) -> None:
        """Fill `answers[i]` for each valid item from the one shared model call (rows in item order),
        and queue one Tracker record per item (all of them in one `record_many`: one spool write per
        call, before the answer goes out). Slices the probabilities and converts the rows only for
        items and replicas that use them: this loop runs once per client request. The items in `v2`
        are answered in the Open Inference Protocol's shape (scanflow.serving.oip_items)."""
        version, outputs, probs = result.version, result.outputs, result.probabilities
        if probs is not None and any(req.want_probabilities for _, req in valid):
            probs = as_probabilities(probs)  # row by row, so once for the call, then sliced per item
        rows = x.tolist() if self.sink is not None else None  # one conversion for every record
        records: list[dict[str, object]] = []
        dumps, opt = orjson.dumps, orjson.OPT_SERIALIZE_NUMPY
        start = 0
        for i, req in valid:
            end = start + len(req.inputs)
            out = outputs[start:end]
            request_id = self._new_id()
            doc: dict[str, object] = {"outputs": out, "model_version": version, "request_id": request_id}
            if req.request_id is not None:
                doc["client_request_id"] = req.request_id
            if req.want_probabilities and probs is not None:
                doc["probabilities"] = probs[start:end]
            try:
                item = v2.get(i) if v2 else None
                answers[i] = (200, dumps(doc, option=opt) if item is None else answer_item(doc, item))
            except (TypeError, orjson.JSONEncodeError) as exc:  # this item's own answer only
                answers[i] = (400, _error_body(f"the answer to this request could not be encoded: {exc}"))
                start = end
                continue
            if rows is not None:
                records.append(self._record(req, request_id, rows[start:end], out, version, latency))
            start = end
        if records and self.sink is not None:
            self.sink.record_many(records)

    def _count(self, status: int) -> None:
        self.metrics.requests.inc(str(status))

    def _new_id(self) -> str:
        """A fresh unguessable id (128 random bits, tagged for this service when it has a record key):
        the record's identity at the Tracker, and what clients send feedback by. Not a disclosed prefix
        plus a counter: the next ids of such a scheme can be predicted from one answer."""
        return new_request_id(self.config.record_key)


def _error_body(message: str) -> bytes:
    """Same shape as the /predict error answers ({"detail": ...})."""
    return orjson.dumps({"detail": message})
