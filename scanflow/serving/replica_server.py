"""The inference replica's server: one process serving one model over HTTP (its state and its app).

Endpoints: POST /predict (raw ASGI hot path, micro-batched), POST /predict_batch (the gateway's
coalesced requests, OIP v2 infer items among them: scanflow.serving.batchwire), GET /health, /ready, /metrics, /info,
POST /admin/model (hot swap), /admin/threads, /admin/drain, /admin/undrain (token).
The standard protocols (Open Inference Protocol v2 under /v2, MLflow's POST /invocations) are mounted
by scanflow.serving.protocols and answered through the same /predict handler. The model loads in a worker
thread after start-up, so /health answers at once and /ready turns 200 when the model is in.
Unless `threads_pinned` (or POST /admin/threads) pins it, the thread pool follows the cgroup CPU limit.

Separate from scanflow.serving.replica, the command line the platforms start (`python -m
scanflow.serving.replica`), so tests and benchmarks build the app without it; the POST handlers
themselves are scanflow.serving.replica_hotpath.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field, SecretStr

from scanflow.serving.asgi import BodyDeadlines
from scanflow.serving.batching import MicroBatcher
from scanflow.serving.cpustat import CpuCollector
from scanflow.serving.cpuwatch import CpuLimitReader, threads_for_cores
from scanflow.serving.hotmetrics import HotCounter, HotHistogram
from scanflow.serving.model import LoadedModel, ModelLoadError, load_model
from scanflow.serving.protocols import install_replica
from scanflow.serving.replica_hotpath import ReplicaHotPath
from scanflow.serving.server import LATENCY_BUCKETS, HotPathApp, alive, base_api
from scanflow.serving.sink import SinkStats, TrackerSink
from scanflow.serving.spool import RecordSpool

log = logging.getLogger("scanflow.serving.replica")

__all__ = ["Replica", "ReplicaApp", "ReplicaConfig", "create_app"]


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
        # cumulative since the replica started: counters (rate() and increase() apply), read from the sink
        self.tracker_counts = _SinkCounts()
        r.register(self.tracker_counts)


class _SinkCounts(Collector):
    """The prediction sink's cumulative counts as Prometheus counters, read when scraped (the sink keeps
    them; a counter can only be read here, never set)."""

    FAMILIES = (("scanflow_replica_tracker_sent_records", "records delivered to the Tracker", "sent"),
                ("scanflow_replica_tracker_failed_sends", "failed sends to the Tracker (retried)", "failed_sends"),
                ("scanflow_replica_tracker_dropped_records", "records refused (buffer full / rejected)", "dropped"))

    def __init__(self) -> None:
        self.stats: SinkStats | None = None  # the sink's, once there is a sink

    def collect(self) -> Iterator[CounterMetricFamily]:
        if self.stats is None:
            return
        for name, doc, attr in self.FAMILIES:
            yield CounterMetricFamily(name, doc, value=float(getattr(self.stats, attr)))


class SwapRequest(BaseModel):
    model_uri: str = Field(min_length=1, max_length=1000)


class ThreadsRequest(BaseModel):
    threads: int = Field(ge=1, le=512, strict=True)  # strict: true/false are not thread counts


REGISTRY_SCHEMES = ("models:/", "runs:/")


class Replica(ReplicaHotPath):
    """State of one replica and its handlers (the POST ones: `ReplicaHotPath`). Built by `create_app`; tests reach it as `app.replica`."""

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
            m.tracker_pending.set(self.sink.pending)
            m.tracker_counts.stats = self.sink.stats
        return generate_latest(m.registry)


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
