"""The demo's two uses of the load generator (scanflow.loadgen), both sending one-row predict requests.

- `Load`: a closed loop whose concurrency can change while it runs; every answer is kept as a `Sample`
  (when, latency, status, which upstream served it, model version), so S4 can see when traffic moved to
  the backup. It runs the engine in a thread of this process. Window statistics are pure functions over
  samples, testable without a server.
- `OpenLoad`: the engine in a child process (`python -m scanflow.loadgen`), steered over its stdin: an
  open-loop rate (S2's step, S3's load) or a closed-loop capacity probe, reported per second.
Who calls: scanflow.demo.s2_inprocess, s4_failover (Load); s2_autoscale, s3_tune (OpenLoad).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from scanflow.loadgen import GeneratorOwner, LoadGenerator, parse_second
from scanflow.loadgen_engine import Outcome, Second
from scanflow.loadgen_http import Request


@dataclass(frozen=True)
class Sample:
    t: float  # time.monotonic() when the answer came
    latency_ms: float
    status: int  # 0 = no answer (connection error, timeout)
    upstream: str | None = None  # x-scanflow-upstream: which replica / backup served it
    version: str | None = None


@dataclass(frozen=True)
class Window:
    count: int
    rps: float
    p99_ms: float | None
    errors: int


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of values, None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def window(samples: Sequence[Sample], t0: float, t1: float, q: float = 0.99) -> Window:
    """Statistics of the answers that came in [t0, t1)."""
    got = [s for s in samples if t0 <= s.t < t1]
    ok = [s.latency_ms for s in got if s.status == 200]
    span = max(1e-9, t1 - t0)
    return Window(len(got), len(ok) / span, quantile(ok, q), sum(1 for s in got if s.status != 200))


class Load(GeneratorOwner):
    """`with Load(url, rows, concurrency=2) as load: ...; load.concurrency = 16; load.window(...)`

    A closed-loop `scanflow.loadgen.LoadGenerator` of up to `max_clients` clients, of which
    `concurrency` send back to back (no rate cap); each answer is kept as a `Sample`.
    """

    def __init__(self, url: str, rows: np.ndarray, *, concurrency: int = 1, max_clients: int = 32,
                 timeout_s: float = 10.0) -> None:
        if not 0 <= concurrency <= max_clients or max_clients < 1:
            raise ValueError(f"need 0 <= concurrency <= max_clients >= 1, got {concurrency}, {max_clients}")
        self.url = url.rstrip("/") + "/predict"
        self.bodies = [orjson_body(r) for r in np.asarray(rows, dtype=np.float32)[:512]]
        self.max_clients = max_clients
        self.timeout_s = timeout_s
        self._gen: LoadGenerator[Sample] = LoadGenerator(
            self.url, self._request, _sample, clients=max_clients, timeout_s=timeout_s,
            concurrency=concurrency, error_pause_s=0.05, name="demo-load")

    @property
    def concurrency(self) -> int:
        """Clients sending now (changeable while the load runs)."""
        return self._gen.concurrency

    @concurrency.setter
    def concurrency(self, n: int) -> None:
        self._gen.concurrency = n

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._gen.in_flight

    def samples(self, since: float = 0.0) -> list[Sample]:
        return [s for s in self._gen.results() if s.t >= since]

    def window(self, seconds: float, now: float | None = None) -> Window:
        now = time.monotonic() if now is None else now
        return window(self.samples(now - seconds), now - seconds, now)

    def _request(self, worker: int, n: int) -> Request:
        # worker i sends rows i, i + max_clients, i + 2 * max_clients, ...: workers spread over the rows
        return Request(self.bodies[(worker + n * self.max_clients) % len(self.bodies)])


def _sample(req: Request, out: Outcome) -> Sample:
    """Keep latency, status, the serving upstream and the model version (ValueError: unreadable body)."""
    if out.response is None:
        return Sample(out.t_monotonic, out.latency_ms, 0)
    r = out.response
    version = r.json().get("model_version") if r.status_code == 200 else None
    return Sample(out.t_monotonic, out.latency_ms, r.status_code, r.headers.get("x-scanflow-upstream"),
                  None if version is None else str(version))


def orjson_body(row: np.ndarray) -> bytes:
    import orjson

    return orjson.dumps({"inputs": [row.tolist()]})


class OpenLoad:
    """`with OpenLoad(url, rows) as load: load.rate(200); ...; load.seconds()`: an open-loop arrival-rate
    generator in a child process (`python -m scanflow.loadgen`), steered over its stdin; its per-second reports
    are collected by a reader thread. `closed(n)` runs n connections back to back instead (a capacity probe).
    """

    def __init__(self, url: str, rows: np.ndarray, workdir: Path, *, max_connections: int = 2048,
                 timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/") + "/predict"
        self.bodies_path = Path(workdir) / "openload-rows.npy"
        self.bodies_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(self.bodies_path, np.asarray(rows, dtype=np.float32)[:512])
        self.argv = [sys.executable, "-m", "scanflow.loadgen", self.url, str(self.bodies_path),
                     "--max-connections", str(max_connections), "--timeout-s", str(timeout_s)]
        self._proc: subprocess.Popen[str] | None = None
        self._seconds: list[Second] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def start(self) -> Self:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                             os.environ.get("PYTHONPATH", "")]))
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env)
        self._reader = threading.Thread(target=self._read, name="openload-reader", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                s = parse_second(line)
            except ValueError:
                continue
            with self._lock:
                self._seconds.append(s)

    def _send(self, cmd: dict[str, object]) -> None:
        if self._proc is None or self._proc.stdin is None or self._proc.poll() is not None:
            raise RuntimeError("the open-loop generator is not running")
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()

    def rate(self, per_s: float) -> None:
        """Send `per_s` requests/s, evenly spaced, from now on (0: idle)."""
        self._send({"rate": float(per_s)})

    def closed(self, clients: int) -> None:
        """Run `clients` connections back to back (no rate) from now on: a capacity probe."""
        self._send({"closed": int(clients)})

    def seconds(self, since: float = 0.0) -> list[Second]:
        with self._lock:
            return [s for s in self._seconds if s.t >= since]

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            self._send({"stop": True})
            self._proc.wait(timeout=15.0)
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait(timeout=5.0)
        if self._reader is not None:
            self._reader.join(timeout=5.0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
