"""A labelled load generator for the embedded stack: clean or drifted rows, true labels, every answer kept.

Each request carries one row and a unique `request_id`; its TRUE label stays here, to judge the answer.
Like a real client that learns the truth later for some of its requests, Traffic then posts the label
as feedback to the Tracker (`tracker_url` + "/feedback", by the request_id the answer returned) for a
seeded random `feedback_fraction` of the answered requests, `feedback_delay_s` after the answer, from
a thread of its own (scanflow.embedded.feedback_sender). `drifted = True` switches the rows to the
drifted pool (the S1 drift onset). Requests leave on schedule at `rate` (open loop, at most `clients`
in flight; `unsent` counts arrivals due while all were busy). Every answer is kept (time, HTTP status, model version) so
scenarios can count failed requests and see which model version served when. Runs on
`scanflow.loadgen.LoadGenerator` (its own thread and event loop), so a test or a benchmark drives it
from plain synchronous code.
Who calls: tests/e2e, benchmarks/s1.py, the demo.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import orjson

from scanflow.embedded.feedback_sender import DelayedFeedback, FeedbackCounts
from scanflow.loadgen import GeneratorOwner, LoadGenerator
from scanflow.loadgen_engine import Outcome
from scanflow.loadgen_http import Request


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
    """`with Traffic(url, clean=(x, y), drift_pool=(x, y), rate=100, tracker_url=..., token=...) as t: ...`

    With `tracker_url` None (or `feedback_fraction` 0) no feedback is sent. Leaving the `with` block
    (or `stop()`/`close()`) stops the load, then posts the feedback already due (bounded by
    `feedback_close_bound_s`); labels not yet due then are dropped, as a client that stops would.
    """

    url: str
    clean: tuple[np.ndarray, np.ndarray]
    drift_pool: tuple[np.ndarray, np.ndarray]
    rate: float = 100.0  # requests per second, on schedule (open loop: latency from the scheduled send)
    clients: int = 4  # the most requests in flight; an arrival due while all are busy is counted unsent
    timeout_s: float = 10.0
    seed: int = 0
    drifted: bool = False
    answers: list[Answer] = field(default_factory=list)
    tracker_url: str | None = None  # where feedback goes (the Tracker agent); None: no feedback
    token: str | None = None  # the Tracker's bearer token
    feedback_fraction: float = 0.2  # share of answered requests whose true label is posted
    feedback_delay_s: float = 2.0  # how long after its answer a label is posted (at the earliest)
    feedback_close_bound_s: float = 5.0  # how long stop() may spend posting what is due

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.clients < 1:
            raise ValueError("rate must be > 0 and clients >= 1")
        if not 0.0 <= self.feedback_fraction <= 1.0 or self.feedback_delay_s < 0:
            raise ValueError("feedback_fraction must be in [0, 1] and feedback_delay_s >= 0")
        self._rngs = [np.random.default_rng(self.seed + i) for i in range(self.clients)]
        # a stream of their own, so the rows sent do not depend on the feedback settings
        self._feedback_rngs = [np.random.default_rng([self.seed, i, 1]) for i in range(self.clients)]
        self._feedback = (
            DelayedFeedback(self.tracker_url, self.token, delay_s=self.feedback_delay_s,
                            close_bound_s=self.feedback_close_bound_s, name="traffic-feedback")
            if self.tracker_url and self.feedback_fraction > 0 else None
        )
        self._gen: LoadGenerator[Answer] = LoadGenerator(
            f"{self.url}/predict", self._request, self._judge, clients=self.clients, timeout_s=self.timeout_s,
            rate=self.rate, results=self.answers, name="traffic")

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> Traffic:
        if self._feedback is not None:
            self._feedback.start()
        self._gen.start()
        return self

    def stop(self) -> None:
        """Stop the load, then flush the feedback that is due (bounded; see the class docstring)."""
        self._gen.stop()
        if self._feedback is not None:
            self._feedback.close()

    close = stop

    def feedback_counts(self) -> FeedbackCounts:
        """Feedback scheduled / sent / acknowledged / dropped so far (all zero without a tracker_url)."""
        return self._feedback.counts() if self._feedback is not None else FeedbackCounts(0, 0, 0, 0, 0)

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

    @property
    def unsent(self) -> int:
        """Arrivals due while every client was busy (never sent): an open loop counts what it could not send."""
        return self._gen.unsent

    # -- the load --------------------------------------------------------------------------------
    def _request(self, worker: int, n: int) -> Request:
        """A random row of the pool in force now and a fresh request id; the true label stays in
        `meta`, with whether this request's label is to be posted as feedback once answered."""
        drifted = self.drifted
        x, y = self.drift_pool if drifted else self.clean
        j = int(self._rngs[worker].integers(len(x)))
        label = y[j].item()  # a class or a regression target, as the pool holds it
        feedback = bool(self._feedback_rngs[worker].random() < self.feedback_fraction)
        request_id = uuid.uuid4().hex
        body = {"inputs": [x[j].tolist()], "request_id": request_id}
        return Request(orjson.dumps(body), (drifted, label, request_id, feedback))

    def _judge(self, req: Request, out: Outcome) -> Answer:
        """Judge the answer; for a chosen request answered with 200, schedule its label as feedback."""
        answer = _answer(req, out)
        _, label, request_id, feedback = req.meta
        if feedback and self._feedback is not None and answer.status == 200 and out.response is not None:
            returned = out.response.json().get("request_id")
            self._feedback.submit(returned if isinstance(returned, str) and returned else request_id, [label])
        return answer


def _answer(req: Request, out: Outcome) -> Answer:
    """Judge one answer against the row's true label (ValueError: unreadable body, no answer)."""
    drifted, label = req.meta[:2]
    r = out.response
    if r is None:
        exc = out.error
        return Answer(out.t_wall, 0, None, drifted, None, f"{type(exc).__name__}: {exc}")
    doc = r.json() if r.status_code == 200 else {}
    out_ = doc.get("outputs")
    pred = out_[0] if isinstance(out_, list) and out_ else None
    return Answer(out.t_wall, r.status_code, _str(doc.get("model_version")), drifted,
                  None if pred is None else pred == label,
                  None if r.status_code == 200 else r.text[:200])


def _str(v: object) -> str | None:
    return None if v is None else str(v)
