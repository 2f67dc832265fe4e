"""A labelled load generator for the embedded stack: clean or drifted rows, true labels, every answer kept.

Each request carries one row, its TRUE label (`labels`, the workflow's delayed ground truth the Tracker
stores) and a unique `request_id`. `drifted = True` switches the rows to the drifted pool (the S1 drift
onset). Every answer is kept (time, HTTP status, model version) so scenarios can count failed requests
and see which model version served when. Runs in its own thread with its own event loop, so a test or
a benchmark drives it from plain synchronous code.
Who calls: tests/e2e, benchmarks/s1.py, the demo.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Self

import httpx
import numpy as np


@dataclass(frozen=True)
class Answer:
    t: float  # time.time() when the answer came
    status: int  # HTTP status; 0 = no answer (connection error, timeout)
    version: str | None  # model version that answered
    drifted: bool  # whether the row came from the drifted pool
    correct: bool | None  # prediction == true label (None when no answer)
    error: str | None = None


@dataclass
class Traffic:
    """`with Traffic(url, clean=(x, y), drifted=(x, y), rate=100) as t: t.drifted = True ...`"""

    url: str
    clean: tuple[np.ndarray, np.ndarray]
    drift_pool: tuple[np.ndarray, np.ndarray]
    rate: float = 100.0  # requests per second in total (a cap: closed loop below it)
    clients: int = 4
    timeout_s: float = 10.0
    seed: int = 0
    drifted: bool = False
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.clients < 1:
            raise ValueError("rate must be > 0 and clients >= 1")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> Self:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------------------------
    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def failed(self, since: float = 0.0) -> list[Answer]:
        return [a for a in self.snapshot() if a.t >= since and a.status != 200]

    def accuracy(self, since: float = 0.0, drifted: bool | None = None, version: str | None = None) -> float:
        """Share of correct answers (optionally: only drifted rows, only one model version)."""
        got = [a for a in self.snapshot() if a.t >= since and a.correct is not None
               and (drifted is None or a.drifted == drifted) and (version is None or a.version == version)]
        return sum(a.correct for a in got) / len(got) if got else float("nan")

    def versions(self, since: float = 0.0) -> set[str | None]:
        return {a.version for a in self.snapshot() if a.t >= since and a.status == 200}

    def count(self, since: float = 0.0) -> int:
        return sum(1 for a in self.snapshot() if a.t >= since)

    # -- the load --------------------------------------------------------------------------------
    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as http:
            await asyncio.gather(*(self._client(i, http) for i in range(self.clients)))

    async def _client(self, i: int, http: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(self.seed + i)
        period = self.clients / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            drifted = self.drifted
            x, y = self.drift_pool if drifted else self.clean
            j = int(rng.integers(len(x)))
            body = {"inputs": [x[j].tolist()], "labels": [int(y[j])], "request_id": uuid.uuid4().hex}
            try:
                r = await http.post(f"{self.url}/predict", json=body)
                doc = r.json() if r.status_code == 200 else {}
                out = doc.get("outputs")
                pred = out[0] if isinstance(out, list) and out else None
                ans = Answer(time.time(), r.status_code, _str(doc.get("model_version")), drifted,
                             None if pred is None else int(pred) == int(y[j]),
                             None if r.status_code == 200 else r.text[:200])
            except (httpx.HTTPError, ValueError) as exc:
                ans = Answer(time.time(), 0, None, drifted, None, f"{type(exc).__name__}: {exc}")
            with self._lock:
                self.answers.append(ans)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()


def _str(v: object) -> str | None:
    return None if v is None else str(v)
