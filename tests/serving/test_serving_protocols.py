"""The standard protocols on real replica and gateway processes (loopback): Open Inference Protocol v2
conformance, written from the protocol's spec as a hand-written HTTP client; MLflow's scoring format
(`/invocations`); probabilities on /predict; the OpenAPI document lists every route. Plus the pure
parts (tensor checks, the probability rule) without a network."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from serving_helpers import free_port, wait_for
from test_serving_replica import TrackerStub, _serve_in_thread

from scanflow.serving import gateway_server, invocations, oip, replica_server
from scanflow.serving.invocations import ScoringError, parse_invocation
from scanflow.serving.model import as_probabilities

DIGITS = "serving-digits"  # the registered name of the session's digits MLP (tests/conftest.py)


class OipClient:
    """Open Inference Protocol v2 over REST, from the spec: health, metadata, infer. No SDK."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = httpx.Client(base_url=base, timeout=30)

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def live(self) -> httpx.Response:
        return self.get("/v2/health/live")

    def ready(self) -> httpx.Response:
        return self.get("/v2/health/ready")

    def server_metadata(self) -> httpx.Response:
        return self.get("/v2")

    def model_metadata(self, name: str, version: str | None = None) -> httpx.Response:
        return self.get(f"/v2/models/{name}" + (f"/versions/{version}" if version else ""))

    def model_ready(self, name: str) -> httpx.Response:
        return self.get(f"/v2/models/{name}/ready")

    def infer(self, name: str, body: Any, version: str | None = None) -> httpx.Response:
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.http.post(path, content=content, headers={"Content-Type": "application/json"})


def tensor(rows: list[list[float]], name: str = "input", datatype: str = "FP32", flat: bool = True,
           shape: list[int] | None = None) -> dict[str, Any]:
    data: list[Any] = [v for r in rows for v in r] if flat else rows
    return {"name": name, "datatype": datatype, "shape": shape or [len(rows), len(rows[0])], "data": data}


def assert_error(resp: httpx.Response, status: int, fragment: str = "") -> None:
    assert resp.status_code == status, resp.text
    doc = resp.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str) and fragment in doc["error"], doc


@pytest.fixture
def tracker() -> Iterator[tuple[TrackerStub, int]]:
    stub, port = TrackerStub(), free_port()
    server, thread = _serve_in_thread(stub.app, port)
    try:
        yield stub, port
    finally:
        server.should_exit = True
        thread.join(10)


def _conformance(c: OipClient, rows: list[list[float]], expected: list[int], tag: str) -> list[str]:
    """The OIP checks on one endpoint (replica or gateway); returns the ids of the served infers."""
    assert c.live().status_code == 200 and c.live().json() == {"live": True}
    assert c.ready().status_code == 200 and c.ready().json() == {"ready": True}
    server = c.server_metadata().json()
    assert server["name"] == "scanflow" and isinstance(server["version"], str) and server["extensions"] == []

    meta = c.model_metadata(DIGITS)
    assert meta.status_code == 200, meta.text
    m = meta.json()
    assert m["name"] == DIGITS and m["versions"] == ["1"] and m["platform"] == "mlflow_pytorch"
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert m["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [-1]},
                            {"name": "probabilities", "datatype": "FP64", "shape": [-1, 10]}]
    assert c.model_metadata("digits").json() == m  # the service name is an alias
    assert c.model_metadata(DIGITS, "1").json() == m
    assert c.model_ready(DIGITS).status_code == 200 and c.model_ready(DIGITS).json()["ready"] is True

    ids = []
    ok = c.infer(DIGITS, {"id": f"{tag}-1", "parameters": {"x": 1}, "inputs": [tensor(rows[:3])]})
    assert ok.status_code == 200, ok.text
    doc = ok.json()
    assert doc["model_name"] == DIGITS and doc["model_version"] == "1" and doc["id"] == f"{tag}-1"
    assert len(doc["parameters"]["request_id"]) == 32 != len(doc["id"])  # the record's own id, for feedback
    label, probs = doc["outputs"]
    assert label == {"name": "label", "datatype": "INT64", "shape": [3], "data": expected[:3]}
    assert probs["name"] == "probabilities" and probs["datatype"] == "FP64" and probs["shape"] == [3, 10]
    p = np.asarray(probs["data"]).reshape(3, 10)
    assert np.allclose(p.sum(axis=1), 1.0) and (p >= 0).all() and list(p.argmax(axis=1)) == expected[:3]
    ids.append(f"{tag}-1")

    nested = c.infer("digits", {"id": f"{tag}-2", "inputs": [tensor(rows[3:5], flat=False)],
                                "outputs": [{"name": "label"}]}, version="1")
    assert nested.status_code == 200, nested.text
    assert nested.json()["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [2], "data": expected[3:5]}]
    ids.append(f"{tag}-2")
    plain = c.infer(DIGITS, {"id": f"{tag}-3", "inputs": [tensor(rows[5:6])]})
    assert plain.status_code == 200 and plain.json()["outputs"][0]["data"] == expected[5:6]
    ids.append(f"{tag}-3")
    generated = c.infer(DIGITS, {"inputs": [tensor([[1] * 64])]})
    assert generated.status_code == 200 and generated.json()["id"]  # an id is generated when none is given
    for datatype in ("FP64", "INT8", "INT64"):  # the signature declares FP32: what metadata publishes holds
        other = c.infer(DIGITS, {"inputs": [tensor([[1] * 64], datatype=datatype)]})
        assert other.status_code == 400 and f"is {datatype}; the model's signature declares FP32" in other.text

    bad = [
        ({"inputs": [tensor(rows[:2], shape=[2, 63])]}, "needs 126 values"),
        ({"inputs": [tensor([r[:63] for r in rows[:2]])]}, "the model takes [-1, 64]"),
        ({"inputs": [tensor(rows[:2], shape=[128])]}, "has shape [128]"),
        ({"inputs": [{**tensor(rows[:1]), "data": ["a"] * 64, "datatype": "BYTES"}]}, "BYTES is not accepted"),
        ({"inputs": [tensor(rows[:1], datatype="FP33")]}, "unknown datatype"),
        ({"inputs": [tensor(rows[:1], datatype="INT32")]}, "INT32 data must be integers"),
        ({"inputs": [{**tensor(rows[:1]), "data": [None] * 64}]}, "must be FP32 numbers"),
        ({"inputs": [tensor(rows[:1], name="pixels")]}, "one input tensor"),
        ({"inputs": []}, "non-empty list"),
        ({"inputs": [tensor(rows[:1])], "outputs": [{"name": "logits"}]}, "unknown output"),
        ({"inputs": [tensor(rows[:1])], "id": 7}, "'id' must be a string"),
        (b"not json", "not valid JSON"),
    ]
    for body, fragment in bad:
        assert_error(c.infer(DIGITS, body), 400, fragment)
    assert_error(c.model_metadata("nope"), 404, "unknown model")
    assert_error(c.model_ready("nope"), 404, "unknown model")
    assert_error(c.infer("nope", {"inputs": [tensor(rows[:1])]}), 404, "unknown model")
    assert_error(c.infer(DIGITS, {"inputs": [tensor(rows[:1])]}, version="99"), 404, "no version '99'")
    return ids


@pytest.mark.slow
async def test_oip_v2_conformance_on_replica_and_gateway_records_and_failover(  # type: ignore[no-untyped-def]
    digits_models, launch, digits_rows, tracker
) -> None:
    stub, port = tracker
    common = ("--model-uri", digits_models["v1"], "--allow-anonymous", "--service", "digits",
              "--tracker-url", f"http://127.0.0.1:{port}")
    def start_replica(replica_id: str) -> Any:
        return launch("replica", *common, "--replica-id", replica_id)

    r1 = await asyncio.to_thread(start_replica, "r1")
    r2 = await asyncio.to_thread(start_replica, "r2")
    gw = await asyncio.to_thread(launch, "gateway", "--service", "digits", "--replica", r1.url,
                                 "--replica", r2.url, "--health-interval-s", "0.5", "--allow-anonymous")
    rows = digits_rows[:8]
    expected = (await asyncio.to_thread(httpx.post, r1.url + "/predict", json={"inputs": rows})).json()["outputs"]
    ids = await asyncio.to_thread(_conformance, OipClient(r1.url), rows, expected, "rep")
    ids += await asyncio.to_thread(_conformance, OipClient(gw.url), rows, expected, "gw")

    # Through the gateway infer requests are balanced and fail over like /predict: kill r1, lose none.
    c = OipClient(gw.url)
    before = {r["url"]: r["requests"] for r in (await asyncio.to_thread(httpx.get, gw.url + "/admin/state")).json()["replicas"]}
    for i in range(6):
        resp = await asyncio.to_thread(c.infer, DIGITS, {"id": f"bal-{i}", "inputs": [tensor(rows[:1])]})
        assert resp.status_code == 200 and resp.headers["x-scanflow-upstream"] in (r1.url, r2.url)
        ids.append(f"bal-{i}")
    after = {r["url"]: r["requests"] for r in (await asyncio.to_thread(httpx.get, gw.url + "/admin/state")).json()["replicas"]}
    assert all(after[u] > before[u] for u in (r1.url, r2.url)), (before, after)
    # r1's records must be out before it dies (a replica keeps unsent records in memory).
    await wait_for(lambda: set(ids) <= {r["client_request_id"] for r in stub.records}, 20, "records before the kill")
    r1.popen.send_signal(signal.SIGKILL)
    r1.popen.wait(5)
    for i in range(6):
        resp = await asyncio.to_thread(c.infer, DIGITS, {"id": f"fo-{i}", "inputs": [tensor(rows[:1])]})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-scanflow-upstream"] == r2.url
        ids.append(f"fo-{i}")
    counted = [x for x in (await asyncio.to_thread(httpx.get, gw.url + "/metrics")).text.splitlines()
               if x.startswith("scanflow_gateway_requests_total{") and 'status="200"' in x and "primary" in x]
    assert counted and float(counted[0].split()[-1]) == 16  # 4 + 6 + 6 infers, each counted once

    # Exactly one Tracker record per served infer request, under the infer id.
    await wait_for(lambda: set(ids) <= {r["client_request_id"] for r in stub.records}, 20, "records")
    # stop the serving replica (SIGTERM: it drains and hands its sink's last records over), so no record
    # can still be on its way when they are counted
    r2.popen.send_signal(signal.SIGTERM)
    r2.popen.wait(30)
    mine = [r for r in stub.records if r["client_request_id"] in set(ids)]
    assert sorted(r["client_request_id"] for r in mine) == sorted(ids)
    rec = next(r for r in mine if r["client_request_id"] == "gw-1")
    assert rec["outputs"] == expected[:3] and len(rec["inputs"]) == 3 and rec["service"] == "digits"


def test_replica_not_ready_until_the_model_is_in(digits_models, launch) -> None:  # type: ignore[no-untyped-def]
    r = launch("replica", "--model-uri", "models:/no-such-model@champion", "--allow-anonymous", wait=False)
    r.wait_ready("/health")
    c = OipClient(r.url)
    assert c.live().status_code == 200
    assert c.ready().status_code == 400 and c.ready().json() == {"ready": False}
    assert c.model_ready("no-such-model").status_code == 400
    assert_error(c.model_metadata("no-such-model"), 503, "not loaded yet")
    assert_error(c.infer("no-such-model", {"inputs": [tensor([[0.0] * 64])]}), 503, "not loaded yet")
    assert_error(c.model_metadata("other"), 404, "unknown model")


async def test_mlflow_scoring_format_probabilities_and_openapi(digits_models, launch, digits_rows) -> None:  # type: ignore[no-untyped-def]
    r = await asyncio.to_thread(launch, "replica", "--model-uri", digits_models["v1"], "--allow-anonymous")
    gw = await asyncio.to_thread(launch, "gateway", "--replica", r.url, "--allow-anonymous")
    rows = digits_rows[:4]
    cols = [f"f{i}" for i in range(64)]
    async with httpx.AsyncClient(timeout=30) as http:
        expected = (await http.post(r.url + "/predict", json={"inputs": rows})).json()["outputs"]
        for url in (r.url, gw.url):
            bodies: list[dict[str, Any]] = [
                {"dataframe_split": {"columns": cols, "data": rows}},
                {"dataframe_split": {"data": rows, "index": [0, 1, 2, 3]}},
                {"dataframe_records": [dict(zip(cols, row, strict=True)) for row in rows]},
                {"instances": rows},
                {"inputs": rows},
            ]
            made: set[str] = set()
            for body in bodies:
                resp = await http.post(url + "/invocations", json=body)
                assert resp.status_code == 200, (url, list(body), resp.text)
                answer = resp.json()
                assert answer["predictions"] == expected and "client_request_id" not in answer
                made.add(answer["request_id"])  # server-made, as on /predict
            csv = ",".join(cols) + "\n" + "\n".join(",".join(str(v) for v in row) for row in rows)
            resp = await http.post(url + "/invocations", content=csv, headers={"Content-Type": "text/csv"})
            assert resp.status_code == 200 and resp.json()["predictions"] == expected, resp.text
            made.add(resp.json()["request_id"])
            # the client's own id (body, or X-Request-Id: the only way with CSV) is echoed, never the record's id
            for kwargs, mine in (({"json": {"instances": rows, "request_id": "inv-body"}}, "inv-body"),
                                 ({"json": {"instances": rows}, "headers": {"X-Request-Id": "inv-hdr"}}, "inv-hdr"),
                                 ({"content": csv, "headers": {"Content-Type": "text/csv", "X-Request-Id": "inv-csv"}},
                                  "inv-csv"),
                                 ({"json": {"instances": rows, "request_id": "inv-wins"},
                                   "headers": {"X-Request-Id": "ignored"}}, "inv-wins")):
                resp = await http.post(url + "/invocations", **kwargs)
                assert resp.status_code == 200, resp.text
                answer = resp.json()
                assert answer["client_request_id"] == mine and answer["request_id"] != mine
                assert answer["predictions"] == expected
                made.add(answer["request_id"])
            assert len(made) == len(bodies) + 5  # one fresh id per request
            for bad in ({"instances": rows, "request_id": ""}, {"instances": rows, "request_id": 7},
                        {"instances": rows, "request_id": "x" * 201}):
                resp = await http.post(url + "/invocations", json=bad)
                assert resp.status_code == 400 and "request_id" in resp.json()["message"], resp.text
            for raw, status, fragment in [
                (b"{}", 400, "exactly one of"),
                (b'{"instances": [[1, 2]]}', 400, "64 features"),
                (b'{"instances": [[1, 2]], "params": {"k": 1}}', 400, "params"),
                (b"nope", 400, "not valid JSON"),
            ]:
                resp = await http.post(url + "/invocations", content=raw, headers={"Content-Type": "application/json"})
                assert resp.status_code == status, resp.text
                assert resp.json()["error_code"] == "BAD_REQUEST" and fragment in resp.json()["message"]
            resp = await http.post(url + "/invocations", content=b"x", headers={"Content-Type": "text/plain"})
            assert resp.status_code == 415 and resp.json()["error_code"] == "UNSUPPORTED_MEDIA_TYPE"
            assert (await http.get(url + "/ping")).status_code == 200

            # "probabilities": true answers a distribution per row (softmax of the MLP's logits), alone and
            # in the gateway's coalesced calls.
            answers = await asyncio.gather(*(
                http.post(url + "/predict", json={"inputs": rows[i : i + 2], "probabilities": True}) for i in range(3)
            ))
            for i, resp in enumerate(answers):
                p = np.asarray(resp.json()["probabilities"])
                assert p.shape == (2, 10) and (p >= 0).all() and np.allclose(p.sum(axis=1), 1.0)
                assert list(p.argmax(axis=1)) == expected[i : i + 2]

        # Every route of each process is in its OpenAPI document, with request and answer schemas.
        for url, app in ((r.url, _replica_app()), (gw.url, _gateway_app())):
            doc = (await http.get(url + "/openapi.json")).json()
            assert _routes(app) <= {(p, m) for p, ops in doc["paths"].items() for m in ops}
            assert doc["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/PredictBody"}
            assert "InferRequest" in doc["components"]["schemas"] and "PredictAnswer" in doc["components"]["schemas"]


def _replica_app() -> Any:
    config = replica_server.ReplicaConfig(model_uri=f"models:/{DIGITS}/1", service="digits")
    return replica_server.create_app(config)


def _gateway_app() -> Any:
    return gateway_server.create_app(gateway_server.GatewayConfig(service="digits"))


def _routes(app: Any) -> set[tuple[str, str]]:
    """(path, method) of every route the process answers: its FastAPI routes and its raw hot paths."""
    out = {(path, "post") for path in app.hot}
    for route in app.api.routes:
        if getattr(route, "include_in_schema", False):
            out |= {(route.path, m.lower()) for m in route.methods}
    return out


def test_openapi_lists_every_route_in_process() -> None:
    for app in (_replica_app(), _gateway_app()):
        doc = app.api.openapi()
        listed = {(p, m) for p, ops in doc["paths"].items() for m in ops}
        routes = _routes(app)
        assert routes <= listed and len(routes) >= 18
        for path in ("/predict", "/v2/models/{name}/infer", "/invocations"):
            op = doc["paths"][path]["post"]
            assert "requestBody" in op and "200" in op["responses"] and "422" not in op["responses"] or path == "/predict"


# ---- pure parts ------------------------------------------------------------------------------------


def _meta() -> oip.ModelMeta:
    return oip.ModelMeta("m", "1", "mlflow_pytorch", [oip.TensorMeta("input", "FP32", [-1, 3])],
                         [oip.TensorMeta("label", "INT64", [-1]), oip.TensorMeta("probabilities", "FP64", [-1, 2])])


def test_parse_infer_tensors() -> None:
    call = oip.parse_infer(orjson.dumps({"id": "a", "inputs": [
        {"name": "input", "shape": [2, 3], "datatype": "UINT8", "data": [1, 2, 3, 4, 5, 6]}]}), _meta(), max_rows=10)
    assert call.rows.tolist() == [[1, 2, 3], [4, 5, 6]] and call.request_id == "a" and call.outputs is None
    assert orjson.loads(call.native_body()) == {"inputs": [[1, 2, 3], [4, 5, 6]], "request_id": "a", "probabilities": True}
    for data, datatype, fragment, status in [
        ([300, 0, 0], "UINT8", "out of range", 400),
        ([1e39, 0, 0], "FP32", "out of range", 400),
        ([True, False, True], "FP32", "must be FP32 numbers", 400),
        ([[1, 2], [3]], "FP32", "must be FP32 numbers", 400),
    ]:
        with pytest.raises(oip.OipError) as err:
            oip.parse_infer(orjson.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": datatype,
                                                      "data": data}]}), _meta(), max_rows=10)
        assert err.value.status == status and fragment in err.value.message
    nan = b'{"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP64", "data": [NaN, 0, 0]}]}'
    with pytest.raises(oip.OipError, match="NaN"):
        oip.parse_infer(nan, _meta(), max_rows=10)
    with pytest.raises(oip.OipError) as err:
        oip.parse_infer(orjson.dumps({"inputs": [{"name": "input", "shape": [11, 3], "datatype": "FP32",
                                                  "data": [0] * 33}]}), _meta(), max_rows=10)
    assert err.value.status == 413
    declared = dataclasses.replace(_meta(), declared=True)  # inputs from a signature: datatypes checked
    with pytest.raises(oip.OipError, match="is UINT8; the model's signature declares FP32"):
        oip.parse_infer(orjson.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "UINT8",
                                                  "data": [1, 2, 3]}]}), declared, max_rows=10)
    columns = oip.ModelMeta("m", "1", "mlflow_python_function",
                            [oip.TensorMeta("a", "FP64", [-1]), oip.TensorMeta("b", "FP64", [-1])], [], columns=True)
    call = oip.parse_infer(orjson.dumps({"inputs": [{"name": "b", "shape": [2], "datatype": "FP64", "data": [3, 4]},
                                                    {"name": "a", "shape": [2, 1], "datatype": "FP64", "data": [1, 2]}]}),
                           columns, max_rows=10)
    assert call.rows.tolist() == [[1, 3], [2, 4]]


def test_invocations_request_id_pure() -> None:
    rows, mine = invocations.parse_scoring(b'{"inputs": [[1]], "request_id": "a"}', "application/json", None, "h")
    assert rows == [[1]] and mine == "a"  # the body's own id wins over the header's
    assert invocations.parse_scoring(b'{"inputs": [[1]]}', "", None, "h")[1] == "h"
    assert invocations.parse_scoring(b'{"inputs": [[1]]}', "", None)[1] is None
    with pytest.raises(ScoringError, match="lone surrogates"):
        invocations.parse_scoring(b'{"inputs": [[1]], "request_id": "\\ud800"}', "", None)
    assert invocations.scoring_answer({"outputs": [1], "request_id": "r", "client_request_id": None}) == {
        "predictions": [1], "request_id": "r"}
    assert invocations.scoring_answer({"outputs": [1], "request_id": "r", "client_request_id": "c"})[
        "client_request_id"] == "c"
    assert invocations.body_with_request_id(b"nope", "h") == b"nope"
    assert invocations.body_with_request_id(b'{"inputs": [], "request_id": "a"}', "h") == b'{"inputs":[],"request_id":"a"}'
    assert b'"request_id":"h"' in invocations.body_with_request_id(b'{"inputs": []}', "h")


def test_invocations_column_order_and_errors() -> None:
    assert parse_invocation(b'{"dataframe_split": {"columns": ["b", "a"], "data": [[2, 1]]}}',
                            "application/json", ["a", "b"]) == [[1, 2]]
    assert parse_invocation(b'{"dataframe_records": [{"b": 2, "a": 1}]}', "application/json", ["a", "b"]) == [[1, 2]]
    assert parse_invocation(b'{"inputs": {"a": [1, 3], "b": [2, 4]}}', "application/json", ["a", "b"]) == [[1, 2], [3, 4]]
    assert parse_invocation(b"a,b\n1,2\n", "text/csv; charset=utf-8", None) == [[1.0, 2.0]]
    with pytest.raises(ScoringError, match="lacks column"):
        parse_invocation(b'{"dataframe_records": [{"a": 1}]}', "application/json", ["a", "b"])


def test_probability_rule() -> None:
    logits = np.array([[-0.119, -1.844, 2.0], [0.2, 0.3, 0.5]], dtype=np.float32)
    p = as_probabilities(logits)
    assert np.allclose(p.sum(axis=1), 1.0) and p.argmax(axis=1).tolist() == [2, 2]
    assert np.allclose(p[1], [0.2, 0.3, 0.5])  # already a distribution: kept
    e = np.exp(logits[0] - logits[0].max())
    assert np.allclose(p[0], e / e.sum())
    assert np.allclose(as_probabilities(np.array([[1000.0, 0.0]])), [[1.0, 0.0]])  # no overflow
