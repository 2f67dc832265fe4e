"""Delayed feedback: post true labels to the Tracker's /feedback some time after the answers, in batches.

Who calls: scanflow.embedded.traffic.Traffic, which plays the client that learns the truth later for
a part of its requests. `submit` is cheap and thread-safe (Traffic calls it from its load generator's
event loop); one background thread of this module waits until records are due, posts them in
batches and retries what failed, so the load is never slowed by the Tracker.

Re-posting is safe (the Tracker stores each request_id once, first wins), so a batch whose answer was
lost is simply sent again. A 4xx other than an auth or rate refusal means a malformed record: its
batch is dropped (counted, logged), since sending it again cannot succeed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import httpx

from scanflow.agent.client import AgentHTTPError
from scanflow.tracking.feedback_client import post_feedback

log = logging.getLogger(__name__)
MAX_PENDING = 100_000  # labels waiting to be sent at most (a Tracker down for long must not grow memory)

RETRY_4XX = frozenset({401, 403, 408, 429})  # worth sending again (an operator fixes the token, a pause)


@dataclass(frozen=True)
class FeedbackCounts:
    """`scheduled`: records queued; `sent`: record sends attempted (a retried record counts again);
    `acknowledged`: records the Tracker acknowledged (each once); `dropped`: records given up (not due
    yet, or undelivered, when `close` ended; refused as malformed); `failed_posts`: POSTs that failed."""

    scheduled: int
    sent: int
    acknowledged: int
    dropped: int
    failed_posts: int


class DelayedFeedback:
    """`sender.submit(request_id, labels)`; each record is posted `delay_s` after its submit, or later."""

    def __init__(self, tracker_url: str, token: str | None, *, delay_s: float, batch_size: int = 200,
                 timeout_s: float = 5.0, backoff_s: tuple[float, float] = (0.2, 5.0), close_bound_s: float = 5.0,
                 name: str = "feedback") -> None:
        if delay_s < 0 or batch_size < 1 or close_bound_s < 0:
            raise ValueError("delay_s and close_bound_s must be >= 0 and batch_size >= 1")
        self.tracker_url = tracker_url
        self.token = token
        self.delay_s = delay_s
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.close_bound_s = close_bound_s
        self.name = name
        self._due: deque[tuple[float, dict[str, Any]]] = deque()  # in due order: one delay for all
        self._cond = threading.Condition()
        self._closing_at: float | None = None  # monotonic time close() was called
        self._thread: threading.Thread | None = None
        self._scheduled = self._sent = self._acked = self._dropped = self._failed = 0

    def counts(self) -> FeedbackCounts:
        with self._cond:
            return FeedbackCounts(self._scheduled, self._sent, self._acked, self._dropped, self._failed)

    def submit(self, request_id: str, labels: list[Any]) -> None:
        """Queue one request's true labels, due `delay_s` from now. Never blocks on the network."""
        with self._cond:
            if self._closing_at is not None:
                return
            if len(self._due) >= MAX_PENDING:  # the Tracker is away for long: drop, counted, not unbounded
                self._scheduled += 1
                self._dropped += 1
                return
            self._due.append((time.monotonic() + self.delay_s, {"request_id": request_id, "labels": labels}))
            self._scheduled += 1
            self._cond.notify()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop taking records, post those already due (within `close_bound_s`), drop the rest."""
        with self._cond:
            if self._closing_at is None:
                self._closing_at = time.monotonic()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=self.close_bound_s + self.timeout_s + 1)
        with self._cond:  # whatever the thread left (not due at close, or it ran out of time)
            self._dropped += len(self._due)
            self._due.clear()

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        with httpx.Client(timeout=self.timeout_s) as http:
            while (batch := self._next_batch(failures)) is not None:
                if self._post(http, batch):
                    failures = 0
                else:
                    failures += 1

    def _next_batch(self, failures: int) -> list[tuple[float, dict[str, Any]]] | None:
        """The next due batch (waiting for it; after `failures` failed posts in a row, not before a
        backoff), or None when closing and nothing that was due at close is left to send in time."""
        backoff = min(self.backoff_s[0] * 2 ** (failures - 1), self.backoff_s[1]) if failures else 0.0
        pause_until = time.monotonic() + backoff
        with self._cond:
            while True:
                now = time.monotonic()
                closing = self._closing_at
                if closing is not None:
                    end = closing + self.close_bound_s
                    if not self._due or self._due[0][0] > closing or now > end:
                        return None
                    if now >= pause_until:
                        break  # due at close: send now, without waiting for later ones
                    self._cond.wait(min(pause_until, end) - now)
                    continue
                if now >= pause_until and self._due and self._due[0][0] <= now:
                    break
                wake = max(pause_until, self._due[0][0]) if self._due else None
                self._cond.wait(None if wake is None else max(0.0, wake - now))
            limit = now if closing is None else closing
            batch: list[tuple[float, dict[str, Any]]] = []
            while self._due and self._due[0][0] <= limit and len(batch) < self.batch_size:
                batch.append(self._due.popleft())
            self._sent += len(batch)
            return batch

    def _post(self, http: httpx.Client, batch: list[tuple[float, dict[str, Any]]]) -> bool:
        """One POST of `batch`; on a failure worth retrying the batch goes back to the front, with
        the due times it had (so it stays ahead of later records and counts as due at close)."""
        try:
            got = post_feedback(self.tracker_url, self.token, [rec for _, rec in batch], retries=0, http=http)
        except Exception as exc:  # noqa: BLE001 - any failure (an unreadable 200 too) must not end the sender
            status = exc.status if isinstance(exc, AgentHTTPError) else 0
            with self._cond:
                self._failed += 1
                if 400 <= status < 500 and status not in RETRY_4XX:
                    self._dropped += len(batch)
                    log.error("%s: the Tracker refused %d feedback records: %s", self.name, len(batch), exc)
                    return True  # nothing to wait for: sending them again cannot succeed
                self._due.extendleft(reversed(batch))
            log.warning("%s: posting %d feedback records failed (%s); will retry", self.name, len(batch), exc)
            return False
        with self._cond:
            self._acked += int(got["accepted"])
        return True
