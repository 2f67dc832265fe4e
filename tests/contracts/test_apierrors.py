"""The OpenAPI documents say what our routes answer on errors (scanflow.apierrors): `detail` is a
message or FastAPI's list, and a route with a JSON body lists FastAPI's 400 for a body it cannot parse."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from scanflow.agent import Agent, create_app
from scanflow.apierrors import document_errors
from scanflow.settings import Settings


class Body(BaseModel):
    x: int


def test_a_body_route_documents_400_and_a_string_detail() -> None:
    api = FastAPI()

    @api.post("/thing")
    def thing(body: Body) -> dict[str, int]:
        return {"x": body.x}

    @api.get("/plain")
    def plain(q: int = 0) -> dict[str, int]:
        return {"q": q}

    doc = document_errors(api.openapi(), api.routes)
    assert doc["paths"]["/thing"]["post"]["responses"]["400"]["description"] == "the body could not be parsed (e.g. not UTF-8)"
    assert "400" not in doc["paths"]["/plain"]["get"]["responses"]  # no body, no parse error
    detail = doc["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
    assert detail["anyOf"][0] == {"type": "string"} and detail["anyOf"][1]["type"] == "array"
    # what is now documented: a body that is not UTF-8 is FastAPI's 400
    assert TestClient(api).post("/thing", content=b"{\"x\": \"\xff\"}", headers={"content-type": "application/json"}
                                ).status_code == 400


def test_an_agents_openapi_documents_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    app = create_app(Agent("doc"), Settings(token="t", home=tmp_path))
    doc = TestClient(app).get("/openapi.json").json()
    for path in ("/events", "/strategies", "/actuators/{name}"):
        assert "400" in doc["paths"][path]["post"]["responses"], path
    assert "anyOf" in doc["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
