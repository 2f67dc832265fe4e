"""Dynamic micro-batching: concurrent requests share one model call.

Who calls: the replica's predict handler (`await batcher.submit(x)`), its admin endpoints (`swap`,
`set_threads`) and its lifespan (`start`/`stop`). A single background coroutine collects queued
requests until `max_batch_size` rows are waiting or `max_batch_wait_s` has passed since the first
(that wait only while batches are being shared, so a lone client pays no added latency), stacks them and
runs the model once in the model thread (`ModelThread`, never on the event loop). Model calls
are serialised, so a swap takes effect exactly between two batches: every response is computed by
exactly one model version, and versions change once, monotonically.
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from scanflow.serving.model import LoadedModel


@dataclass(frozen=True, slots=True)
class BatchResult:
    outputs: list
    probabilities: np.ndarray | None
    version: str


_Call = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], collections.abc.Callable[..., Any], tuple[Any, ...]]


class ModelThread:
    """One daemon thread that runs blocking calls (torch) off the event loop, one at a time, in order.

    Why not `loop.run_in_executor` on a one-worker ThreadPoolExecutor: each hop there costs ~50 us of
    CPU on this machine (locks, a concurrent Future with its Condition, the future chaining), as much as
    the model itself on a batch of 26 rows (~65 us). Here a call is one SimpleQueue put and one
    `call_soon_threadsafe` back: ~17 us (docs/benchmarks/serving.md, fifth pass). Same promise: the call runs in
    this thread, never on the loop; the awaiting coroutine gets its result or its exception. A call whose
    awaiter was cancelled still runs (as an executor's running call would) and its result is dropped.
    """

    def __init__(self, name: str = "scanflow-model") -> None:
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: collections.abc.Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue fn(*args); the returned future (of the running loop) settles with its outcome."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            fut.set_exception(ModelNotReady("replica is shutting down"))
        else:
            self._queue.put((loop, fut, fn, args))
        return fut

    def shutdown(self) -> None:
        """Calls queued from now on fail; the thread ends after the call it is running (no wait)."""
        self._closed = True
        self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, fut, fn, args = item
            ok = not self._closed
            try:
                result = fn(*args) if ok else ModelNotReady("replica is shutting down")
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as an executor would
                result, ok = (exc if not isinstance(exc, StopIteration) else RuntimeError(repr(exc))), False
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, result)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass


def _settle(fut: asyncio.Future[Any], ok: bool, result: Any) -> None:
    if fut.done():  # the awaiter was cancelled
        return
    if ok:
        fut.set_result(result)
    else:
        fut.set_exception(result)


@dataclass(slots=True)
class _Pending:
    x: np.ndarray
    future: asyncio.Future[BatchResult]


class ModelNotReady(RuntimeError):
    """No model is loaded yet (or it failed to load): answer 503."""


class MicroBatcher:
    def __init__(
        self,
        *,
        max_batch_size: int = 32,
        max_batch_wait_s: float = 0.002,
        on_batch: collections.abc.Callable[[int, float], None] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_batch_wait_s < 0:
            raise ValueError("max_batch_wait_s must be >= 0")
        self.max_batch_size = max_batch_size
        self.max_batch_wait_s = max_batch_wait_s
        self.model: LoadedModel | None = None
        self._on_batch = on_batch
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_rows = 0
        self._wake: asyncio.Future[None] | None = None
        self._model_thread = ModelThread("scanflow-model")
        self._model_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # the last batch had more than one request

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task  # its own cancellation: expected
        for p in self._queue:
            if not p.future.done():
                p.future.set_exception(ModelNotReady("replica is shutting down"))
        self._queue.clear()
        self._model_thread.shutdown()

    async def submit(self, x: np.ndarray) -> BatchResult:
        if self.model is None:
            raise ModelNotReady("model not loaded yet")
        fut: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(x, fut))
        self._queued_rows += len(x)
        wake = self._wake
        if wake is not None and not wake.done() and (
            self._queued_rows >= self.max_batch_size or len(self._queue) == 1
        ):
            wake.set_result(None)
        return await fut

    async def swap(self, model: LoadedModel) -> LoadedModel | None:
        """Install `model` between two batches; returns the old one once no batch uses it any more."""
        async with self._model_lock:
            old, self.model = self.model, model
        return old

    async def run_blocking(self, fn: collections.abc.Callable[..., object], *args: object) -> object:
        """Run fn in the model thread (e.g. torch.set_num_threads, which is per thread for OpenMP)."""
        return await self._model_thread.call(fn, *args)

    async def _wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        handle = loop.call_later(timeout, _resolve, self._wake) if timeout is not None else None
        try:
            await self._wake
        finally:
            self._wake = None
            if handle is not None:
                handle.cancel()

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        rows = 0
        while self._queue and (not batch or rows + len(self._queue[0].x) <= self.max_batch_size):
            p = self._queue.popleft()
            rows += len(p.x)
            batch.append(p)
        self._queued_rows -= rows
        return batch

    async def _run(self) -> None:
        while True:
            if not self._queue:
                await self._wait(None)
            if self._queued_rows < self.max_batch_size:
                await asyncio.sleep(0)  # one loop turn: requests already read off sockets join this batch
            if self.max_batch_wait_s > 0 and self._queued_rows < self.max_batch_size and self._busy:
                # Wait for company only under load (the last batch was shared): a lone client never
                # pays max_batch_wait for a batch that would stay at one request.
                await self._wait(self.max_batch_wait_s)
            batch = [p for p in self._take() if not p.future.cancelled()]
            self._busy = len(batch) > 1
            if not batch:
                continue
            x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch])
            async with self._model_lock:
                model = self.model
                if model is None:
                    for p in batch:
                        p.future.set_exception(ModelNotReady("model not loaded"))
                    continue
                t0 = time.perf_counter()
                try:
                    outputs, probs = await self._model_thread.call(model.predict, x)
                except Exception as exc:  # noqa: BLE001 - the model failed on valid input: each caller gets it
                    for p in batch:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
            if self._on_batch is not None:
                self._on_batch(len(x), time.perf_counter() - t0)
            start = 0
            for p in batch:
                n = len(p.x)
                if not p.future.done():
                    p.future.set_result(
                        BatchResult(
                            outputs[start : start + n],
                            None if probs is None else probs[start : start + n],
                            model.version,
                        )
                    )
                start += n


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
