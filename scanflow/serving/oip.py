"""Open Inference Protocol v2 (the REST API that KServe, Seldon MLServer and Triton clients speak):
the pure part, no I/O. Who calls: scanflow.serving.protocols, which mounts the routes on replicas and
gateways.

A replica never runs a second prediction path for this protocol: an infer request is checked here
against the model's metadata, turned into a native `/predict` body (rows, `request_id` = the infer
`id`, probabilities only when an output needs them), answered by the replica's own `/predict` handler
(micro-batching, drain, metrics, one Tracker record), and the native answer is turned back into output
tensors here. So the protocol costs the native hot path nothing and cannot drift from it.

Names. A service serves one model, published under its **registered model name** (`digits` for
`models:/digits@champion`); the service name (`--service`) is accepted as an alias for `{name}`, so a
client that knows only the service can still call it. A model loaded from a `runs:/` or path URI has
no registered name and is published under the service name. `versions` lists the one version loaded;
`/versions/{v}/...` must name it (404 otherwise: a hot swap moved on).

Tensors. Inputs and outputs are named tensors `{name, datatype, shape, data}`; `data` may be flat
(row-major) or nested as `shape` says. A tensor's datatype must be the one the model's MLflow
signature declares for that input (as the protocol's servers do: what metadata publishes is the
contract); a model without a signature takes any numeric datatype (FP16/32/64, INT8..64, UINT8..64).
Either way the data must fit the datatype (no 0.5 in an INT32 tensor) and is cast to the model's
float32 rows; BOOL and BYTES are refused. Outputs: a classifier answers `label` (INT64, [n]) and
`probabilities` (FP64, [n, classes]); any other model `prediction` ([n], the signature's datatype).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from scanflow.serving.model import LoadedModel, registered_name

# OIP datatype -> numpy dtype (BYTES: strings, never accepted by a numeric model).
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
NUMERIC = frozenset(DATATYPES) - {"BOOL", "BYTES"}
_BY_DTYPE = {dt: name for name, dt in DATATYPES.items() if name != "BYTES"}
MAX_ID_CHARS = 200  # the native request_id limit, which the infer `id` becomes


class OipError(Exception):
    """A request refused with `status` and the protocol's error body `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> bytes:
        return error_body(self.message)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def datatype_of(dtype: Any) -> str:
    """numpy dtype -> OIP datatype (strings and anything unknown -> BYTES)."""
    try:
        return _BY_DTYPE.get(np.dtype(dtype), "BYTES")
    except TypeError:
        return "BYTES"


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: list[int]

    def doc(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": self.shape}


@dataclass(frozen=True)
class ModelMeta:
    """What `GET /v2/models/{name}` publishes, and what an infer request is checked against."""

    name: str
    version: str | None
    platform: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    columns: bool = False  # the signature names columns: one [n] tensor per column, stacked in order
    aliases: frozenset[str] = field(default_factory=frozenset)
    declared: bool = False  # the inputs come from the model's signature: their datatypes are checked

    def doc(self) -> dict[str, object]:
        return {
            "name": self.name,
            "versions": [self.version] if self.version else [],
            "platform": self.platform,
            "inputs": [t.doc() for t in self.inputs],
            "outputs": [t.doc() for t in self.outputs],
        }

    def answers_to(self, name: str, version: str | None = None) -> bool:
        return (name == self.name or name in self.aliases) and (version is None or version == self.version)

    @property
    def n_features(self) -> int | None:
        if self.columns:
            return len(self.inputs)
        shape = self.inputs[0].shape if len(self.inputs) == 1 else []
        return shape[1] if len(shape) == 2 and shape[1] > 0 else None


def model_name(model_uri: str, service: str) -> str:
    """The name a service's model is published under: its registered name, else the service name."""
    return registered_name(model_uri) or service


def metadata(model: LoadedModel, service: str) -> ModelMeta:
    """The model's metadata, from its MLflow signature (inputs as named tensors with datatype and
    shape; -1 = any size). Without a signature: one FP32 tensor `input` of [-1, n_features]."""
    name = model.name or service
    sig = model.signature
    inputs, columns = _schema_tensors(getattr(sig, "inputs", None), "input")
    declared = bool(inputs)
    if not inputs:
        inputs = [TensorMeta("input", "FP32", [-1, model.n_features or -1])]
    return ModelMeta(
        name=name,
        version=model.version,
        platform=f"mlflow_{model.flavor}",
        inputs=inputs,
        outputs=_output_tensors(getattr(sig, "outputs", None)),
        columns=columns and len(inputs) > 1,
        aliases=frozenset({service}),
        declared=declared,
    )


def _schema_tensors(schema: Any, default: str) -> tuple[list[TensorMeta], bool]:
    """MLflow Schema -> tensors: a tensor spec keeps its shape; a column becomes a [-1] tensor."""
    specs = getattr(schema, "inputs", None)
    if not specs:
        return [], False
    try:
        if schema.is_tensor_spec():
            return [
                TensorMeta(s.name or (default if len(specs) == 1 else f"{default}-{i}"), datatype_of(s.type),
                           [int(d) for d in s.shape])
                for i, s in enumerate(specs)
            ], False
        return [
            TensorMeta(c.name or f"{default}-{i}", datatype_of(c.type.to_numpy()), [-1])
            for i, c in enumerate(specs)
        ], True
    except Exception:  # noqa: BLE001 - an exotic schema (arrays, objects): publish what we can infer instead
        return [], False


def _output_tensors(schema: Any) -> list[TensorMeta]:
    """What infer answers: label + probabilities for per-class outputs ([-1, k], k > 1), else prediction."""
    specs = getattr(schema, "inputs", None)
    if not specs or len(specs) != 1:
        return []
    spec = specs[0]
    shape = [int(d) for d in getattr(spec, "shape", None) or [-1]]
    if len(shape) == 2 and shape[1] > 1:
        return [TensorMeta("label", "INT64", [-1]), TensorMeta("probabilities", "FP64", [-1, shape[1]])]
    dtype = spec.type if schema.is_tensor_spec() else spec.type.to_numpy()
    return [TensorMeta("prediction", datatype_of(dtype), [-1])]


OUTPUT_NAMES = ("label", "probabilities", "prediction")


@dataclass
class InferCall:
    """A checked infer request: the float rows for the native call and what to answer with."""

    rows: np.ndarray  # (n, features), finite
    request_id: str | None
    outputs: list[str] | None  # requested output names, None = all

    def native_body(self) -> bytes:
        """The `/predict` body this request becomes (probabilities only when an output needs them)."""
        doc: dict[str, object] = {"inputs": self.rows}
        if self.request_id is not None:
            doc["request_id"] = self.request_id
        if self.outputs is None or "probabilities" in self.outputs:
            doc["probabilities"] = True
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)  # reads NaN / Infinity, so they are refused by name below
    except (ValueError, UnicodeDecodeError) as exc:
        raise OipError(400, f"body is not valid JSON: {exc}") from None


def parse_infer(body: bytes, meta: ModelMeta, *, max_rows: int) -> InferCall:
    """Check an infer request body against the model -> InferCall, or OipError (400, 413)."""
    doc = decode_json(body)
    if not isinstance(doc, dict):
        raise OipError(400, 'body must be a JSON object: {"inputs": [{"name", "shape", "datatype", "data"}]}')
    request_id = doc.get("id")
    if request_id is not None and (not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS):
        raise OipError(400, f"'id' must be a string of 1 to {MAX_ID_CHARS} characters")
    if not isinstance(doc.get("parameters", {}), dict):
        raise OipError(400, "'parameters' must be an object")
    outputs = _requested_outputs(doc.get("outputs"), meta)
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise OipError(400, "'inputs' must be a non-empty list of tensors {name, shape, datatype, data}")
    tensors: dict[str, np.ndarray] = {}
    declared = {t.name: t.datatype for t in meta.inputs} if meta.declared else {}
    for i, t in enumerate(inputs):
        name, arr = _tensor(t, i)
        if name in tensors:
            raise OipError(400, f"input {name!r} is given twice")
        want = declared.get(name)
        if want is not None and t["datatype"] != want:
            raise OipError(400, f"input {name!r} is {t['datatype']}; the model's signature declares {want}")
        tensors[name] = arr
    rows = _columns_to_rows(tensors, meta) if meta.columns else _single_to_rows(tensors, meta)
    if len(rows) > max_rows:
        raise OipError(413, f"{len(rows)} rows; at most {max_rows} per request")
    return InferCall(rows, request_id, outputs)


def _requested_outputs(value: Any, meta: ModelMeta) -> list[str] | None:
    if value is None:
        return None
    known = [t.name for t in meta.outputs] or list(OUTPUT_NAMES)
    if not isinstance(value, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in value):
        raise OipError(400, "'outputs' must be a list of {\"name\": ...}")
    names = [o["name"] for o in value]
    for n in names:
        if n not in known:
            raise OipError(400, f"unknown output {n!r}; the model answers {known}")
    return names


def _tensor(t: Any, i: int) -> tuple[str, np.ndarray]:
    """One input tensor -> (name, numeric array of its declared shape), checked against its datatype."""
    if not isinstance(t, dict):
        raise OipError(400, f"inputs[{i}] must be an object {{name, shape, datatype, data}}")
    name, shape, datatype, data = t.get("name"), t.get("shape"), t.get("datatype"), t.get("data")
    if not isinstance(name, str) or not name:
        raise OipError(400, f"inputs[{i}] needs a 'name' (string)")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise OipError(400, f"input {name!r}: 'shape' must be a list of non-negative integers")
    if datatype not in DATATYPES:
        raise OipError(400, f"input {name!r}: unknown datatype {datatype!r}; use one of {sorted(DATATYPES)}")
    if datatype not in NUMERIC:
        raise OipError(400, f"input {name!r}: datatype {datatype} is not accepted; the model takes numbers "
                            "(FP16/FP32/FP64, INT8..INT64, UINT8..UINT64)")
    if not isinstance(t.get("parameters", {}), dict):
        raise OipError(400, f"input {name!r}: 'parameters' must be an object")
    if not isinstance(data, list):
        raise OipError(400, f"input {name!r}: 'data' must be a list (flat or nested as 'shape' says)")
    try:
        arr = np.asarray(data)
    except ValueError:
        arr = None
    if arr is None or (arr.size and arr.dtype.kind not in "iuf"):
        raise OipError(400, f"input {name!r}: 'data' must be {datatype} numbers (no strings, booleans, nulls "
                            "or ragged lists)")
    want = math.prod(shape)
    if arr.shape != tuple(shape):
        if arr.ndim != 1 or arr.size != want:
            raise OipError(400, f"input {name!r}: 'data' has shape {list(arr.shape)} ({arr.size} values); "
                                f"'shape' {shape} needs {want} values, flat or nested")
        arr = arr.reshape(shape)
    dtype = DATATYPES[datatype]
    if arr.size and dtype.kind in "iu":
        if arr.dtype.kind == "f":
            raise OipError(400, f"input {name!r}: {datatype} data must be integers")
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise OipError(400, f"input {name!r}: a value is out of range for {datatype}")
    elif arr.size and not np.isfinite(arr).all():
        raise OipError(400, f"input {name!r}: 'data' contains NaN or infinite values")
    elif arr.size and dtype.itemsize < 8 and np.abs(arr).max() > np.finfo(dtype).max:
        raise OipError(400, f"input {name!r}: a value is out of range for {datatype}")
    return name, arr.astype(np.float64, copy=False)


def _describe(meta: ModelMeta) -> str:
    return ", ".join(f"{t.name!r} ({t.datatype}, {t.shape})" for t in meta.inputs)


def _single_to_rows(tensors: dict[str, np.ndarray], meta: ModelMeta) -> np.ndarray:
    expected = meta.inputs[0]
    if len(tensors) != 1 or expected.name not in tensors:
        raise OipError(400, f"the model takes one input tensor: {_describe(meta)}; got {sorted(tensors)}")
    arr = tensors[expected.name]
    n_features = meta.n_features
    if arr.ndim != 2 or arr.shape[0] == 0 or (n_features is not None and arr.shape[1] != n_features):
        raise OipError(400, f"input {expected.name!r} has shape {list(arr.shape)}; the model takes "
                            f"{expected.shape} (rows of {n_features or 'any number of'} features, at least one row)")
    return arr


def _columns_to_rows(tensors: dict[str, np.ndarray], meta: ModelMeta) -> np.ndarray:
    names = [t.name for t in meta.inputs]
    if set(tensors) != set(names):
        raise OipError(400, f"the model takes one [n] tensor per column: {names}; got {sorted(tensors)}")
    cols = []
    for n in names:
        a = tensors[n]
        if a.ndim == 2 and a.shape[1] == 1:
            a = a[:, 0]
        if a.ndim != 1 or a.shape[0] == 0:
            raise OipError(400, f"input {n!r} has shape {list(a.shape)}; a column is [n] or [n, 1], n >= 1")
        cols.append(a)
    if len({len(c) for c in cols}) != 1:
        raise OipError(400, "every column tensor must have the same number of rows")
    return np.stack(cols, axis=1)


def infer_answer(native: dict[str, Any], meta: ModelMeta, call: InferCall) -> dict[str, object]:
    """The native `/predict` answer -> the infer response (output tensors, flat row-major data)."""
    outputs = native["outputs"]
    n = len(outputs)
    probs = native.get("probabilities")
    tensors: list[dict[str, object]] = []
    if probs is not None or any(t.name == "label" for t in meta.outputs):
        tensors.append({"name": "label", "datatype": "INT64", "shape": [n], "data": outputs})
        if probs is not None:
            k = len(probs[0]) if n else 0
            # an array from the batch path, left an array (its caller's orjson option writes it without a
            # Python float per value), else the native answer's nested list
            flat = probs.ravel() if isinstance(probs, np.ndarray) else [v for row in probs for v in row]
            tensors.append({"name": "probabilities", "datatype": "FP64", "shape": [n, k], "data": flat})
    else:
        declared = next((t.datatype for t in meta.outputs if t.name == "prediction"), None)
        datatype = declared or ("INT64" if outputs and all(type(v) is int for v in outputs) else "FP64")
        tensors.append({"name": "prediction", "datatype": datatype, "shape": [n], "data": outputs})
    if call.outputs is not None:
        tensors = [t for t in tensors if t["name"] in call.outputs]
    # the protocol echoes the caller's `id`; the record's id (what feedback is sent by) is a parameter
    return {"model_name": meta.name, "model_version": native.get("model_version"),
            "id": native.get("client_request_id") or native.get("request_id"),
            "parameters": {"request_id": native.get("request_id")}, "outputs": tensors}


def native_error(status: int, body: bytes) -> tuple[int, bytes]:
    """A native error answer ({"detail": ...}) -> (status, {"error": ...}): a refused request is 400
    (the protocol's bad-request status; 413 stays 413), server-side statuses (5xx) pass unchanged."""
    try:
        message = str(orjson.loads(body).get("detail", "")) or f"HTTP {status}"
    except (orjson.JSONDecodeError, AttributeError):
        message = body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    if 400 <= status < 500 and status != 413:
        status = 400
    return status, error_body(message)


SERVER_METADATA = {"name": "scanflow", "extensions": []}
