"""Prediction records to the Tracker, off the response path.

Who calls: the replica. `record()` only appends to a bounded in-memory buffer (microseconds, never
awaits the network); a background task sends the buffer in batches as `POST {tracker_url}/predictions`
(JSON list, bearer token), each under `max_batch_bytes` encoded and split further when the Tracker still
answers 413. A failed send keeps the records and retries with exponential backoff; the
records waiting are exported as a gauge, and records refused because the buffer is full are counted,
logged and exported (never silently lost). Every record carries a unique `record_id`, so a send that
reached the Tracker but whose answer was lost can be de-duplicated there (exactly-once on the Tracker).

With a `RecordSpool` (scanflow.serving.spool), each record is also appended to a local file before the
answer goes out, and what an earlier process left there is sent first: records survive a crash of the
replica while the Tracker is down. With a spool, records are encoded once, when recorded (the write
needs the bytes), and the send uses those bytes; without one they stay dicts until they are sent, so
a Tracker outage costs no encoding per request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from pydantic import SecretStr

from scanflow.auth import bearer_header
from scanflow.serving.spool import RecordSpool
from scanflow.tracking.record_ids import SERVICE_HEADER, SIGNATURE_HEADER, sign_batch

log = logging.getLogger("scanflow.serving.sink")


@dataclass
class SinkStats:
    sent: int = 0
    failed_sends: int = 0
    dropped: int = 0
    auth_rejected: int = 0
    last_error: str | None = None


@dataclass
class TrackerSink:
    url: str
    token: SecretStr | None = None
    max_buffer: int = 100_000
    batch_size: int = 500
    max_batch_bytes: int = 4 * 1024 * 1024  # under the Tracker's 8 MiB body limit, with room to spare
    flush_interval_s: float = 0.2
    timeout_s: float = 5.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    spool: RecordSpool | None = None
    stats: SinkStats = field(default_factory=SinkStats)
    # (service, its record key): each batch is signed so the Tracker can tell it is that service's
    # (scanflow.tracking.record_ids); None: unsigned, for a Tracker that binds nothing
    signer: tuple[str, bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # (record, encoded or not, whether the spool holds it): a record the spool could not take is
        # still sent, and is not counted when acknowledging the spool's records (oldest first).
        self._buffer: collections.deque[tuple[bytes | dict[str, Any], bool]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._client: httpx.AsyncClient | None = None
        self._learnt_max_bytes: int | None = None  # halved on each 413: the Tracker's limit is lower

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def record(self, rec: dict[str, Any]) -> bool:
        """Queue one record; False (counted and logged) when the buffer (or the spool) is full."""
        return self.record_many([rec]) == 1

    def record_many(self, recs: list[dict[str, Any]]) -> int:
        """Queue records (one coalesced call's: one spool write for all); returns how many were taken.
        The rest, over the buffer's or the spool's bound, are refused: counted and logged."""
        room = self.max_buffer - len(self._buffer)
        kept = recs if len(recs) <= room else recs[: max(0, room)]
        taken = len(kept)
        if self.spool is None:
            self._buffer.extend([(r, False) for r in kept])
        else:
            lines = [orjson.dumps(r) for r in kept]
            n = self.spool.fits(lines)  # a full spool refuses the newest: the oldest owed are kept
            if n < len(lines):
                lines = lines[:n]
            spooled = self.spool.append(lines)  # False (disk error): kept in memory, still sent
            self._buffer.extend([(line, spooled) for line in lines])
            taken = len(lines)
        refused = len(recs) - taken
        if refused:
            self.stats.dropped += refused
            if self.stats.dropped == refused or self.stats.dropped // 1000 != (self.stats.dropped - refused) // 1000:
                log.error("tracker buffer or spool full (%d records, %s bytes): %d records refused so far",
                          self.max_buffer, self.spool.max_bytes if self.spool else "-", self.stats.dropped)
        if self._wake is not None and len(self._buffer) >= self.batch_size:
            self._wake.set()
        return taken

    def _pop(self, n: int) -> None:
        """The n oldest records are done with (delivered, or refused for good): forget them, and tell
        the spool how many of its records that was."""
        spooled = 0
        for _ in range(n):
            spooled += self._buffer.popleft()[1]
        if self.spool is not None and spooled:
            self.spool.ack(spooled)

    def start(self) -> None:
        """Start sending; with a spool, first take back what an earlier process left in it (blocking
        read at start-up: ~0.1 s per 100k records)."""
        if self.spool is not None:
            try:
                self._buffer.extend((line, True) for line in self.spool.open())
            except OSError as exc:  # an unwritable directory (a read-only container root) must not stop
                # serving; SpoolLocked (a second replica on the same spool) does, it is a deployment error
                log.error("record spool %s unavailable (%s): records kept in memory only", self.spool.dir, exc)
                self.spool = None
        self._wake = asyncio.Event()
        self._client = httpx.AsyncClient(
            timeout=self.timeout_s,
            headers={"Content-Type": "application/json", **bearer_header(self.token)},
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tracker-sink")

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Try to deliver what is buffered (bounded time), then close; what is left is logged."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task  # its own cancellation: expected
        try:
            await asyncio.wait_for(self._flush_all(), flush_timeout_s)
        except (TimeoutError, httpx.HTTPError):
            pass
        if self.spool is not None:
            self.spool.close()
        if self._buffer:
            where = "left in the spool for the next start" if self.spool is not None else "lost"
            log.error("replica stopping with %d prediction records undelivered (%s)", len(self._buffer), where)
        if self._client is not None:
            await self._client.aclose()

    async def _flush_all(self) -> None:
        while self._buffer:
            if not await self._send_one():
                return

    def _take(self) -> tuple[int, bytes]:
        """The oldest records that fit in one request: at most batch_size records and max_batch_bytes
        encoded (always at least one record, so an oversized one is tried alone and refused alone)."""
        limit = min(self.max_batch_bytes, self._learnt_max_bytes or self.max_batch_bytes)
        parts: list[bytes] = []
        size = 2
        for i in range(min(self.batch_size, len(self._buffer))):
            rec = self._buffer[i][0]
            part = rec if type(rec) is bytes else orjson.dumps(rec)
            if parts and size + len(part) + 1 > limit:
                break
            parts.append(part)
            size += len(part) + 1
        return len(parts), b"[" + b",".join(parts) + b"]"

    def _signature(self, body: bytes) -> dict[str, str]:
        if self.signer is None:
            return {}
        service, key = self.signer
        return {SERVICE_HEADER: service, SIGNATURE_HEADER: sign_batch(key, body)}

    def _drop(self, n: int, why: str) -> None:
        self._pop(n)
        self.stats.dropped += n
        log.error("tracker refused %d records for good: %s", n, why)

    async def _send_one(self) -> bool:
        """Send the oldest records that fit; on success remove them. Returns whether progress was made
        (False: keep them and back off).

        400/422: the Tracker says the records are malformed; retrying would block every record behind
        them, so they are counted as dropped and logged. 413: the batch is too big for the Tracker (its
        limit may be under ours): halve the byte cap and try again at once, down to one record; a single
        record over the limit is refused (counted, logged). 401/403 (a token problem an operator can
        fix) and everything else: keep the records and back off.
        """
        assert self._client is not None
        n, body = self._take()
        try:
            resp = await self._client.post(f"{self.url.rstrip('/')}/predictions", content=body,
                                           headers=self._signature(body))
        except httpx.HTTPError as exc:
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            self.stats.failed_sends += 1
            return False
        code = resp.status_code
        if code < 300:
            self._pop(n)
            self.stats.sent += n
            return True
        self.stats.last_error = f"HTTP {code}: {resp.text[:200]}"
        if code == 413 and n > 1:
            self._learnt_max_bytes = max(1, len(body) // 2)
            log.warning("tracker: %d records (%d bytes) too large; splitting", n, len(body))
            return True
        if code == 413 or code in (400, 422):
            self._drop(n, self.stats.last_error)
            return True
        self.stats.failed_sends += 1
        if code in (401, 403):
            self.stats.auth_rejected += 1
            log.error("token rejected by tracker (HTTP %d): %d records kept, will retry; check SCANFLOW_TOKEN",
                      code, len(self._buffer))
        return False

    async def _run(self) -> None:
        assert self._wake is not None
        backoff = self.backoff_initial_s
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            while self._buffer:
                if await self._send_one():
                    backoff = self.backoff_initial_s
                    continue
                log.warning(
                    "tracker unreachable (%s); %d records kept, retry in %.1fs",
                    self.stats.last_error, len(self._buffer), backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
