"""The inference replica: one process serving one model over HTTP.

Launched by the platforms as
`python -m scanflow.serving.replica --model-uri URI --port P [--host H] [--threads N]
[--max-batch-size 32] [--max-batch-wait-ms 2] [--tracker-url URL] [--service NAME] [--replica-id ID]
[--allow-anonymous] [--cpu-watch-s 5]` (env MLFLOW_TRACKING_URI resolves models:/ URIs, SCANFLOW_TOKEN
guards /admin; SCANFLOW_HOST, SCANFLOW_THREADS, ... are defaults for the flags, see `parse_args`).
Unless `--threads` (or POST /admin/threads) pins it, the thread pool follows the cgroup CPU limit.

Endpoints: POST /predict (raw ASGI hot path, micro-batched), POST /predict_batch (the gateway's
coalesced requests, scanflow.serving.batchwire), GET /health, /ready, /metrics, /info,
POST /admin/model (hot swap), /admin/threads, /admin/drain, /admin/undrain (token).
The standard protocols (Open Inference Protocol v2 under /v2, MLflow's POST /invocations) are mounted
by scanflow.serving.protocols and answered through the same /predict handler. The model loads in a worker
thread after start-up, so /health answers at once and /ready turns 200 when the model is in.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import orjson
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from pydantic import BaseModel, Field, SecretStr

from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S
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
from scanflow.serving.cliargs import REPLICA_PROG, env_value, replica_parser
from scanflow.serving.cpustat import CpuCollector
from scanflow.serving.cpuwatch import CpuLimitReader, threads_for_cores
from scanflow.serving.hotmetrics import HotCounter, HotHistogram
from scanflow.serving.model import LoadedModel, ModelLoadError, as_probabilities, load_model
from scanflow.serving.payload import (
    ParsedBatch,
    PayloadError,
    PredictRequest,
    parse_batch,
    parse_predict,
)
from scanflow.serving.protocols import install_replica
from scanflow.serving.server import LATENCY_BUCKETS, HotPathApp, alive, base_api, run_server
from scanflow.serving.sink import TrackerSink
from scanflow.serving.spool import RecordSpool
from scanflow.tracking.record_ids import SERVICE_RECORD_KEY_ENV, RecordKeyError, new_request_id, parse_key

log = logging.getLogger("scanflow.serving.replica")

__all__ = ["LATENCY_BUCKETS", "Replica", "ReplicaConfig", "create_app", "main", "run_server"]


def available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


@dataclass
class ReplicaConfig:
    model_uri: str
    service: str = "default"
    replica_id: str = field(default_factory=lambda: f"r-{os.getpid()}")
    threads: int | None = None  # starting size; default: from the cgroup CPU limit, else the CPUs we may use
    threads_pinned: bool = False  # True: keep `threads`; False: follow the cgroup CPU limit as it changes
    cpu_watch_s: float = 5.0  # how often the CPU limit is re-read (0: never)
    max_batch_size: int = 32
    max_batch_wait_ms: float = 2.0
    tracker_url: str | None = None
    token: SecretStr | None = None
    allow_anonymous: bool = False
    max_body_bytes: int = 1 << 20
    max_rows: int = 4096
    max_batch_body_bytes: int = 16 << 20  # POST /predict_batch; each item is still held to max_body_bytes
    drain_timeout_s: float = 30.0
    body_timeout_s: float = 10.0  # a request's body must be in within this (408 and close, else)
    # Durable record spool (scanflow.serving.spool), used with a tracker_url; None: records in memory only
    spool_dir: str | None = None
    spool_max_bytes: int = 256 << 20
    spool_fsync_s: float = 1.0
    allow_local_models: bool = False  # POST /admin/model: also file:// and paths (else models:/, runs:/ only)
    # its service's record key (scanflow.tracking.record_ids): request ids the Tracker can tell are this
    # service's; None: plain random ids
    record_key: bytes | None = field(default=None, repr=False)


class _Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # the two updated on every request: plain-int collectors (scanflow.serving.hotmetrics)
        self.latency = HotHistogram(
            "scanflow_replica_request_latency_seconds", "predict latency in the replica", LATENCY_BUCKETS, r
        )
        self.requests = HotCounter("scanflow_replica_requests", "predict requests by status", ["status"], r)
        self.queue_depth = Gauge("scanflow_replica_queue_depth", "requests waiting for a batch", registry=r)
        self.in_flight = Gauge("scanflow_replica_in_flight", "predict requests being handled", registry=r)
        self.batch_size = Histogram(
            "scanflow_replica_batch_size_rows", "rows per model call", registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        )
        self.model_seconds = Histogram(
            "scanflow_replica_model_call_seconds", "time of one batched model call", registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.model_info = Gauge(
            "scanflow_replica_model_info", "1 for the model version being served", ["model_uri", "version"],
            registry=r,
        )
        self.threads = Gauge("scanflow_replica_threads", "torch intra-op threads", registry=r)
        # CPU used, limit, throttling and the node's idle cores, read at scrape time (the Checker's inputs)
        r.register(CpuCollector())
        self.tracker_pending = Gauge("scanflow_replica_tracker_pending_records", "records not yet delivered", registry=r)
        self.tracker_sent = Gauge("scanflow_replica_tracker_sent_records", "records delivered", registry=r)
        self.tracker_failed = Gauge("scanflow_replica_tracker_failed_sends", "failed sends (retried)", registry=r)
        self.tracker_dropped = Gauge(
            "scanflow_replica_tracker_dropped_records", "records refused (buffer full / rejected)", registry=r
        )


class SwapRequest(BaseModel):
    model_uri: str = Field(min_length=1, max_length=1000)


class ThreadsRequest(BaseModel):
    threads: int = Field(ge=1, le=512, strict=True)  # strict: true/false are not thread counts


REGISTRY_SCHEMES = ("models:/", "runs:/")


class Replica:
    """State of one replica and its handlers. Built by `create_app`; tests reach it as `app.replica`."""

    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        self.metrics = _Metrics()
        self.batcher = MicroBatcher(
            max_batch_size=config.max_batch_size,
            max_batch_wait_s=config.max_batch_wait_ms / 1000.0,
            on_batch=self._on_batch,
        )
        spool = (
            RecordSpool(config.spool_dir, max_bytes=config.spool_max_bytes, fsync_interval_s=config.spool_fsync_s)
            if config.tracker_url and config.spool_dir else None
        )
        signer = (config.service, config.record_key) if config.record_key is not None else None
        self.sink = (TrackerSink(config.tracker_url, token=config.token, spool=spool, signer=signer)
                     if config.tracker_url else None)
        self.body_deadlines = BodyDeadlines(config.body_timeout_s)
        self.threads_pinned = config.threads_pinned and config.threads is not None
        self.cpu_reader: CpuLimitReader | None = None
        self._cpu_limit: float | None = None
        if not self.threads_pinned and config.cpu_watch_s > 0:
            self.cpu_reader = CpuLimitReader()
            self._cpu_limit = self.cpu_reader.read()
        self.threads = config.threads or threads_for_cores(self._cpu_limit, len(available_cpus()))
        self._cpu_task: asyncio.Task[None] | None = None
        self.model_uri = config.model_uri
        self.load_error: str | None = None
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._swap_lock: asyncio.Lock | None = None
        self._loader: asyncio.Task[None] | None = None

    # ---- life cycle -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        self._swap_lock = asyncio.Lock()
        self._idle.set()
        self.batcher.start()
        await self._apply_threads(self.threads)
        if self.sink is not None:
            self.sink.start()
        self._loader = asyncio.create_task(self._initial_load())
        if self.cpu_reader is not None:
            self._cpu_task = asyncio.create_task(self._follow_cpu_limit(), name="cpu-limit-watch")
        try:
            yield
        finally:
            self._loader.cancel()
            if self._cpu_task is not None:
                self._cpu_task.cancel()
            await self.batcher.stop()
            if self.sink is not None:
                await self.sink.stop()

    async def _initial_load(self) -> None:
        """Load the first model, retrying with backoff (MLflow may still be starting)."""
        delay = 0.5
        while self.batcher.model is None:
            try:
                model = await asyncio.to_thread(load_model, self.model_uri)
            except ModelLoadError as exc:
                self.load_error = str(exc)
                log.error("model load failed (retry in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            await self._install(model)

    async def _install(self, model: LoadedModel) -> LoadedModel | None:
        old = await self.batcher.swap(model)
        self.load_error = None
        self.model_uri = model.uri
        self.metrics.model_info.clear()
        self.metrics.model_info.labels(model.uri, model.version).set(1)
        log.info("serving %s version %s", model.resolved_uri, model.version)
        return old

    async def _follow_cpu_limit(self) -> None:
        """Every cpu_watch_s: re-read the cgroup CPU limit; when it changed, resize the thread pool.

        Acts on changes only, so a starting SCANFLOW_THREADS stands until the limit actually moves
        (an in-place pod resize, a LocalPlatform quota change); stops once threads get pinned.
        """
        assert self.cpu_reader is not None
        while not self.threads_pinned:
            await asyncio.sleep(self.config.cpu_watch_s)
            try:
                limit = await asyncio.to_thread(self.cpu_reader.read)
            except Exception:  # never let a surprise in /proc take the watch (or the replica) down
                log.exception("reading the cgroup CPU limit failed")
                continue
            if limit == self._cpu_limit or self.threads_pinned:
                continue
            self._cpu_limit = limit
            n = threads_for_cores(limit, len(available_cpus()))
            if n != self.threads:
                log.warning("CPU limit now %s cores: thread pool %d -> %d", limit, self.threads, n)
                await self._apply_threads(n)

    async def _apply_threads(self, n: int) -> None:
        import torch

        torch.set_num_threads(n)
        await self.batcher.run_blocking(torch.set_num_threads, n)  # OpenMP settings are per thread
        self.threads = n
        self.metrics.threads.set(n)

    def _on_batch(self, rows: int, seconds: float) -> None:
        self.metrics.batch_size.observe(rows)
        self.metrics.model_seconds.observe(seconds)

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
            bodies = batchwire.decode_request(
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
        try:
            parsed = parse_batch(
                bodies, n_features=model.n_features, max_rows=self.config.max_rows,
                max_body_bytes=self.config.max_body_bytes,
            )
        except Exception:  # e.g. rows of different widths for a model that declares none: item by item
            log.exception("batch parse failed; parsing its items one by one")
            parsed = self._parse_one_by_one(bodies, model.n_features)
        answers: list[tuple[int, bytes] | None] = []
        valid: list[tuple[int, PredictRequest]] = []
        for i, req in enumerate(parsed.items):
            if isinstance(req, PayloadError):
                answers.append((req.status, _error_body(req.message)))
            else:
                answers.append(None)
                valid.append((i, req))
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
                version = await self._items_alone(valid, answers, t0)
            else:
                version = result.version
                self._answer_items(valid, answers, x, result, time.perf_counter() - t0)
        done = [a for a in answers if a is not None]
        await send_raw(send, 200, batchwire.encode_response(version, done), [(b"content-type", batchwire.CONTENT_TYPE)])
        for status, n in collections.Counter(status for status, _ in done).items():
            self.metrics.requests.inc(str(status), amount=n)
        if version is not None:  # one observation per coalesced call: its items share that latency
            self.metrics.latency.observe(time.perf_counter() - t0)

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
        self, valid: list[tuple[int, PredictRequest]], answers: list[tuple[int, bytes] | None], t0: float
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
            self._answer_items([(i, req)], answers, req.inputs, result, time.perf_counter() - t0)
        return version

    def _answer_items(
        self,
        valid: list[tuple[int, PredictRequest]],
        answers: list[tuple[int, bytes] | None],
        x: np.ndarray,
        result: BatchResult,
        latency: float,
    ) -> None:
        """Fill `answers[i]` for each valid item from the one shared model call (rows in item order),
        and queue one Tracker record per item (all of them in one `record_many`: one spool write per
        call, before the answer goes out). Slices the probabilities and converts the rows only for
        items and replicas that use them: this loop runs once per client request."""
        version, outputs, probs = result.version, result.outputs, result.probabilities
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
                doc["probabilities"] = as_probabilities(probs[start:end])
            try:
                answers[i] = (200, dumps(doc, option=opt))
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

    # ---- admin ------------------------------------------------------------------------------
    async def swap_model(self, uri: str) -> dict[str, object]:
        """Hot swap to `uri`. Only registry and run URIs unless the replica was started with
        --allow-local-models: a token holder could otherwise make the replica unpickle any file it can
        read (an MLflow model is code)."""
        if not self.config.allow_local_models and not uri.startswith(REGISTRY_SCHEMES):
            raise HTTPException(422, f"model_uri must be a registry or run URI ({', '.join(REGISTRY_SCHEMES)}...); "
                                     "local paths and file:// need the replica's --allow-local-models")
        assert self._swap_lock is not None
        async with self._swap_lock:
            try:
                model = await asyncio.to_thread(load_model, uri)
            except ModelLoadError as exc:
                raise HTTPException(422, str(exc)) from None
            old = await self._install(model)
        return {"model_uri": uri, "model_version": model.version, "previous_version": old.version if old else None}

    async def drain(self) -> dict[str, object]:
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.drain_timeout_s)
        except TimeoutError:
            return {"drained": False, "in_flight": self.in_flight}
        return {"drained": True, "in_flight": self.in_flight}

    def undrain(self) -> dict[str, object]:
        """The way back from a drain (a drain the operator did not mean, or a scale-down undone): take
        requests again; /ready follows at once, so the gateways' next health round brings it back."""
        was = self.draining
        self.draining = False
        return {"draining": False, "was_draining": was}

    def info(self) -> dict[str, object]:
        model = self.batcher.model
        return {
            "pid": os.getpid(),
            "service": self.config.service,
            "replica_id": self.config.replica_id,
            "model_uri": self.model_uri,
            "model_version": model.version if model else None,
            "n_features": model.n_features if model else None,
            "threads": self.threads,
            "threads_pinned": self.threads_pinned,
            "cpu_limit": self._cpu_limit,
            "cpus": available_cpus(),
            "max_batch_size": self.batcher.max_batch_size,
            "max_batch_wait_ms": self.batcher.max_batch_wait_s * 1000.0,
            "draining": self.draining,
            "load_error": self.load_error,
            "spool": self._spool_info(),
            "tracker_pending": self.sink.pending if self.sink is not None else None,  # records not yet delivered
        }

    def _spool_info(self) -> dict[str, object] | None:
        spool = self.sink.spool if self.sink is not None else None
        if spool is None:
            return None
        st = spool.stats
        return {"dir": str(spool.dir), "bytes": spool.size_bytes, "max_bytes": spool.max_bytes, "written": st.written,
                "replayed": st.replayed, "refused_full": st.refused_full, "write_errors": st.write_errors,
                "fsyncs": st.fsyncs, "fsync_seconds": round(st.fsync_seconds, 6),
                "fsync_interval_s": spool.fsync_interval_s}

    def render_metrics(self) -> bytes:
        m = self.metrics
        m.queue_depth.set(self.batcher.queue_depth)
        m.in_flight.set(self.in_flight)
        if self.sink is not None:
            s = self.sink.stats
            m.tracker_pending.set(self.sink.pending)
            m.tracker_sent.set(s.sent)
            m.tracker_failed.set(s.failed_sends)
            m.tracker_dropped.set(s.dropped)
        return generate_latest(m.registry)


def _error_body(message: str) -> bytes:
    """Same shape as the /predict error answers ({"detail": ...})."""
    return orjson.dumps({"detail": message})


class ReplicaApp(HotPathApp):
    """ASGI entry: POST /predict and /predict_batch go straight to the hot path, the rest to FastAPI."""

    def __init__(self, replica: Replica, api: FastAPI) -> None:
        super().__init__({"/predict": replica.predict, "/predict_batch": replica.predict_batch}, api)
        self.replica = replica


def create_app(config: ReplicaConfig) -> ReplicaApp:
    replica = Replica(config)
    api, admin = base_api(f"scanflow replica {config.service}/{config.replica_id}", replica.lifespan,
                          replica.render_metrics, alive(), config.token, config.allow_anonymous)

    @api.get("/ready")
    async def ready() -> JSONResponse:
        model = replica.batcher.model
        if replica.draining:
            return JSONResponse({"ready": False, "reason": "draining"}, status_code=503)
        if model is None:
            return JSONResponse(
                {"ready": False, "reason": replica.load_error or "model loading"}, status_code=503
            )
        return JSONResponse({"ready": True, "model_version": model.version})

    @api.get("/info")
    async def info() -> dict[str, object]:
        return replica.info()

    @api.post("/admin/model", dependencies=admin)
    async def swap(body: SwapRequest) -> dict[str, object]:
        return await replica.swap_model(body.model_uri)

    @api.post("/admin/threads", dependencies=admin)
    async def threads(body: ThreadsRequest) -> dict[str, object]:
        replica.threads_pinned = True  # an explicit size wins over the CPU-limit watch
        await replica._apply_threads(body.threads)
        return {"threads": replica.threads, "cpus": available_cpus()}

    @api.post("/admin/drain", dependencies=admin)
    async def drain() -> dict[str, object]:
        return await replica.drain()

    @api.post("/admin/undrain", dependencies=admin)
    async def undrain() -> dict[str, object]:
        return replica.undrain()

    install_replica(api, replica)  # OIP v2, MLflow /invocations, the OpenAPI document
    return ReplicaApp(replica, api)


def parse_args(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
               prog: str = REPLICA_PROG) -> argparse.Namespace:
    """Flags, with env defaults (flags win): SCANFLOW_MODEL_URI, SCANFLOW_PORT, SCANFLOW_HOST,
    SCANFLOW_THREADS, SCANFLOW_SERVICE, SCANFLOW_MAX_BATCH_SIZE, SCANFLOW_MAX_BATCH_WAIT_MS,
    SCANFLOW_TRACKER_URL, SCANFLOW_LOG_LEVEL, SCANFLOW_SPOOL_DIR. `prog` names the command in errors.

    `--threads N` pins the thread pool; SCANFLOW_THREADS only sets its starting size, and the replica
    still follows later changes of its cgroup CPU limit (an in-place pod resize changes no env).
    `args.threads_pinned` says which.
    """
    env = os.environ if env is None else env
    p = replica_parser(prog)
    args = p.parse_args(argv)
    args.threads_pinned = args.threads is not None
    if args.model_uri is None:
        args.model_uri = env.get("SCANFLOW_MODEL_URI", "").strip() or None
    if args.model_uri is None:
        p.error("--model-uri (or SCANFLOW_MODEL_URI) is required")
    if args.port is None:
        args.port = env_value(p, env, "SCANFLOW_PORT", int)
    if args.port is None:
        p.error("--port (or SCANFLOW_PORT) is required")
    args.host = args.host or env.get("SCANFLOW_HOST", "").strip() or "127.0.0.1"
    if args.threads is None:
        args.threads = env_value(p, env, "SCANFLOW_THREADS", int)
    if args.max_batch_size is None:
        args.max_batch_size = env_value(p, env, "SCANFLOW_MAX_BATCH_SIZE", int) or 32
    if args.max_batch_wait_ms is None:
        wait = env_value(p, env, "SCANFLOW_MAX_BATCH_WAIT_MS", float)
        args.max_batch_wait_ms = 2.0 if wait is None else wait
    args.tracker_url = args.tracker_url or env.get("SCANFLOW_TRACKER_URL", "").strip() or None
    args.service = args.service or env.get("SCANFLOW_SERVICE", "").strip() or "default"
    args.log_level = args.log_level or env.get("SCANFLOW_LOG_LEVEL", "").strip() or "INFO"
    if args.threads is not None and args.threads < 1:
        p.error("--threads / SCANFLOW_THREADS must be >= 1")
    if args.max_batch_size < 1 or args.max_batch_wait_ms < 0 or args.cpu_watch_s < 0:
        p.error("--max-batch-size must be >= 1, --max-batch-wait-ms and --cpu-watch-s >= 0")
    if args.head_timeout_s is None:
        head = env_value(p, env, "SCANFLOW_HEAD_TIMEOUT_S", float)
        args.head_timeout_s = DEFAULT_HEAD_TIMEOUT_S if head is None else head
    if args.body_timeout_s <= 0 or args.head_timeout_s <= 0 or args.spool_max_mb <= 0 or args.spool_fsync_s <= 0:
        p.error("--body-timeout-s, --head-timeout-s, --spool-max-mb and --spool-fsync-s must be > 0")
    spool = args.spool_dir or env.get("SCANFLOW_SPOOL_DIR", "").strip() or None
    if spool is None:  # stable across restarts of the same replica: its id, else its service and port
        spool = os.path.join("scanflow-spool", args.replica_id or f"{args.service}-{args.port}")
    args.spool_dir = None if spool.lower() == "none" or not args.tracker_url else spool
    key = env.get(SERVICE_RECORD_KEY_ENV, "").strip()
    try:
        args.record_key = parse_key(key, SERVICE_RECORD_KEY_ENV) if key else None
    except RecordKeyError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None, prog: str = REPLICA_PROG) -> None:
    """Parse the flags and serve until stopped. Who calls: `python -m` (the platforms' command lines)
    and `scanflow serve replica` (with its own `prog`)."""
    from scanflow.settings import Settings

    args = parse_args(argv, prog=prog)
    settings = Settings()
    config = ReplicaConfig(
        model_uri=args.model_uri,
        service=args.service,
        replica_id=args.replica_id or f"{args.service}-{os.getpid()}",
        threads=args.threads,
        threads_pinned=args.threads_pinned,
        cpu_watch_s=args.cpu_watch_s,
        max_batch_size=args.max_batch_size,
        max_batch_wait_ms=args.max_batch_wait_ms,
        tracker_url=args.tracker_url,
        token=settings.token,
        allow_anonymous=args.allow_anonymous,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        spool_dir=args.spool_dir,
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)),
        spool_fsync_s=args.spool_fsync_s,
        allow_local_models=args.allow_local_models,
        record_key=args.record_key,
    )
    run_server(create_app(config), args.host, args.port, args.log_level, head_timeout_s=args.head_timeout_s)


if __name__ == "__main__":
    main()
