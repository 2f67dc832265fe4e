"""What the OpenAPI documents of Scanflow's FastAPI apps say about errors, made true to what they answer.

Why: FastAPI documents every 422 as `{"detail": [validation errors]}`, but our routes also answer 422
with a message (`HTTPException(422, "...")`: an invalid strategy constraint, a body the Tracker parsed by
hand, a model URI the replica refuses), and FastAPI itself answers 400 "There was an error parsing the
body" to a JSON body it cannot decode (not UTF-8), a status no document listed. schemathesis (`--checks all`,
tests/contracts/test_schemathesis.py) reported both as conformance failures. `document_errors` fixes the
documents: `detail` is a message or the list of errors, and every route with a JSON body lists 400.

Who calls: scanflow.agent.app.create_app (the agents) and scanflow.serving.openapi.install (the
replica's and gateway's FastAPI routes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi.routing import APIRoute

_BAD_JSON = {
    "description": "the body could not be parsed (e.g. not UTF-8)",
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}}}}},
}


def document_errors(doc: dict[str, Any], routes: Iterable[Any]) -> dict[str, Any]:
    """Pure (mutates and returns `doc`): `HTTPValidationError.detail` is a string or FastAPI's list;
    each operation of an `APIRoute` in `routes` that FastAPI parses a body for documents 400."""
    schemas = doc.get("components", {}).get("schemas", {})
    validation = schemas.get("HTTPValidationError", {}).get("properties", {})
    if "detail" in validation and "anyOf" not in validation["detail"]:
        listed = {k: v for k, v in validation["detail"].items() if k != "title"}
        validation["detail"] = {"title": "Detail", "description": "a message, or the list of validation errors",
                                "anyOf": [{"type": "string"}, listed]}
    paths = doc.get("paths", {})
    for route in routes:
        if not isinstance(route, APIRoute) or route.body_field is None:
            continue
        for method in route.methods or ():
            op = paths.get(route.path_format, {}).get(method.lower())
            if op is not None:
                op.setdefault("responses", {}).setdefault("400", _BAD_JSON)
    return doc
