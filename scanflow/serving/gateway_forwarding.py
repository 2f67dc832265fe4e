"""How the gateway's client bodies reach the replicas: each alone (`_forward`), or coalesced with its
neighbours into one POST /predict_batch (`enqueue`, `_dispatch`, `_send_batch`), over the gateway's
connection pools (`_post`).

Separate from scanflow.serving.gateway_server, which decides where a request goes (healthy replicas,
retries, failover to the backup) and keeps the replica set current; this module only makes the calls
and turns their answers and failures into outcomes. `Gateway` takes it in as a mixin (`Forwarding`), so
it reads the routing state as `self`. Who calls: the gateway's `predict` and `forward_with_retries`,
scanflow.serving.fastfront (`enqueue_cb`, `fast_path_open`, `fast_body_limit`) and
scanflow.serving.protocols (`_forward`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING

import aiohttp

from scanflow.serving import batchwire
from scanflow.serving.batchwire import ItemModel
from scanflow.serving.challenger import MAX_MIRRORS_IN_FLIGHT, Challenger, mirror_body, same_outputs
from scanflow.serving.outcomes import NO_ANSWER, RETRY_STATUSES, Outcome
from scanflow.serving.routing import RouteMode, Upstream, can_batch, pick_for_batch
from scanflow.serving.upstream import UpstreamError, UpstreamPool

if TYPE_CHECKING:
    from scanflow.serving.gateway_server import GatewayConfig, _Metrics

log = logging.getLogger("scanflow.serving.gateway")


def _settle(done: Callable[[Outcome], None], outcome: Outcome) -> None:
    """Hand one queued request its outcome; a callback that raises must not fail its batch's others."""
    try:
        done(outcome)
    except Exception:
        log.exception("a coalesced request's completion callback failed")


class Forwarding:
    """The upstream calls of `scanflow.serving.gateway_server.Gateway` (a mixin: the attributes below are
    the gateway's, set by its `__init__`; the coalescing state is set here)."""

    config: GatewayConfig
    metrics: _Metrics
    mode: RouteMode
    replicas: tuple[Upstream, ...]
    counts: dict[str, int]
    _tick: int
    _pools: dict[str, UpstreamPool]
    _session: aiohttp.ClientSession | None
    challenger: Challenger | None

    def __init__(self) -> None:
        # coalescing state: client requests waiting for an upstream call, batches in flight per replica
        self._waiting: collections.deque[tuple[bytes, Callable[[Outcome], None], ItemModel]] = collections.deque()
        self._batches_in_flight: dict[str, int] = {}
        self._no_batch: set[str] = set()  # replicas that answered 404/405 to /predict_batch (older ones)
        self._dispatch_scheduled = False
        self._batch_tasks: set[asyncio.Task[None]] = set()

    # ---- coalescing -------------------------------------------------------------------------
    @property
    def fast_body_limit(self) -> int:
        """The largest body scanflow.serving.fastfront answers in place (bigger ones take the ASGI path)."""
        return min(self.config.coalesce_item_bytes, self.config.max_body_bytes)

    def fast_path_open(self) -> bool:
        """Requests may be coalesced now (scanflow.serving.fastfront asks before taking one)."""
        return self.config.coalesce_max > 1 and self.mode != "backup" and can_batch(self.replicas, self._no_batch)

    def _coalescable(self, body: bytes) -> bool:
        return (
            self.config.coalesce_max > 1
            and len(body) <= self.config.coalesce_item_bytes
            and self.mode != "backup"
            and can_batch(self.replicas, self._no_batch)
        )

    async def _coalesced(self, body: bytes) -> Outcome:
        """Queue one client body to share an upstream call (POST /predict_batch) with its neighbours.

        Why: a replica answering one HTTP request per client request spends most of its CPU on HTTP
        and JSON, not on the model; one call per batch divides that by the batch size. There is no
        timer: a request is sent at once when a replica has a free batch slot (a lone client waits for
        nothing), and requests arriving while every slot is busy leave together when one frees up.
        """
        return await self.enqueue(body)

    def enqueue(self, body: bytes) -> asyncio.Future[Outcome]:
        """Queue `body` for the next coalesced call; the future gets its outcome (see `_coalesced`)."""
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def done(outcome: Outcome) -> None:
            if not fut.done():  # the client went away: its request was cancelled
                fut.set_result(outcome)

        self.enqueue_cb(body, done)
        return fut

    def enqueue_cb(self, body: bytes, done: Callable[[Outcome], None], model: ItemModel = None) -> None:
        """Queue `body` for the next coalesced call; `done(outcome)` is called once with its outcome, in
        the loop turn the call's answer arrives (no Future, no extra turn: scanflow.serving.fastfront
        writes the client's answer from it). `done` must not raise; an exception is logged and dropped.
        `model`: (name, version) when `body` is an OIP v2 infer request for that model (the replica's
        /predict_batch then answers it in the protocol's shape), None for a /predict body.
        With a challenger set (scanflow.serving.challenger), a native body may be the canary's to answer,
        or mirrored to the shadow once the champion answered it."""
        ch = self.challenger
        if ch is not None and model is None and ch.up.healthy:
            if ch.answers(body):
                self._spawn(self._canary_call(ch, body, done))
                return
            done = self._champion_answers(ch, body, done)
        self._waiting.append((body, done, model))
        self._schedule_dispatch()

    # ---- a challenger (canary, shadow) ------------------------------------------------------
    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._batch_tasks.add(task)  # cancelled with the batches at shutdown
        task.add_done_callback(self._batch_tasks.discard)

    async def challenger_outcome(self, body: bytes) -> Outcome:
        """The canary's answer to `body` when the request is the challenger's and it answered, else None
        (the champion's replicas answer). For callers that do not coalesce (the ASGI path)."""
        ch = self.challenger
        if ch is None or not ch.up.healthy or not ch.answers(body):
            return None
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        await self._canary_call(ch, body, fut.set_result)
        return fut.result()

    async def _canary_call(self, ch: Challenger, body: bytes, done: Callable[[Outcome], None]) -> None:
        """The challenger answers one client request; when it cannot (no answer, 5xx) the outcome is None,
        so the request is forwarded to the champion's replicas, and the failure counts against it."""
        t0 = time.perf_counter()
        try:
            result = await self._forward(ch.up, body)
        except Exception as exc:  # noqa: BLE001 - whatever the challenger did, the champion answers the client
            log.warning("challenger %s failed a request: %s: %s", ch.up.url, type(exc).__name__, exc)
            result = None
        except BaseException:  # cancelled (shutdown): the client's request is not left unanswered
            _settle(done, None)
            raise
        if ch.record(result[0] if result is not None else None, time.perf_counter() - t0):
            assert result is not None
            ch.answered += 1
            _settle(done, (result[0], result[1], result[2], ch.up))
        else:
            _settle(done, None)

    def _champion_answers(self, ch: Challenger, body: bytes, done: Callable[[Outcome], None]) -> Callable[[Outcome], None]:
        """`done`, also timing the champion's answer (the challenger's p99 is held against the champion's on
        this gateway, timed the same way) and, in shadow, mirroring it."""
        t0 = time.perf_counter()

        def answered(outcome: Outcome) -> None:
            done(outcome)
            if outcome is not None and outcome[0] == 200:
                ch.champion_latencies.append(time.perf_counter() - t0)
                if ch.mode == "shadow" and ch.mirrors():
                    self.mirror(ch, body, outcome[1])
        return answered

    def mirror(self, ch: Challenger, body: bytes, champion_answer: bytes) -> None:
        """Send the shadow its copy of an answered request, unless too many are in flight (dropped and
        counted: the client never waits for the shadow)."""
        mbody = mirror_body(body, champion_answer) if ch.in_flight < MAX_MIRRORS_IN_FLIGHT and ch.up.healthy else None
        if mbody is None:
            ch.dropped += 1
            return
        ch.in_flight += 1
        self._spawn(self._shadow_call(ch, mbody, champion_answer))

    async def _shadow_call(self, ch: Challenger, body: bytes, champion_answer: bytes) -> None:
        t0 = time.perf_counter()
        try:
            result = await self._forward(ch.up, body)
        except Exception as exc:  # noqa: BLE001 - a mirror's failure is the challenger's, never a client's
            log.warning("challenger %s failed a mirrored request: %s: %s", ch.up.url, type(exc).__name__, exc)
            result = None
        finally:
            ch.in_flight -= 1
        if ch.record(result[0] if result is not None else None, time.perf_counter() - t0):
            assert result is not None
            ch.mirrored += 1
            agree = same_outputs(champion_answer, result[1]) if result[0] == 200 else None
            if agree is not None:
                ch.compared += 1
                ch.agreed += agree

    def _schedule_dispatch(self) -> None:
        # One loop turn later, so requests already read off the sockets in this turn join the batch.
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        cfg = self.config
        while self._waiting:
            self._tick += 1
            up = pick_for_batch(self.replicas, self._batches_in_flight, cfg.batches_per_replica, self._no_batch, self._tick)
            if up is None:
                if self.mode == "backup" or not can_batch(self.replicas, self._no_batch):
                    while self._waiting:  # nobody can take batches any more: forward them one by one
                        _, done, _ = self._waiting.popleft()
                        _settle(done, None)
                return  # every slot busy: the next finished batch dispatches again
            items: list[tuple[bytes, Callable[[Outcome], None], ItemModel]] = []
            size = 0
            while self._waiting and len(items) < cfg.coalesce_max:
                item = self._waiting[0]
                if items and size + len(item[0]) > cfg.coalesce_max_bytes:
                    break
                self._waiting.popleft()
                items.append(item)
                size += len(item[0])
            if items:
                task = asyncio.get_running_loop().create_task(self._send_batch(up, items))
                self._batch_tasks.add(task)
                task.add_done_callback(self._batch_tasks.discard)

    async def _send_batch(self, up: Upstream, items: list[tuple[bytes, Callable[[Outcome], None], ItemModel]]) -> None:
        """One POST /predict_batch (framed with `models` when some item is an OIP v2 request: a replica
        from before that refuses the call, and its items go one by one); every item's callback gets its
        own answer (never raises)."""
        n = len(items)
        self._batches_in_flight[up.url] = self._batches_in_flight.get(up.url, 0) + 1
        self.counts["coalesced_calls"] += 1
        self.counts["coalesced_requests"] += n
        up.outstanding += n
        up.requests += n
        results: list[Outcome]
        try:
            models = [m for _, _, m in items]
            bodies = [b for b, _, _ in items]
            call = batchwire.encode_request(bodies, models if any(m is not None for m in models) else None)
            status, payload, ctype = await self._post(up.url, call, b"/predict_batch")
            if status == 200 and ctype.startswith(batchwire.CONTENT_TYPE):
                results = [(s, b, b"application/json", up) for s, b in batchwire.decode_response(payload, n)]
            elif status in (404, 405):  # a replica without /predict_batch: forward to it one by one
                self._no_batch.add(up.url)
                log.warning("%s has no /predict_batch; forwarding requests to it one by one", up.url)
                results = [None] * n
            elif status in RETRY_STATUSES:
                up.errors += 1
                self.metrics.upstream_errors.labels(f"http_{status}").inc()
                self.counts["upstream_errors"] += 1
                results = [(status, payload, ctype, up)] * n
            else:
                # Any other answer to the whole call (400, 413, a 500 from a replica that failed on the
                # call) is about the call, not about any one request: copying it to every item would
                # fail the good requests with the bad one. Each is forwarded alone instead, and gets
                # its own answer.
                self.counts["coalesced_refused"] += 1
                log.warning("%s answered %d to a coalesced call of %d requests; forwarding them one by one: %s",
                            up.url, status, n, payload[:200])
                results = [None] * n
        except (UpstreamError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, batchwire.BatchWireError) as exc:
            self._mark_dead(up, exc)
            results = [(NO_ANSWER, b"", b"application/json", up)] * n
        except TimeoutError:
            self._mark_timeout(up)
            results = [(504, b'{"detail": "upstream replica timed out"}', b"application/json", up)] * n
        except BaseException:
            results = [(NO_ANSWER, b"", b"application/json", up)] * n
            raise
        finally:
            up.outstanding -= n
            self._batches_in_flight[up.url] -= 1
            if self._waiting:
                self._schedule_dispatch()
        for (_, done, _), result in zip(items, results, strict=True):
            _settle(done, result)

    def _mark_dead(self, up: Upstream, exc: BaseException) -> None:
        """Dead or dying replica: take it out now rather than at the next health round."""
        up.healthy = False
        up.errors += 1
        up.last_error = f"{type(exc).__name__}: {exc}"
        self.metrics.upstream_errors.labels("connection").inc()
        self.counts["upstream_errors"] += 1

    def _mark_timeout(self, up: Upstream) -> None:
        up.errors += 1
        up.last_error = "timeout"
        self.metrics.upstream_errors.labels("timeout").inc()
        self.counts["upstream_errors"] += 1

    async def _forward(self, up: Upstream, body: bytes, path: bytes = b"/predict") -> tuple[int, bytes, bytes] | None:
        """One attempt; None when the upstream could not answer (dead, reset, refused)."""
        up.outstanding += 1
        up.requests += 1
        try:
            status, payload, ctype = await self._post(up.url, body, path)
        except (UpstreamError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            self._mark_dead(up, exc)
            return None
        except TimeoutError:
            self._mark_timeout(up)
            return 504, b'{"detail": "upstream replica timed out"}', b"application/json"
        finally:
            up.outstanding -= 1
        if status in RETRY_STATUSES:
            up.errors += 1
            self.metrics.upstream_errors.labels(f"http_{status}").inc()
            self.counts["upstream_errors"] += 1
        return status, payload, ctype

    async def _post(self, url: str, body: bytes, path: bytes = b"/predict") -> tuple[int, bytes, bytes]:
        """Plain http goes through the lean pool; https through aiohttp."""
        if url.startswith("http://"):
            pool = self._pools.get(url)
            if pool is None:
                pool = self._pools[url] = UpstreamPool(url)
            ctype = batchwire.CONTENT_TYPE if path == b"/predict_batch" else b"application/json"
            return await pool.post(path, body, self.config.upstream_timeout_s, ctype)
        assert self._session is not None
        async with self._session.post(url + path.decode(), data=body, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.read(), r.headers.get("Content-Type", "application/json").encode()
