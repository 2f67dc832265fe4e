"""Security: no client controls a prediction record's identity (issue #15, item 2).

The attack this guards against: the Tracker de-duplicates on `request_id`, so when a client's id (or
a predictable replica-made id) became the record's id, an attacker could pre-claim the ids other
clients would use and the victims' records held the attacker's inputs. Now the replica makes every
record's id itself (128 random bits) and only echoes the client's id as `client_request_id`.
The replica's real ASGI app and a real PredictionLog; no network, no MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from scanflow.serving import batchwire
from scanflow.serving.model import LoadedModel
from scanflow.serving.replica_server import ReplicaConfig, create_app
from scanflow.tracking.predictions import PredictionLog, PredictionRecord


class _CapturingSink:
    """Stands in for the TrackerSink: keeps what the replica would send to the Tracker."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, rec: dict[str, Any]) -> bool:
        self.records.append(rec)
        return True

    def record_many(self, recs: list[dict[str, Any]]) -> None:
        self.records.extend(recs)

    def start(self) -> None:
        pass

    async def stop(self, **_: Any) -> None:
        pass


def _predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
    return [int(v) for v in x[:, 0]], None


async def test_a_pre_claimed_or_guessed_request_id_cannot_change_another_clients_record(tmp_path: Path) -> None:
    app = create_app(ReplicaConfig(model_uri="models:/m/1", allow_anonymous=True))
    sink = _CapturingSink()
    app.replica.sink = sink  # type: ignore[assignment]
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with app.replica.lifespan(app.api), httpx.AsyncClient(transport=transport, base_url="http://r") as http:
        await app.replica._install(LoadedModel("m", "models:/m/1", "1", 2, _predict))
        # The attacker learns the id format from one answer, then pre-claims the ids the victims will
        # send and ids "next to" the one it saw, all with junk inputs.
        seen = (await http.post("/predict", json={"inputs": [[666.0, 0.0]]})).json()["request_id"]
        guesses = [seen[:-1] + c for c in "0123456789abcdef"] + [f"victim-{i}" for i in range(30)]
        for rid in guesses:
            r = await http.post("/predict", json={"inputs": [[666.0, 0.0]], "request_id": rid})
            assert r.status_code == 200, r.text
        # The victims: 20 alone, 10 in one coalesced call, each with the id the attacker pre-claimed.
        victims: dict[str, float] = {}
        for i in range(20):
            r = await http.post("/predict", json={"inputs": [[float(i), 1.0]], "request_id": f"victim-{i}"})
            assert r.status_code == 200 and r.json()["client_request_id"] == f"victim-{i}"
            victims[r.json()["request_id"]] = float(i)
        bodies = [orjson.dumps({"inputs": [[float(i), 1.0]], "request_id": f"victim-{i}"}) for i in range(20, 30)]
        resp = await http.post("/predict_batch", content=batchwire.encode_request(bodies),
                               headers={"Content-Type": batchwire.CONTENT_TYPE.decode()})
        for i, (status, body) in zip(range(20, 30), batchwire.decode_response(resp.content, 10), strict=True):
            assert status == 200
            victims[orjson.loads(body)["request_id"]] = float(i)
    assert len(victims) == 30 and not set(victims) & set(guesses)

    log = PredictionLog(f"sqlite:///{tmp_path / 't.db'}")
    try:
        result = log.append([PredictionRecord.model_validate(r) for r in sink.records])
        assert result.stored == len(sink.records) == 1 + len(guesses) + 30  # nothing de-duplicated away
        stored = {rec["request_id"]: rec for rec in (orjson.loads(body) for _, body in log.pending(10_000))}
        for rid, value in victims.items():  # each victim's record holds the victim's own row
            assert stored[rid]["inputs"] == [[value, 1.0]] and stored[rid]["outputs"] == [int(value)]
    finally:
        log.close()


def test_replica_made_ids_share_no_predictable_part() -> None:
    app = create_app(ReplicaConfig(model_uri="models:/m/1", allow_anonymous=True))
    ids = [app.replica._new_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 for i in ids)
    assert len({i[:8] for i in ids}) > 990  # no common prefix, no counter: the next id cannot be derived


async def test_records_are_bound_to_the_service_whose_replica_issued_their_id(tmp_path: Path) -> None:
    """With a record key, a replica's ids carry its service's tag: another service's replica (holding
    the `predictions:write` scope, having learned an id) cannot claim it, under either service, before
    the real record arrives; a re-send that differs from the stored record is reported, the first kept.
    Two replicas' real apps, the Tracker's real router and log, over ASGI."""
    from fastapi import FastAPI

    from scanflow.credentials import child_env, replica_record_key
    from scanflow.tracking.api import predictions_router
    from scanflow.tracking.record_ids import (
        RECORD_KEY_ENV,
        SERVICE_HEADER,
        SERVICE_RECORD_KEY_ENV,
        SIGNATURE_HEADER,
        new_record_key,
        parse_key,
        sign_batch,
    )

    master = new_record_key()
    parent = {RECORD_KEY_ENV: master, "SCANFLOW_TOKEN": "executor-token"}
    keys = {s: replica_record_key(parent, s)[SERVICE_RECORD_KEY_ENV] for s in ("a", "b")}
    assert keys["a"] != keys["b"] and master not in keys.values()
    assert RECORD_KEY_ENV not in child_env(parent, "replica")  # the record key itself never reaches a child
    sinks = {}
    answers = {}
    for service in ("a", "b"):
        app = create_app(ReplicaConfig(model_uri="models:/m/1", service=service, replica_id=f"{service}-0",
                                       allow_anonymous=True, record_key=bytes.fromhex(keys[service])))
        sinks[service] = app.replica.sink = _CapturingSink()  # type: ignore[assignment]
        async with app.replica.lifespan(app.api), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://r") as http:  # type: ignore[arg-type]
            await app.replica._install(LoadedModel("m", "models:/m/1", "1", 2, _predict))
            answers[service] = (await http.post("/predict", json={"inputs": [[1.0, 2.0]]})).json()["request_id"]
    real = sinks["a"].records[0]
    assert real["request_id"] == answers["a"] and len(answers["a"]) == 48

    log = PredictionLog(f"sqlite:///{tmp_path / 't.db'}")
    tracker = FastAPI()
    tracker.include_router(predictions_router(log, None, allow_anonymous=True, record_key=parse_key(master, "k")))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=tracker), base_url="http://t") as http:

            async def post(records: list[dict[str, Any]], service: str | None, key: str | None) -> httpx.Response:
                body = orjson.dumps(records)
                headers = {SERVICE_HEADER: service or "", SIGNATURE_HEADER: sign_batch(bytes.fromhex(key), body)
                           } if key else {}
                return await http.post("/predictions", content=body, headers=headers)

            evil = {**real, "inputs": [[666.0, 0.0]]}
            # B, with its own key: A's id claimed for service a, or under its own service b
            got = (await post([evil, {**evil, "service": "b"}], "b", keys["b"])).json()
            assert got["refused"] == 2 and got["stored"] == 0
            # B cannot sign for service a; an unsigned batch is refused whole
            assert (await post([evil], "a", keys["b"])).status_code == 403
            assert (await post([evil], None, None)).status_code == 403
            own = (await post(sinks["b"].records, "b", keys["b"])).json()  # B's own record is fine
            assert own["stored"] == 1 and own["refused"] == 0
            first = (await post([real], "a", keys["a"])).json()
            assert first["stored"] == 1 and first["refused"] == 0  # the real record was not pre-claimed
            again = (await post([real], "a", keys["a"])).json()
            assert again["duplicates"] == 1 and again["conflicts"] == 0  # an identical re-send
            changed = (await post([{**real, "outputs": [9]}], "a", keys["a"])).json()
            assert changed["duplicates"] == 1 and changed["conflicts"] == 1  # reported, not silently dropped
            stats = (await http.get("/predictions/stats")).json()
            assert stats["refused_total"] == 2 and stats["conflicts_total"] == 1
        stored = {rec["request_id"]: rec for rec in (orjson.loads(body) for _, body in log.pending(100))}
        assert stored[real["request_id"]]["inputs"] == [[1.0, 2.0]] and stored[real["request_id"]]["outputs"] == [1]
    finally:
        log.close()
