"""The OpenAPI document of replicas and gateways (`GET /openapi.json`): request and response schemas of
every route, the raw ASGI hot paths included.

Why a module of its own: `POST /predict` and `/predict_batch` never pass through FastAPI (their speed
depends on it), so FastAPI cannot see them, and the protocol routes read their bodies themselves (to
answer bad input with the protocol's error shape rather than FastAPI's 422). Both are described here
with pydantic models and merged into the generated document. Who calls: scanflow.serving.protocols.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from scanflow.apierrors import document_errors

# ---- native ---------------------------------------------------------------------------------------


class PredictBody(BaseModel):
    """POST /predict."""

    inputs: list[list[float]] = Field(description="rows of features (the model's signature says how many)")
    request_id: str | None = Field(None, max_length=200, description="the client's own id: echoed as "
                                   "`client_request_id`, kept in the record, never the record's identity")
    probabilities: bool = Field(False, description="also answer class probabilities (softmax of logits)")


class PredictAnswer(BaseModel):
    outputs: list[float | int] = Field(description="class (classifiers) or value per row")
    model_version: str
    request_id: str = Field(description="made by the replica (unguessable): the Tracker record's id; "
                                        "send feedback by it")
    client_request_id: str | None = Field(None, description="the request_id the client sent, if any")
    probabilities: list[list[float]] | None = Field(None, description="per row, summing to 1 (when asked)")


class NativeError(BaseModel):
    detail: str


# ---- Open Inference Protocol v2 -----------------------------------------------------------------

Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                   "FP16", "FP32", "FP64", "BYTES"]


class InferInput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: dict[str, Any] | None = None
    data: list[Any] = Field(description="flat (row-major) or nested as 'shape' says")


class RequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    id: str | None = Field(None, description="echoed; the Tracker record's request id")
    parameters: dict[str, Any] | None = None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None = None


class InferOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: dict[str, Any] | None = None
    data: list[Any]


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[InferOutput]


class MetadataTensor(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = []
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool


class OipErrorBody(BaseModel):
    error: str


# ---- MLflow scoring --------------------------------------------------------------------------------


class DataframeSplit(BaseModel):
    columns: list[str] | None = None
    data: list[list[Any]]
    index: list[Any] | None = None


class InvocationRequest(BaseModel):
    """Exactly one of the four formats `mlflow models serve` accepts."""

    dataframe_split: DataframeSplit | None = None
    dataframe_records: list[dict[str, Any]] | None = None
    instances: list[Any] | None = None
    inputs: list[Any] | dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    request_id: str | None = Field(None, max_length=200, description="the client's own id (or the X-Request-Id "
                                   "header): echoed as `client_request_id`, never the record's identity")


class InvocationResponse(BaseModel):
    predictions: list[Any]
    request_id: str = Field(description="made by the replica (unguessable): the Tracker record's id; "
                            "send it with feedback")
    client_request_id: str | None = Field(None, description="the request_id the client sent, if any")


class MlflowError(BaseModel):
    error_code: str
    message: str


MODELS: tuple[type[BaseModel], ...] = (
    PredictBody, PredictAnswer, NativeError, InferRequest, InferResponse, ModelMetadata, ServerMetadata,
    Live, Ready, ModelReady, OipErrorBody, InvocationRequest, InvocationResponse, MlflowError,
)


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": ref(model)}}}


def answers(spec: dict[int, tuple[str, type[BaseModel] | None]]) -> dict[str, Any]:
    """{status: (description, model or None)} -> an OpenAPI `responses` object."""
    out: dict[str, Any] = {}
    for status, (desc, model) in spec.items():
        out[str(status)] = {"description": desc}
        if model is not None:
            out[str(status)]["content"] = {"application/json": {"schema": ref(model)}}
    return out


_NATIVE_ERRORS = {413: ("body or row count over the limit", NativeError),
                  422: ("malformed input, named in the message", NativeError),
                  503: ("model loading or replica draining", NativeError)}

HOT_PATHS: dict[str, dict[str, Any]] = {
    "/predict": {"post": {
        "summary": "Predict (native format)", "tags": ["native"],
        "requestBody": json_body(PredictBody),
        "responses": answers({200: ("one output per row", PredictAnswer), **_NATIVE_ERRORS}),
    }},
    "/predict_batch": {"post": {
        "summary": "Coalesced predict calls from the gateway", "tags": ["native"],
        "description": "Request `{\"sizes\": [n1, ...]}\\n` then the client bodies back to back (with OIP v2 "
                       "infer items: `{\"infer_sizes\": [...], \"models\": [null or [name, version], ...]}`); answer "
                       "`{\"model_version\", \"items\": [[status, length], ...]}\\n` then the answers "
                       "(scanflow.serving.batchwire).",
        "requestBody": {"required": True, "content": {"application/x-scanflow-batch": {
            "schema": {"type": "string", "format": "binary"}}}},
        "responses": {"200": {"description": "one answer per body, in order", "content": {
            "application/x-scanflow-batch": {"schema": {"type": "string", "format": "binary"}}}},
            "400": {"description": "bad framing", "content": {"application/json": {"schema": ref(NativeError)}}},
            "413": {"description": "call over the limit"}, "503": {"description": "loading or draining"}},
    }},
}


PROTOCOL_PREFIXES = ("/v2", "/invocations", "/ping")


def install(api: FastAPI, hot_paths: Iterable[str], extra: dict[str, dict[str, Any]] | None = None) -> None:
    """Make `api.openapi()` list the raw `hot_paths` too, with the schemas of MODELS, and merge `extra`
    (path -> method -> operation fields) into the generated operations of FastAPI routes."""

    def openapi() -> dict[str, Any]:
        if api.openapi_schema:
            return api.openapi_schema
        doc = get_openapi(title=api.title, version=api.version, routes=api.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in MODELS:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in schema.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas.setdefault(model.__name__, schema)
        paths = doc.setdefault("paths", {})
        for path in hot_paths:
            paths.setdefault(path, {}).update(HOT_PATHS[path])
        for path, ops in (extra or {}).items():
            for method, fields in ops.items():
                paths.setdefault(path, {}).setdefault(method, {}).update(fields)
        for path, ops in paths.items():  # these read their bodies by hand: FastAPI's 422 never happens
            if path.startswith(PROTOCOL_PREFIXES):
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
        api.openapi_schema = document_errors(doc, api.routes)
        return doc

    api.openapi = openapi  # type: ignore[method-assign]
