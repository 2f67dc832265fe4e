"""The agent loop: inbox -> engine -> actions, plus the sensors on their intervals. Thin by design.

The loop learns of new events from the inbox writer (Store.listen_inbox: committed events, in id
order, handed over in memory), and reads the inbox table only at start, after an error, when the
in-memory queue overflowed, and once per idle second as a safety net; `cursor` (the last event
processed) makes both sources agree. For each pending event, in arrival order:
1. If the store already holds its decisions (the agent was killed after deciding), reuse their
   intents; otherwise run the pure engine and write decisions + new strategy states in one go.
2. Execute the intents in order. Before each, look up its idempotency key: succeeded or failed ->
   skip (never twice); started but not finished (killed mid-way) -> run again with the same key.
   Handlers' results are Outcome values; a temporary error is retried with backoff a bounded number
   of times; any exception becomes an Outcome, so the loop never dies.
3. Mark the event done only after all its actions finished.

All store calls run in worker threads (`asyncio.to_thread`); handlers that are sync run there too.
Beside it in scanflow.agent: metrics, outcomes (actuator results as Outcomes), sensing (sensor results
and ticks), store_owner (the claim watch).
Who calls: scanflow.agent.app (lifespan start/stop, REST endpoints), tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from scanflow.agent.agent import Agent
from scanflow.agent.client import AgentClient
from scanflow.agent.context import Context
from scanflow.agent.engine import EvalEnv, Intent, StrategyState, decide, evaluates_code
from scanflow.agent.metrics import Metrics
from scanflow.agent.outcomes import call_actuator, outcome_from_exception, recorded_outcome
from scanflow.agent.sensing import normalise_events, sensor_loop
from scanflow.agent.store import REST_STRATEGIES_KEY, STATE_KEY, WATERMARK_PREFIX, Store
from scanflow.agent.store_owner import watch_claim
from scanflow.agent.types import Event, Outcome, Strategy
from scanflow.settings import Settings

BATCH = 200
IDLE_POLL_S = 1.0  # the loop also wakes on every committed event; this only bounds a missed wake-up
MAX_FRESH = 10_000  # events held in memory for the loop; past it, the loop reads the inbox instead


class Runtime:
    """One agent brought to life: its store, state, loop task, sensor tasks and peer clients."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        settings: Settings,
        peers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        *,
        retry_backoff_s: float = 0.5,
        max_retry_delay_s: float = 30.0,
    ) -> None:
        self.agent = agent
        self.store = store
        self.settings = settings
        self.clock = clock
        self.retry_backoff_s = retry_backoff_s
        self.max_retry_delay_s = max_retry_delay_s
        self.log = logging.getLogger(f"scanflow.agent.{agent.name}")
        self.metrics = Metrics()
        self.state: dict[str, Any] = {}
        self.resources: dict[str, Any] = {}  # Context.resources
        self.last_success: dict[str, float] = {}
        self.strategy_states: dict[str, StrategyState] = {}
        self.strategies: dict[str, Strategy] = dict(agent.strategies)
        self.peers = dict(peers or {})
        self.ctx = Context(self, settings=settings, peers=self.peers, clock=clock, log=self.log)
        self.started_at = clock()
        self._clients: dict[str, AgentClient] = {}
        self._wake = asyncio.Event()
        self._fresh: collections.deque[Event] = collections.deque()
        self._rescan = True
        self._unlisten: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._action_locks: dict[str, asyncio.Lock] = {}
        self._lock_users: dict[str, int] = {}
        self._sensor_locks: dict[str, asyncio.Lock] = {}
        self._saved_state = "{}"
        self._max_decided = 0
        self.processed = 0

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        from scanflow.agent.agent import build_strategy

        self.agent.check()
        await asyncio.to_thread(self.store.claim)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._fresh.clear()
        self._rescan = True
        self._unlisten = self.store.listen_inbox(self._committed)
        self.state = dict(await asyncio.to_thread(self.store.get, STATE_KEY, {}))
        self._saved_state = json.dumps(self.state, sort_keys=True, default=str)
        self.strategy_states = await asyncio.to_thread(self.store.strategy_states)
        self.last_success = await asyncio.to_thread(self.store.last_successes)
        self._max_decided = await asyncio.to_thread(self.store.max_decided_event)
        for spec in await asyncio.to_thread(self.store.get, REST_STRATEGIES_KEY, []):
            try:
                s = build_strategy(source="rest", **spec)
                self.strategies.setdefault(s.name, s)
            except ValueError as exc:  # stored by an older version: keep running, say so
                self.log.warning("stored strategy %r skipped: %s", spec.get("name"), exc)
        for a in {a.agent for s in self.strategies.values() for a in s.actions}:
            if a not in (None, self.agent.name) and a not in self.peers:
                self.log.warning("a strategy calls agent %r, which is not among the peers %s", a, self.peers)
        for hook in self.agent.startup_hooks:
            await self._call_hook(hook)
        self._tasks.append(asyncio.create_task(self._run_loop(), name=f"{self.agent.name}-loop"))
        if self.store.claims_by_session:
            every = self.settings.claim_check_s
            watch = watch_claim(self.store.verify_claim, every, self.log, self._lost_claim)
            self._tasks.append(asyncio.create_task(watch, name=f"{self.agent.name}-claim"))
        for sensor in self.agent.sensors.values():
            if sensor.every > 0:
                ticks = sensor_loop(sensor, self.store, self.run_sensor, self.clock, self.log)
                self._tasks.append(asyncio.create_task(ticks, name=f"sensor-{sensor.name}"))

    async def stop(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        for hook in self.agent.shutdown_hooks:
            try:
                await self._call_hook(hook)
            except Exception:
                self.log.exception("shutdown hook failed")
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()
        await asyncio.to_thread(self.store.release)

    def _lost_claim(self) -> None:
        """Another process now owns the store (`watch_claim`): stop acting at once (the loop and the
        sensors are cancelled), then `on_lost_claim`."""
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.on_lost_claim()

    def on_lost_claim(self) -> None:
        """What a process whose store another agent now owns does after its tasks stopped: exit through
        the server's SIGTERM handling (an orchestrator restarts it; its claim then fails until the other
        process is gone). A test that runs an agent inside its own process can replace it."""
        os.kill(os.getpid(), signal.SIGTERM)

    async def _call_hook(self, hook: Callable[..., Any]) -> None:
        if inspect.iscoroutinefunction(hook):
            await hook(self.ctx)
        else:
            await asyncio.to_thread(hook, self.ctx)
        await self._save_state()

    def peer_client(self, agent: str) -> AgentClient:
        c = self._clients.get(agent)
        if c is None:
            c = AgentClient(
                self.peers[agent],
                self.settings.token,
                timeout=self.settings.http_timeout_s,
                retries=self.settings.http_retries,
            )
            self._clients[agent] = c
        return c

    # -- inbox ---------------------------------------------------------------------------------------
    async def submit_event(
        self, name: str, payload: dict[str, Any], key: str | None, source: str | None = None
    ) -> tuple[int, bool]:
        """Durably accept an event (deduplicated by key) and wake the loop -> (id, duplicate)."""
        # the inbox writer commits (grouped with concurrent requests) and resolves the future
        event_id, dup = await asyncio.wrap_future(
            self.store.submit_event(name, payload, key, source, self.clock())
        )
        self.metrics.events_received.labels(duplicate=str(dup).lower()).inc()
        return event_id, dup

    def submit_event_blocking(
        self, name: str, payload: dict[str, Any], key: str | None, source: str | None = None
    ) -> tuple[int, bool]:
        """`submit_event` from a worker thread (sync handlers)."""
        event_id, dup = self.store.add_event(name, payload, key, source, self.clock())
        self.metrics.events_received.labels(duplicate=str(dup).lower()).inc()
        return event_id, dup

    def _committed(self, events: list[Event]) -> None:
        """Inbox writer thread: new events were committed; hand them to the loop, in order."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._deliver, events)
        except RuntimeError:  # the loop is closed: the next start reads them from the inbox
            pass

    def _deliver(self, events: list[Event]) -> None:
        if len(self._fresh) + len(events) > MAX_FRESH:
            self._rescan = True  # they are in the inbox; the loop reads them from there
        else:
            self._fresh.extend(events)
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------------
    async def _run_loop(self) -> None:
        cursor = 0  # the last event processed; events arrive in id order from both sources
        while True:
            try:
                if self._rescan:
                    self._rescan = False
                    batch = await asyncio.to_thread(self.store.pending_events, cursor, BATCH)
                    # more behind it, or an overflow while this read ran: read again
                    self._rescan = self._rescan or len(batch) == BATCH
                else:
                    batch = []
                    while self._fresh and len(batch) < BATCH:
                        e = self._fresh.popleft()
                        if e.id > cursor:
                            batch.append(e)
                self.metrics.queue_depth.set(len(batch) + len(self._fresh))
                if not batch:
                    if self._fresh or self._rescan:
                        continue
                    self._wake.clear()
                    # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
                    try:
                        async with asyncio.timeout(IDLE_POLL_S):
                            await self._wake.wait()
                    except TimeoutError:
                        self._rescan = True  # idle: read the inbox once in case a wake-up was missed
                    continue
                for event in batch:
                    await self.process(event)
                    cursor = event.id
            except asyncio.CancelledError:
                raise
            except Exception:  # a store hiccup (locked database...): log, back off, go on
                self.log.exception("agent loop error; retrying in 1 s")
                self._rescan = True  # what this batch left is still pending in the inbox
                await asyncio.sleep(1.0)

    async def process(self, event: Event) -> dict[str, Any]:
        """Decide (once) and act on one event; mark it done. Returns the outcomes by action key."""
        # Only an event a previous run may have decided needs the lookup (events go in id order).
        intents = None
        if event.id <= self._max_decided:
            intents = await asyncio.to_thread(self.store.intents_for, event.id)
        if intents is None:
            env = EvalEnv(state=self.state, since=self.ctx.since, ctx=self.ctx)
            strategies = tuple(self.strategies.values())  # a snapshot: POST /strategies may change it
            t0 = time.perf_counter()
            if evaluates_code(event.name, strategies):
                # Constraints run off the event loop: each expression is bounded (size limits and a
                # CPU budget of EVAL_BUDGET_S, ~100 ms), a callable is user code; /health must answer
                # meanwhile. One thread hop per event that reaches a real constraint.
                plan = await asyncio.to_thread(
                    decide, event, strategies, self.strategy_states, self.clock(), env
                )
            else:
                plan = decide(event, strategies, self.strategy_states, self.clock(), env)
            self.metrics.handler_seconds.labels("engine", "decide").observe(time.perf_counter() - t0)
            finish_at = None if plan.intents else self.clock()  # nothing to do: done in the same commit
            changed = plan.states if plan.decisions else None  # nothing matched: states unchanged
            if finish_at is not None and not plan.decisions:  # matched nothing: only mark it done
                await asyncio.wrap_future(self.store.submit_done(event.id, finish_at))
            else:
                await asyncio.to_thread(self.store.record_plan, event.id, plan.decisions, changed, finish_at)
            self._max_decided = max(self._max_decided, event.id)
            self.strategy_states = plan.states
            for d in plan.decisions:
                self.metrics.decisions.labels(d.result).inc()
                if d.result == "error":
                    self.log.warning("strategy %s on event %s: %s", d.strategy, event.id, d.reason)
            if finish_at is not None:
                self.metrics.events_processed.inc()
                self.processed += 1
                return {}
            intents = list(plan.intents)
        outcomes: dict[str, Any] = {}
        for intent in intents:
            outcome = await self.execute(intent, event)
            outcomes[intent.key] = recorded_outcome(outcome)
        await asyncio.to_thread(self.store.finish_event, event.id, outcomes, self.clock())
        self.metrics.events_processed.inc()
        self.processed += 1
        return outcomes

    async def execute(self, intent: Intent, event: Event | None = None) -> Outcome:
        """Run one intent until it succeeds, fails for good, or its retries are spent.

        `event` (the one that fired the strategy) is handed to local actuators as `ctx.event`.
        """
        a = intent.action
        local = a.agent in (None, self.agent.name)
        max_attempts = (
            self.agent.actuators[a.actuator].max_attempts
            if (local and a.actuator in self.agent.actuators)
            else 3
        )
        attempt = 0
        while True:
            attempt += 1
            if local:
                outcome, _dup = await self.run_actuator(
                    a.actuator, a.args, intent.key, intent.event_id, event=event
                )
            else:
                outcome = await self._run_remote(intent, event)
            if outcome.final or attempt >= max_attempts:
                if not outcome.final:
                    outcome = Outcome.failed(f"gave up after {attempt} attempts: {outcome.error}")
                    await asyncio.to_thread(
                        self.store.finish_action, intent.key, "failed", None, outcome.error, self.clock()
                    )
                return outcome
            delay = min(
                self.max_retry_delay_s, max(outcome.retry_after_s, self.retry_backoff_s * 2 ** (attempt - 1))
            )
            self.log.info("action %s: %s; retry %d in %.2fs", intent.key, outcome.error, attempt, delay)
            await asyncio.sleep(delay)

    async def _run_remote(self, intent: Intent, event: Event | None = None) -> Outcome:
        a = intent.action
        assert a.agent is not None
        name = f"{a.agent}.{a.actuator}"
        rec = await asyncio.to_thread(self.store.get_action, intent.key)
        if rec is not None and rec.status in ("succeeded", "failed"):
            return Outcome.ok(rec.result) if rec.status == "succeeded" else Outcome.failed(rec.error or "")
        await asyncio.to_thread(
            self.store.start_action, intent.key, a.actuator, a.agent, a.args, intent.event_id, self.clock()
        )
        t0 = time.perf_counter()
        try:
            result = await self.ctx.for_action(intent.key, event).call(
                a.agent, a.actuator, a.args, key=intent.key
            )
            outcome = Outcome.ok(result)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            outcome = outcome_from_exception(exc)
        self.metrics.handler_seconds.labels("remote", name[:80]).observe(time.perf_counter() - t0)
        await self._record(intent.key, outcome, [a.actuator, name])
        return outcome

    async def _record(self, key: str, outcome: Outcome, names: list[str]) -> None:
        now = self.clock()
        if outcome.status == "ok":
            await asyncio.to_thread(self.store.finish_action, key, "succeeded", outcome.result, None, now)
            for n in names:
                self.last_success[n] = now
        elif outcome.status == "failed":
            await asyncio.to_thread(self.store.finish_action, key, "failed", None, outcome.error, now)
        self.metrics.actions.labels(outcome.status).inc()

    # -- actuators -----------------------------------------------------------------------------------
    async def run_actuator(
        self,
        name: str,
        args: dict[str, Any],
        key: str,
        event_id: int | None = None,
        *,
        event: Event | None = None,
    ) -> tuple[Outcome, bool]:
        """Run a local actuator through the idempotency table -> (outcome, duplicate).

        A key that already succeeded (or failed for good) returns the stored outcome without running
        the handler again; concurrent calls with one key wait for each other.
        """
        spec = self.agent.actuators.get(name)
        if spec is None:
            return Outcome.failed(f"agent {self.agent.name!r} has no actuator {name!r}"), False
        lock = self._action_locks.setdefault(key, asyncio.Lock())
        self._lock_users[key] = self._lock_users.get(key, 0) + 1
        try:
            async with lock:
                rec = await asyncio.to_thread(self.store.get_action, key)
                if rec is not None and rec.status == "succeeded":
                    return Outcome.ok(rec.result), True
                if rec is not None and rec.status == "failed":
                    return Outcome.failed(rec.error or "failed"), True
                await asyncio.to_thread(
                    self.store.start_action, key, name, None, args, event_id, self.clock()
                )
                ctx = self.ctx.for_action(key, event)
                t0 = time.perf_counter()
                outcome = await call_actuator(name, spec, ctx, args, key, self.log)
                self.metrics.handler_seconds.labels("actuator", name).observe(time.perf_counter() - t0)
                await self._record(key, outcome, [name])
                await self._save_state()
                return outcome, False
        finally:
            self._lock_users[key] -= 1
            if not self._lock_users[key]:
                del self._lock_users[key]
                self._action_locks.pop(key, None)

    # -- sensors -------------------------------------------------------------------------------------
    async def run_sensor(self, name: str) -> list[int]:
        """Run a sensor now; its events go into the inbox with keys derived from the sensor's tick.

        The tick is stored (watermark) only after the events are in, so a sensor interrupted by a
        crash re-runs the same tick and its events are deduplicated.
        """
        spec = self.agent.sensors[name]
        lock = self._sensor_locks.setdefault(name, asyncio.Lock())
        async with lock:
            wm = await asyncio.to_thread(self.store.get, WATERMARK_PREFIX + name, {})
            tick = int(wm.get("tick", 0)) + 1
            t0 = time.perf_counter()
            ctx = self.ctx.for_action(f"sensor:{name}:{tick}")
            if spec.is_async:
                raw = await spec.fn(ctx)
            else:
                raw = await asyncio.to_thread(spec.fn, ctx)
            self.metrics.handler_seconds.labels("sensor", name).observe(time.perf_counter() - t0)
            ids = []
            for i, (ev_name, payload) in enumerate(normalise_events(raw, name)):
                eid, _dup = await self.submit_event(ev_name, payload, f"sensor:{name}:{tick}:{i}", name)
                ids.append(eid)
            await asyncio.to_thread(
                self.store.put, WATERMARK_PREFIX + name, {"tick": tick, "last_run": self.clock()}
            )
            await self._save_state()
            return ids

    # -- state ---------------------------------------------------------------------------------------
    async def _save_state(self) -> None:
        try:
            text = json.dumps(self.state, sort_keys=True, default=str)
        except (TypeError, ValueError) as exc:
            self.log.error("agent state is not JSON (%s); not saved", exc)
            return
        if text != self._saved_state:
            await asyncio.to_thread(self.store.put, STATE_KEY, json.loads(text))
            self._saved_state = text

    # -- strategies over REST ------------------------------------------------------------------------
    async def add_strategy(self, s: Strategy) -> None:
        self.strategies[s.name] = s
        await self._persist_rest_strategies()

    async def remove_strategy(self, name: str) -> Strategy:
        s = self.strategies.pop(name)
        await self._persist_rest_strategies()
        return s

    async def _persist_rest_strategies(self) -> None:
        specs = []
        for s in self.strategies.values():
            if s.source == "rest":
                j = s.to_json()
                j.pop("source")
                specs.append(j)
        await asyncio.to_thread(self.store.put, REST_STRATEGIES_KEY, specs)

    async def queue_depth(self) -> int:
        return await asyncio.to_thread(self.store.count_events, "pending")
