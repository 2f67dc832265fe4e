"""A durable local spool of the replica's prediction records: append-only segment files on disk.

Why: the records a replica owes the Tracker used to live only in memory, so a replica killed while the
Tracker was down lost every record it had not delivered (21 % of the served predictions in an attack on
a running stack). With a spool, each record is in the kernel (one `os.write` per request or per
coalesced call, before the answer goes out) and survives a SIGKILL of the process; on the next start
the replica replays the spool and sends it again. The Tracker stores records idempotently by
`request_id`, so records that had been delivered before the crash and are sent again are dropped there.

Layout: `<dir>/seg-<n>.jsonl`, one encoded record per line, appended in order, plus `<dir>/LOCK` (an
flock held for the process's life: two replicas never share a spool). Who calls: `TrackerSink`.

Policies (docs/serving.md, "Hardening"):
- fsync: a background thread fsyncs the current segment every `fsync_interval_s` (default 1 s) when
  something was written since the last one, and at rotation and close; the event loop never fsyncs.
  A process crash (SIGKILL, OOM kill) loses nothing that was answered; a power cut or kernel crash may
  lose the last interval.
- acknowledgement: records are delivered oldest first; a segment whose records are all delivered is
  deleted (the current one is rotated first once it holds `rotate_bytes`). After a crash, at most the
  delivered part of the oldest unfinished segments is sent again (de-duplicated by the Tracker).
- bound: at most `max_bytes` on disk (default 256 MiB); a record that would go over it is refused
  (the caller counts it as dropped and logs it), so the oldest owed records are the ones kept.
- a write that fails (disk full, I/O error) is logged and counted; the record stays in memory, so it is
  still sent unless the process dies too.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("scanflow.serving.spool")

_PREFIX, _SUFFIX = "seg-", ".jsonl"


class SpoolLocked(RuntimeError):
    """Another live process holds this spool directory."""


@dataclass
class _Segment:
    path: Path
    records: int = 0  # written to it
    acked: int = 0  # of those, delivered (or refused for good) and no longer owed
    size: int = 0


@dataclass
class SpoolStats:
    written: int = 0
    refused_full: int = 0
    write_errors: int = 0
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    replayed: int = 0
    torn_tail_bytes: int = 0
    torn_lines: int = 0


class RecordSpool:
    """Append-only, acknowledged-by-count record spool. Not thread-safe: the event loop appends and
    acknowledges; only the fsync thread touches the file descriptor besides it (fsync is safe beside
    write on the same descriptor)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 256 << 20,
        rotate_bytes: int = 4 << 20,
        fsync_interval_s: float = 1.0,
    ) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.rotate_bytes = rotate_bytes
        self.fsync_interval_s = fsync_interval_s
        self.stats = SpoolStats()
        self._segments: collections.deque[_Segment] = collections.deque()
        self._fd = -1
        self._lock_fd = -1
        self._bytes = 0
        self._dirty = False
        self._stop = threading.Event()
        self._fsync_lock = threading.Lock()  # guards `_retired` and `_fd` between the loop and the thread
        self._retired: list[int] = []  # descriptors of rotated segments: the fsync thread syncs and closes them
        self._thread: threading.Thread | None = None

    @property
    def size_bytes(self) -> int:
        return self._bytes

    # ---- life cycle ------------------------------------------------------------------------
    def open(self) -> list[bytes]:
        """Lock the directory, read what an earlier process left (oldest first: the records still owed,
        each a JSON document) and open a fresh segment for new ones. Blocking: call at start-up."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise SpoolLocked(f"spool {self.dir} is in use by another process") from None
        replay: list[bytes] = []
        for path in sorted(self.dir.glob(f"{_PREFIX}*{_SUFFIX}")):
            data = path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # a write cut short (power loss): the partial last line is not a record
                self.stats.torn_tail_bytes += len(data) - end
                log.warning("spool %s: ignoring %d bytes of a torn last line", path.name, len(data) - end)
            lines = data[:end].split(b"\n")
            good = [line for line in lines if line[:1] == b"{" and line[-1:] == b"}"]
            bad = sum(1 for line in lines if line) - len(good)
            if bad:  # e.g. the zeros a power cut can leave in a file: one bad line must not sink a batch
                self.stats.torn_lines += bad
                log.warning("spool %s: ignoring %d lines that are not records", path.name, bad)
            lines = good
            if not lines:
                path.unlink()
                continue
            replay.extend(lines)
            self._segments.append(_Segment(path, records=len(lines), size=end, acked=0))
            self._bytes += end
        self.stats.replayed = len(replay)
        self._new_segment()
        self._thread = threading.Thread(target=self._fsync_loop, name="spool-fsync", daemon=True)
        self._thread.start()
        if replay:
            log.warning("spool %s: %d undelivered records from an earlier run will be sent", self.dir, len(replay))
        return replay

    def close(self) -> None:
        """fsync and close; the records still owed stay on disk for the next start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with self._fsync_lock:
            for fd in [*self._retired, self._fd]:
                if fd >= 0:
                    os.fsync(fd)
                    os.close(fd)
            self._retired, self._fd = [], -1
        for seg in list(self._segments):  # the current one too: nothing more is written to it
            if seg.acked >= seg.records:
                self._segments.remove(seg)
                self._unlink(seg)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ---- hot path --------------------------------------------------------------------------
    def fits(self, lines: list[bytes]) -> int:
        """How many of `lines` (a prefix) fit under `max_bytes`; the rest are counted as refused."""
        room = self.max_bytes - self._bytes
        n, size = 0, 0
        for line in lines:
            size += len(line) + 1
            if size > room:
                break
            n += 1
        if n < len(lines):
            self.stats.refused_full += len(lines) - n
        return n

    def append(self, lines: list[bytes]) -> bool:
        """Append encoded records (one JSON document each, no newline inside: orjson never writes one)
        in one write, whatever `max_bytes` says (ask `fits` first). False when the write failed
        (logged, counted): none of them is in the spool then."""
        if not lines:
            return True
        n = len(lines)
        data = b"\n".join(lines) + b"\n" if n > 1 else lines[0] + b"\n"
        seg = self._segments[-1]
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes it all unless the disk is full
                more = os.write(self._fd, data[written:])
                if more <= 0:
                    raise OSError("short write to the spool")
                written += more
        except OSError as exc:
            self.stats.write_errors += 1
            if self.stats.write_errors == 1 or self.stats.write_errors % 1000 == 0:
                log.error("spool write failed (%d so far; records kept in memory only): %s",
                          self.stats.write_errors, exc)
            try:
                self._rotate()  # whatever part went out is a torn line: start a clean segment
            except OSError as exc2:  # no new segment either: the next append tries again
                log.error("spool rotation failed: %s", exc2)
            return False
        seg.records += n
        seg.size += len(data)
        self._bytes += len(data)
        self.stats.written += n
        self._dirty = True
        if seg.size >= self.rotate_bytes:
            self._rotate()
        return True

    def ack(self, n: int) -> None:
        """The `n` oldest records not yet acknowledged are no longer owed (delivered or refused for
        good): delete the segments that are done with, rotating the current one once it is big enough."""
        while n > 0 and self._segments:
            seg = self._segments[0]
            take = min(n, seg.records - seg.acked)
            seg.acked += take
            n -= take
            if seg.acked < seg.records:
                break
            if len(self._segments) == 1:  # the current segment, all delivered
                if seg.size >= self.rotate_bytes // 16:  # keep re-sends after a crash small
                    self._rotate()
                break
            self._segments.popleft()
            self._unlink(seg)

    # ---- internals -------------------------------------------------------------------------
    def _new_segment(self) -> None:
        last = self._segments[-1].path.name if self._segments else None
        n = int(last[len(_PREFIX) : -len(_SUFFIX)]) + 1 if last else 0
        path = self.dir / f"{_PREFIX}{n:012d}{_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segments.append(_Segment(path))

    def _rotate(self) -> None:
        """Start a new segment; the old descriptor goes to the fsync thread (the loop never fsyncs)."""
        with self._fsync_lock:
            if self._fd >= 0:
                self._retired.append(self._fd)
            self._fd = -1
        self._new_segment()
        self._drop_finished()

    def _drop_finished(self) -> None:
        """Delete every segment but the current one whose records are all acknowledged."""
        keep: collections.deque[_Segment] = collections.deque()
        last = self._segments[-1] if self._segments else None
        for seg in self._segments:
            if seg is not last and seg.acked >= seg.records:
                self._unlink(seg)
            else:
                keep.append(seg)
        self._segments = keep

    def _unlink(self, seg: _Segment) -> None:
        self._bytes -= seg.size
        try:
            seg.path.unlink()
        except FileNotFoundError:
            pass

    def _fsync_loop(self) -> None:
        import time

        while not self._stop.wait(self.fsync_interval_s):
            # Only the swap is under the lock, so a rotation on the loop never waits for a disk flush;
            # a descriptor is closed only here (or by close() after this thread stopped).
            with self._fsync_lock:
                retired, self._retired = self._retired, []
                fds = [*retired, self._fd] if self._dirty and self._fd >= 0 else retired
                self._dirty = False
            t0 = time.perf_counter()
            for fd in fds:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    log.error("spool fsync failed: %s", exc)
                self.stats.fsyncs += 1
            for fd in retired:
                os.close(fd)
            self.stats.fsync_seconds += time.perf_counter() - t0
