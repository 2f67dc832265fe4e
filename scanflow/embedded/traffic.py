"""A labelled load generator for the embedded stack: clean or drifted rows, true labels, every answer kept.

Each request carries one row, its TRUE label (`labels`, the workflow's delayed ground truth the Tracker
stores) and a unique `request_id`. `drifted = True` switches the rows to the drifted pool (the S1 drift
onset). Every answer is kept (time, HTTP status, model version) so scenarios can count failed requests
and see which model version served when. Runs on `scanflow.loadgen.LoadGenerator` (its own thread and
event loop), so a test or a benchmark drives it from plain synchronous code.
Who calls: tests/e2e, benchmarks/s1.py, the demo.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import orjson

from scanflow.loadgen import GeneratorOwner, LoadGenerator, Outcome, Request


@dataclass(frozen=True)
class Answer:
    t: float  # time.time() when the answer came
    status: int  # HTTP status; 0 = no answer (connection error, timeout)
    version: str | None  # model version that answered
    drifted: bool  # whether the row came from the drifted pool
    correct: bool | None  # prediction == true label (None when no answer)
    error: str | None = None


@dataclass
class Traffic(GeneratorOwner):
    """`with Traffic(url, clean=(x, y), drift_pool=(x, y), rate=100) as t: t.drifted = True ...`"""

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
        self._rngs = [np.random.default_rng(self.seed + i) for i in range(self.clients)]
        self._gen: LoadGenerator[Answer] = LoadGenerator(
            f"{self.url}/predict", self._request, _answer, clients=self.clients, timeout_s=self.timeout_s,
            rate=self.rate, results=self.answers, name="traffic")

    # -- results ---------------------------------------------------------------------------------
    def snapshot(self) -> list[Answer]:
        return self._gen.results()

    def failed(self, since: float = 0.0) -> list[Answer]:
        return [a for a in self.snapshot() if a.t >= since and a.status != 200]

    def accuracy(self, since: float = 0.0, drifted: bool | None = None, version: str | None = None) -> float:
        """Share of correct answers (optionally: only drifted rows, only one model version)."""
        got = [a for a in self.snapshot() if a.t >= since and a.correct is not None
               and (drifted is None or a.drifted == drifted) and (version is None or a.version == version)]
        return sum(bool(a.correct) for a in got) / len(got) if got else float("nan")

    def versions(self, since: float = 0.0) -> set[str | None]:
        return {a.version for a in self.snapshot() if a.t >= since and a.status == 200}

    def count(self, since: float = 0.0) -> int:
        return sum(1 for a in self.snapshot() if a.t >= since)

    # -- the load --------------------------------------------------------------------------------
    def _request(self, worker: int, n: int) -> Request:
        """A random row of the pool in force now, with its true label and a fresh request id."""
        drifted = self.drifted
        x, y = self.drift_pool if drifted else self.clean
        j = int(self._rngs[worker].integers(len(x)))
        label = int(y[j])
        body = {"inputs": [x[j].tolist()], "labels": [label], "request_id": uuid.uuid4().hex}
        return Request(orjson.dumps(body), (drifted, label))


def _answer(req: Request, out: Outcome) -> Answer:
    """Judge one answer against the row's true label (ValueError: unreadable body, no answer)."""
    drifted, label = req.meta
    r = out.response
    if r is None:
        exc = out.error
        return Answer(out.t_wall, 0, None, drifted, None, f"{type(exc).__name__}: {exc}")
    doc = r.json() if r.status_code == 200 else {}
    out_ = doc.get("outputs")
    pred = out_[0] if isinstance(out_, list) and out_ else None
    return Answer(out.t_wall, r.status_code, _str(doc.get("model_version")), drifted,
                  None if pred is None else int(pred) == label,
                  None if r.status_code == 200 else r.text[:200])


def _str(v: object) -> str | None:
    return None if v is None else str(v)
