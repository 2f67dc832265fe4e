"""A challenger behind the gateway: the canary's share by client id, the shadow's mirror with the champion's
request id, no client failed or slowed by a challenger that dies or lags. Real replica and gateway
processes on loopback (two versions of the digits MLP that answer differently), on both fronts."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from serving_helpers import read_body, wait_for

from scanflow.serving import challenger as chal
from scanflow.serving.challenger import Challenger
from scanflow.serving.routing import Upstream

FRONTS = pytest.mark.parametrize("front", ["fast", "asgi"])


def test_the_recent_p99_covers_only_the_newest_answers() -> None:
    """A burst in the challenger's first answers stays in its p99 so far, and ages out of its recent one."""
    c = Challenger(Upstream("http://127.0.0.1:9"), "shadow", 1.0)
    assert c.snapshot()["recent_p99_ms"] is None and c.snapshot()["recent_timed"] == 0
    for seconds in [0.3] * 10 + [0.01] * chal.RECENT_SAMPLES:
        assert c.record(200, seconds)
    s = c.snapshot()
    assert s["timed"] == 10 + chal.RECENT_SAMPLES and s["recent_timed"] == chal.RECENT_SAMPLES
    assert s["p99_ms"] > 250.0 and s["recent_p99_ms"] == 10.0
    assert chal.p99_ms(None) is None and chal.p99_ms(np.array([0.001, 0.002]), 1) == 2.0


def test_the_split_follows_the_client_id_and_the_mirror_names_the_champions_request() -> None:
    body = orjson.dumps({"inputs": [[0.0]], "request_id": "client-7"})
    first = chal.takes(body, 0.5, draw=0.0)
    assert all(chal.takes(body, 0.5, draw=d) == first for d in (0.0, 0.3, 0.99))  # the id decides, not the draw
    assert chal.takes(b'{"inputs": [[0.0]]}', 0.5, draw=0.1) and not chal.takes(b'{"inputs": [[0.0]]}', 0.5, draw=0.9)
    fractions = [chal.hash_fraction(f"id-{i}") for i in range(20_000)]
    assert abs(sum(f < 0.1 for f in fractions) / len(fractions) - 0.1) < 0.01
    mirrored = chal.mirror_body(body, b'{"outputs": [3], "request_id": "champ-1", "client_request_id": "client-7"}')
    assert mirrored is not None and orjson.loads(mirrored) == {"inputs": [[0.0]], "request_id": "champ-1"}
    assert chal.mirror_body(body, b'{"detail": "no id"}') is None
    assert chal.same_outputs(b'{"outputs": [1, 2]}', b'{"outputs": [1, 2], "request_id": "x"}') is True
    assert chal.same_outputs(b'{"outputs": [1, 2]}', b'{"outputs": [1, 3]}') is False
    assert chal.same_outputs(b'{"outputs": [1]}', b"not json") is None
    with pytest.raises(ValueError, match="share"):
        Challenger(Upstream("http://h:1"), "canary", 1.5)
    with pytest.raises(ValueError, match="mode"):
        Challenger(Upstream("http://h:1"), "blue", 0.5)  # type: ignore[arg-type]


async def _post_all(http: httpx.AsyncClient, url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    sem = asyncio.Semaphore(16)

    async def one(b: dict[str, Any]) -> httpx.Response:
        async with sem:
            return await http.post(url + "/predict", json=b)

    return list(await asyncio.gather(*(one(b) for b in bodies)))


@pytest.mark.integration
@pytest.mark.slow
@FRONTS
async def test_canary_answers_its_share_by_client_id_and_a_dead_challenger_fails_no_client(  # type: ignore[no-untyped-def]
        digits_models, launch, digits_rows, front) -> None:
    champion = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    challenger = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v2"], "--allow-anonymous")
    # health rounds far apart: the dead challenger below is found by the requests sent to it, not by a
    # health round that might come first (then no request would test the fallback to the champion)
    gw = await asyncio.to_thread(launch, "gateway", "--service", "digits", "--replica", champion.url,
                                 "--health-interval-s", "60", "--allow-anonymous", "--front", front)
    async with httpx.AsyncClient(timeout=20) as http:
        for bad in ({"url": "localhost:1", "mode": "canary", "share": 0.1},
                    {"url": challenger.url, "mode": "blue-green", "share": 0.1},
                    {"url": challenger.url, "mode": "canary", "share": 1.5}):
            assert (await http.put(gw.url + "/admin/challenger", json=bad)).status_code == 422
        assert (await http.delete(gw.url + "/admin/challenger")).json()["challenger"] is None
        put = await http.put(gw.url + "/admin/challenger", json={"url": challenger.url, "mode": "canary", "share": 0.3})
        assert put.status_code == 200 and put.json()["challenger"]["healthy"] is True

        bodies = [{"inputs": [digits_rows[i % len(digits_rows)]], "request_id": f"req-{i}"} for i in range(400)]
        answers = await _post_all(http, gw.url, bodies)
        assert [a.status_code for a in answers] == [200] * 400
        by_challenger = [a.headers["x-scanflow-upstream"] == challenger.url for a in answers]
        expected = [chal.hash_fraction(f"req-{i}") < 0.3 for i in range(400)]
        assert by_challenger == expected  # each request where its id's hash puts it
        assert 0.2 < sum(by_challenger) / 400 < 0.4
        assert {a.json()["model_version"] for a, c in zip(answers, by_challenger, strict=True) if c} == {"2"}
        assert {a.json()["model_version"] for a, c in zip(answers, by_challenger, strict=True) if not c} == {"1"}
        # a client retrying with the same id lands on the same model
        again = await _post_all(http, gw.url, bodies[:20])
        assert [a.headers["x-scanflow-upstream"] for a in again] == [a.headers["x-scanflow-upstream"] for a in answers[:20]]
        state = (await http.get(gw.url + "/admin/state")).json()["challenger"]
        assert state["answered"] == sum(by_challenger) + sum(expected[:20]) and state["failed"] == 0
        assert state["timed"] == state["answered"] and state["p99_ms"] > 0

        # the challenger dies under load: its requests go to the champion, none fails
        challenger.popen.send_signal(signal.SIGKILL)
        await asyncio.to_thread(challenger.popen.wait)
        more = await _post_all(http, gw.url, [{"inputs": [digits_rows[0]], "request_id": f"late-{i}"} for i in range(200)])
        assert [a.status_code for a in more] == [200] * 200
        assert {a.headers["x-scanflow-upstream"] for a in more} == {champion.url}
        state = (await http.get(gw.url + "/admin/state")).json()["challenger"]
        assert state["healthy"] is False and state["failed"] >= 1  # tried, failed, handed to the champion
        assert (await http.delete(gw.url + "/admin/challenger")).json()["challenger"] is None


@pytest.mark.integration
@pytest.mark.slow
@FRONTS
async def test_shadow_mirrors_answered_requests_with_the_champions_id_and_never_answers(  # type: ignore[no-untyped-def]
        digits_models, launch, digits_rows, front) -> None:
    champion = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    shadow = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v2"], "--allow-anonymous")
    gw = await asyncio.to_thread(launch, "gateway", "--service", "digits", "--replica", champion.url,
                                 "--health-interval-s", "0.5", "--allow-anonymous", "--front", front)
    async with httpx.AsyncClient(timeout=20) as http:
        await http.put(gw.url + "/admin/challenger", json={"url": shadow.url, "mode": "shadow", "share": 1.0})
        bodies = [{"inputs": [digits_rows[i % len(digits_rows)]]} for i in range(120)]
        answers = await _post_all(http, gw.url, bodies)
        assert [a.status_code for a in answers] == [200] * 120
        assert {a.headers["x-scanflow-upstream"] for a in answers} == {champion.url}
        assert {a.json()["model_version"] for a in answers} == {"1"}

        def state() -> dict[str, Any]:
            return httpx.get(gw.url + "/admin/state", timeout=5).json()["challenger"]

        await wait_for(lambda: state()["mirrored"] + state()["dropped"] == 120, 30, "every mirror answered")
        s = state()
        assert s["answered"] == 0 and s["failed"] == 0 and s["compared"] == s["mirrored"] >= 1
        # the champion's answers timed on the same gateway, for the challenger's p99 to be held against
        assert s["champion_timed"] == 120 and s["champion_p99_ms"] > 0
        # the two versions answer some digits differently: agreement is measured, not assumed
        v2 = (await http.post(shadow.url + "/predict", json={"inputs": digits_rows})).json()["outputs"]
        v1 = (await http.post(champion.url + "/predict", json={"inputs": digits_rows})).json()["outputs"]
        assert v1 != v2 and s["agreement"] < 1.0


@pytest.mark.integration
@pytest.mark.slow
@FRONTS
async def test_a_lagging_shadow_is_bounded_and_never_slows_a_client(serve_app, digits_models, launch, digits_rows,  # type: ignore[no-untyped-def]
                                                                   front) -> None:
    seen: list[dict[str, Any]] = []
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def slow_shadow(scope: Any, receive: Any, send: Any) -> None:
        """A challenger that holds every request until the test releases it."""
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] == "/predict":
            seen.append(orjson.loads(body))
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(release.wait(), loop))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"outputs": [0], "request_id": "s", "ready": true}'})

    shadow_url = serve_app(slow_shadow)
    champion = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    gw = await asyncio.to_thread(launch, "gateway", "--service", "digits", "--replica", champion.url,
                                 "--health-interval-s", "0.5", "--allow-anonymous", "--front", front)
    async with httpx.AsyncClient(timeout=20) as http:
        await http.put(gw.url + "/admin/challenger", json={"url": shadow_url, "mode": "shadow", "share": 1.0})
        t0 = time.monotonic()
        answers = await _post_all(http, gw.url, [{"inputs": [digits_rows[0]], "request_id": f"c-{i}"} for i in range(100)])
        assert [a.status_code for a in answers] == [200] * 100  # answered while every mirror is held
        assert time.monotonic() - t0 < 15
        # a mirror is decided after its client has the answer: wait until the gateway decided all 100
        def state() -> dict[str, Any]:
            return dict(httpx.get(gw.url + "/admin/state").json()["challenger"])

        def decided() -> int:
            s = state()
            return int(s["in_flight"]) + int(s["dropped"])

        await wait_for(lambda: decided() >= 100, 30, "every mirror decided")
        s = state()
        assert s["in_flight"] == chal.MAX_MIRRORS_IN_FLIGHT and s["dropped"] == 100 - chal.MAX_MIRRORS_IN_FLIGHT
        await wait_for(lambda: len(seen) == chal.MAX_MIRRORS_IN_FLIGHT, 10, "the mirrors to reach the shadow")
        # each mirror carries the champion's request id, not the client's
        champion_ids = {a.json()["request_id"] for a in answers}
        assert {b["request_id"] for b in seen} <= champion_ids
        release.set()
        await wait_for(lambda: httpx.get(gw.url + "/admin/state").json()["challenger"]["in_flight"] == 0, 10,
                       "the held mirrors to finish")
