"""OIP v2 infer on the gateway's fast front (scanflow.serving.fastfront + oip_path, the replica's
POST /predict_batch with v2 items: scanflow.serving.oip_items): answered without the gateway's ASGI app, coalesced with
/predict, and alike the slow v2 route (the replica's FastAPI route, which the gateway's ASGI route
relays unchanged) for good and bad input. Plus the pure parts (URL matching, batch framing, error
shapes) without a network."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from serving_helpers import read_body, record_asgi_paths
from test_serving_fastfront import _read, _serve

from scanflow.serving import batchwire
from scanflow.serving.fastfront import protocol_for
from scanflow.serving.gateway_server import GatewayConfig, create_app
from scanflow.serving.oip_path import infer_path, infer_target, v2_shaped

DIGITS = "serving-digits"  # the registered name of the session's digits MLP (tests/conftest.py)


@pytest.fixture
def stack(digits_models, launch) -> Iterator[tuple[str, int, list[str]]]:  # type: ignore[no-untyped-def]
    """(replica URL, port of a fast-front gateway in front of it, paths its ASGI app saw)."""
    rep = launch("replica", "--model-uri", digits_models["v1"], "--allow-anonymous", "--service", "digits")
    app = create_app(GatewayConfig(service="digits", replicas=(rep.url,), allow_anonymous=True))
    asgi_paths = record_asgi_paths(app)
    server, thread, port = _serve(app, http=protocol_for(app.gateway), lifespan="on")
    try:
        yield rep.url, port, asgi_paths
    finally:
        server.should_exit = True
        thread.join(10)


def _infer_raw(port: int, path: str, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
        c.sendall(head + body)
        status, headers, answer = _read(c, bytearray())
    return int(status.split()[1]), headers, answer


def _masked(body: bytes) -> Any:
    """An infer answer without its fresh per-request record id (also its `id` when the client gave none)."""
    doc = orjson.loads(body)
    if isinstance(doc, dict) and isinstance(doc.get("parameters"), dict):
        record_id = doc["parameters"].pop("request_id", None)
        if doc.get("id") == record_id:
            doc["id"] = "<record id>"
    return doc


def _tensor(rows: list[list[float]], **kw: Any) -> dict[str, Any]:
    return {"name": "input", "datatype": "FP32", "shape": [len(rows), len(rows[0])],
            "data": [v for r in rows for v in r], **kw}


@pytest.mark.slow
def test_v2_infer_takes_the_fast_front_and_answers_like_the_slow_route(stack, digits_rows) -> None:  # type: ignore[no-untyped-def]
    rep_url, port, asgi_paths = stack
    rows = digits_rows[:3]
    cases: list[tuple[str, bytes]] = [
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"id": "a-1", "inputs": [_tensor(rows)]})),
        ("/v2/models/digits/infer", orjson.dumps({"inputs": [_tensor(rows)], "outputs": [{"name": "label"}]})),
        (f"/v2/models/{DIGITS}/versions/1/infer", orjson.dumps({"inputs": [_tensor(rows[:1])]})),
        # refusals: each must be the slow route's status and message, never a 5xx
        ("/v2/models/nope/infer", orjson.dumps({"inputs": [_tensor(rows)]})),
        (f"/v2/models/{DIGITS}/versions/9/infer", orjson.dumps({"inputs": [_tensor(rows)]})),
        (f"/v2/models/{DIGITS}/infer", b"{not json"),
        (f"/v2/models/{DIGITS}/infer", b"[1, 2]"),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": []})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": [_tensor([r[:5] for r in rows])]})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": [_tensor(rows, datatype="BYTES")]})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": [_tensor(rows, shape=[2, 64])]})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": [_tensor(rows)], "outputs": [{"name": "x"}]})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"id": "x" * 201, "inputs": [_tensor(rows)]})),
        (f"/v2/models/{DIGITS}/infer", orjson.dumps({"inputs": [_tensor(rows, datatype="FP64", data=[1e300] * 192)]})),
    ]
    statuses = []
    for path, body in cases:
        slow = httpx.post(rep_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        status, headers, answer = _infer_raw(port, path, body)
        statuses.append(status)
        assert status == slow.status_code, (path, body[:80], answer, slow.text)
        assert _masked(answer) == _masked(slow.content), (path, body[:80])
        assert headers[b"content-type"] == b"application/json"
        assert status < 500
    assert statuses[:3] == [200, 200, 200] and statuses[3:5] == [404, 404]
    assert all(s == 400 for s in statuses[5:]), statuses
    assert orjson.loads(_infer_raw(port, cases[0][0], cases[0][1])[2])["id"] == "a-1"
    assert not [p for p in asgi_paths if p.startswith("/v2")], asgi_paths  # none took the ASGI cycle

    # what the fast front does not take still goes through the ASGI route, with the same answer
    quoted = f"/v2/models/{DIGITS.replace('-', '%2D')}/infer"
    status, _, answer = _infer_raw(port, quoted, cases[0][1])
    assert status == 200 and orjson.loads(answer)["model_name"] == DIGITS
    assert asgi_paths == [f"/v2/models/{DIGITS}/infer"]


@pytest.mark.slow
def test_predict_batch_mixes_native_and_v2_items_in_one_call(stack, digits_rows) -> None:  # type: ignore[no-untyped-def]
    rep_url, _, _ = stack
    rows = digits_rows[:2]
    bodies = [orjson.dumps({"inputs": rows}), orjson.dumps({"id": "m", "inputs": [_tensor(rows)]}),
              orjson.dumps({"inputs": [_tensor(rows)]}), orjson.dumps({"inputs": "x"})]
    models: list[batchwire.ItemModel] = [None, (DIGITS, None), ("other", None), (DIGITS, "1")]
    resp = httpx.post(rep_url + "/predict_batch", content=batchwire.encode_request(bodies, models),
                      headers={"Content-Type": batchwire.CONTENT_TYPE.decode()}, timeout=30)
    assert resp.status_code == 200
    (s0, native), (s1, v2), (s2, unknown), (s3, bad) = batchwire.decode_response(resp.content, 4)
    assert (s0, s1, s2, s3) == (200, 200, 404, 400)
    labels = orjson.loads(native)["outputs"]
    doc = orjson.loads(v2)
    assert doc["id"] == "m" and doc["outputs"][0] == {"name": "label", "datatype": "INT64", "shape": [2],
                                                      "data": labels}
    assert doc["outputs"][1]["shape"] == [2, 10] and doc["model_name"] == DIGITS
    assert set(orjson.loads(unknown)) == {"error"} and set(orjson.loads(bad)) == {"error"}


def _fake_replica(draining: bool) -> Any:
    """A replica stand-in: /predict_batch echoes each item's model (or, draining, 503 to everything)."""
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        status, ctype = 200, b"application/json"
        if scope["path"] == "/ready":
            out = b'{"ready": true}'
        elif draining:
            status, out = 503, b'{"detail":"replica is draining; send to another replica"}'
        elif scope["path"] == "/predict_batch":
            _, models = batchwire.decode_request_items(body)
            seen.append(models)
            out = batchwire.encode_response("1", [(200, orjson.dumps({"model": m})) for m in models])
            ctype = batchwire.CONTENT_TYPE
        else:
            seen.append(scope["path"])
            out = b'{"alone": true}'
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    return app, seen


@pytest.mark.parametrize("draining", [False, True])
def test_fast_v2_goes_to_predict_batch_and_a_refusal_keeps_the_protocol_shape(draining: bool) -> None:
    fake, seen = _fake_replica(draining)
    rep, rep_thread, rport = _serve(fake, lifespan="off")
    app = create_app(GatewayConfig(replicas=(f"http://127.0.0.1:{rport}",), allow_anonymous=True))
    asgi_paths = record_asgi_paths(app)
    server, thread, port = _serve(app, http=protocol_for(app.gateway), lifespan="on")
    try:
        status, _, answer = _infer_raw(port, "/v2/models/m/versions/2/infer", b'{"inputs": []}')
    finally:
        for s, t in ((server, thread), (rep, rep_thread)):
            s.should_exit = True
            t.join(10)
    assert not asgi_paths
    if draining:  # the batch refused, then the item alone on its v2 path, refused too: v2's error shape
        assert status == 503 and orjson.loads(answer) == {"error": "replica is draining; send to another replica"}
    else:
        assert status == 200 and orjson.loads(answer) == {"model": ["m", "2"]} and seen == [[("m", "2")]]


# ---- pure parts ------------------------------------------------------------------------------------


def test_infer_target_takes_only_plain_infer_urls() -> None:
    assert infer_target(b"/v2/models/digits/infer") == ("digits", None)
    assert infer_target(b"/v2/models/a.b_c~d-1/versions/7/infer") == ("a.b_c~d-1", "7")
    for url in (b"/v2/models/digits/infer?x=1", b"/v2/models/d%20x/infer", b"/v2/models//infer",
                b"/v2/models/digits", b"/v2/models/digits/ready", b"/v2/models/a/b/infer",
                b"/v2/models/digits/versions//infer", b"/predict", b"/v2/models/digits/infer/"):
        assert infer_target(url) is None, url
    assert infer_path(("digits", None)) == b"/v2/models/digits/infer"
    assert infer_path(("digits", "3")) == b"/v2/models/digits/versions/3/infer"


def test_batch_framing_carries_the_v2_models() -> None:
    bodies = [b'{"inputs": [[1]]}', b"{}"]
    assert batchwire.decode_request_items(batchwire.encode_request(bodies)) == (bodies, [None, None])
    framed = batchwire.encode_request(bodies, [None, ("m", "2")])
    assert batchwire.decode_request_items(framed) == (bodies, [None, ("m", "2")])
    assert batchwire.decode_request(framed) == bodies
    # a replica from before `models` looks for `sizes` only: it must refuse such a call, not misread it
    assert b'"sizes"' not in framed.split(b"\n")[0]
    for models in ([None], [None, 3], [None, ["m"]], [None, [1, None]], "x"):
        head = orjson.dumps({"sizes": [len(b) for b in bodies], "models": models})
        with pytest.raises(batchwire.BatchWireError):
            batchwire.decode_request_items(head + b"\n" + b"".join(bodies))


def test_v2_shaped_turns_only_server_side_native_refusals() -> None:
    assert v2_shaped(503, b'{"detail":"upstream replicas failed; try again"}') == (
        503, b'{"error":"upstream replicas failed; try again"}')
    assert v2_shaped(504, b'{"detail": "upstream replica timed out"}')[1] == b'{"error":"upstream replica timed out"}'
    for answer in ((404, b'{"error":"unknown model"}'), (503, b'{"error":"loading"}'), (200, b'{"detail":"x"}'),
                   (502, b"bad gateway")):
        assert v2_shaped(*answer) == answer


def test_documented_v2_schema_matches_the_checks() -> None:
    """The pydantic models document the v2 body; oip.parse_infer checks it: they must name the same
    datatypes and fields, so the document cannot drift from what is accepted."""
    from typing import get_args

    from scanflow.serving import oip, openapi

    assert set(get_args(openapi.Datatype)) == set(oip.DATATYPES)
    assert set(openapi.InferInput.model_fields) == {"name", "shape", "datatype", "parameters", "data"}
    assert set(openapi.InferRequest.model_fields) == {"id", "parameters", "inputs", "outputs"}
    assert set(openapi.RequestedOutput.model_fields) == {"name", "parameters"}
