"""A challenger model behind a service's gateway: the share it answers (canary) or sees (shadow).

Who calls: scanflow.serving.gateway_forwarding on each native `/predict` request while a challenger is
set (`PUT /admin/challenger`, from the Executor during a progressive delivery), and the gateway's
`/admin/state`, where the Planner reads what the challenger did.

- canary: a request is answered by the challenger when a hash of its client id (the body's
  `request_id`) falls under `share`, so a client that retries with the same id lands on the same model;
  a request with no id is drawn at random. A challenger that fails (no answer, 5xx) does not fail the
  client: the request goes to the champion's replicas, and the failure is counted against the challenger.
- shadow: after the champion answered (200), `share` of the requests are sent again to the challenger,
  with the champion's answer's `request_id` as the client id, so the challenger's prediction record
  names the request the client's feedback will name. Its answer is never returned. The mirror is fire
  and forget and bounded (`MAX_MIRRORS_IN_FLIGHT`): when the challenger falls behind, mirrors are dropped
  and counted, and no client waits for one.

The challenger's figures (answers, failures, p99 of its latencies, and in shadow how often its outputs
equal the champion's) are kept here from the moment it was set, so each delivery starts from zero. Both
models' p99s come twice: over the latest LATENCY_SAMPLES answers, and over the newest RECENT_SAMPLES.
"""

from __future__ import annotations

import collections
import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from scanflow.serving.routing import Upstream

ChallengerMode = Literal["shadow", "canary"]
MAX_MIRRORS_IN_FLIGHT = 32  # mirrored requests waiting on the challenger at once; more are dropped
LATENCY_SAMPLES = 4096  # the challenger's latest latencies kept for its p99
# the newest answers the `recent_` p99s cover: what a latency breach is confirmed on, once every one of
# them came after the breach was first seen (a burst, e.g. mirrors queued while the machine was busy,
# ages out of it; a slow model does not)
RECENT_SAMPLES = 256


def client_id(body: bytes) -> str | None:
    """Pure: the client's own id of a native /predict body (`request_id`), None when it has none or the
    body is not a JSON object (the replica refuses such a body itself)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    rid = doc.get("request_id") if isinstance(doc, dict) else None
    return rid if isinstance(rid, str) and rid else None


def hash_fraction(key: str) -> float:
    """Pure: `key` mapped evenly onto [0, 1) (the first 8 bytes of its BLAKE2b digest)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64


def takes(body: bytes, share: float, draw: float) -> bool:
    """Pure: whether a canary at `share` answers this body: by its client id's hash when it has one,
    else by `draw` (a uniform number in [0, 1) the caller drew)."""
    rid = client_id(body)
    return (hash_fraction(rid) if rid is not None else draw) < share


def mirror_body(body: bytes, champion_answer: bytes) -> bytes | None:
    """Pure: the body sent to a shadow challenger: the client's, its `request_id` set to the id the
    champion's answer carries (what the client's feedback will name). None when either is not the JSON
    object expected (nothing to mirror)."""
    try:
        doc, answer = orjson.loads(body), orjson.loads(champion_answer)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(answer, dict) or not isinstance(answer.get("request_id"), str):
        return None
    doc["request_id"] = answer["request_id"]
    return orjson.dumps(doc)


def same_outputs(champion_answer: bytes, challenger_answer: bytes) -> bool | None:
    """Pure: whether both answers hold the same `outputs` (None when either has none)."""
    try:
        a, b = orjson.loads(champion_answer), orjson.loads(challenger_answer)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(a, dict) or not isinstance(b, dict) or "outputs" not in a or "outputs" not in b:
        return None
    return bool(a["outputs"] == b["outputs"])


def p99_ms(seconds: np.ndarray | None, newest: int | None = None) -> float | None:
    """Pure: the p99 in ms of latencies in seconds, oldest first (of the `newest` of them when given)."""
    if seconds is None or not len(seconds):
        return None
    return round(float(np.percentile(seconds if newest is None else seconds[-newest:], 99)) * 1000.0, 3)


@dataclass(eq=False)
class Challenger:
    """The challenger of one gateway and what it did since it was set."""

    up: Upstream
    mode: ChallengerMode
    share: float
    service: str | None = None  # the challenger's service, as its replicas name their prediction records
    delivery: str | None = None  # the Executor's id of the delivery (the same on every gateway)
    since: float = field(default_factory=time.time)
    answered: int = 0  # canary: requests it answered to clients
    failed: int = 0  # requests it could not answer (no answer, 5xx), canary and shadow
    mirrored: int = 0  # shadow: mirrored requests it answered
    dropped: int = 0  # shadow: mirrors not sent (too many in flight) or not mirrorable
    compared: int = 0
    agreed: int = 0
    in_flight: int = 0
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    # the champion's replicas' latencies on this gateway over the same period, timed the same way (from the
    # request's dispatch to its answer): what the challenger's p99 is held against
    champion_latencies: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=LATENCY_SAMPLES))
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.mode not in ("shadow", "canary"):
            raise ValueError(f"mode {self.mode!r}: use shadow or canary")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share {self.share} must be within [0, 1]")

    def answers(self, body: bytes) -> bool:
        """canary: this request is the challenger's."""
        return self.mode == "canary" and self.share > 0.0 and takes(body, self.share, self.rng.random())

    def mirrors(self) -> bool:
        """shadow: this answered request is mirrored (a draw at `share`)."""
        return self.mode == "shadow" and self.share > 0.0 and self.rng.random() < self.share

    def record(self, status: int | None, seconds: float) -> bool:
        """Count one call to the challenger (status None: no answer); True when it answered."""
        ok = status is not None and status < 500
        if not ok:
            self.failed += 1
        else:
            self.latencies.append(seconds)
        return ok

    def snapshot(self) -> dict[str, Any]:
        lat = np.fromiter(self.latencies, float) if self.latencies else None
        champ = np.fromiter(self.champion_latencies, float) if self.champion_latencies else None
        return {
            "url": self.up.url, "service": self.service, "delivery": self.delivery, "mode": self.mode, "share": self.share, "since": self.since,
            "healthy": self.up.healthy,
            "requests": self.answered + self.mirrored + self.failed,
            "answered": self.answered, "mirrored": self.mirrored, "failed": self.failed, "dropped": self.dropped,
            "in_flight": self.in_flight, "timed": len(self.latencies),
            "p99_ms": p99_ms(lat), "recent_timed": min(len(self.latencies), RECENT_SAMPLES),
            "recent_p99_ms": p99_ms(lat, RECENT_SAMPLES),
            "champion_timed": len(self.champion_latencies),
            "champion_p99_ms": p99_ms(champ), "champion_recent_p99_ms": p99_ms(champ, RECENT_SAMPLES),
            "compared": self.compared, "agreed": self.agreed,
            "agreement": round(self.agreed / self.compared, 6) if self.compared else None,
        }
