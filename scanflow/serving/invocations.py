"""MLflow's scoring format (`POST /invocations`, what `mlflow models serve` accepts): pure parsing, no
I/O. Who calls: scanflow.serving.protocols on replicas and gateways.

Accepted bodies (application/json), exactly one key of:
`{"dataframe_split": {"columns": [...], "data": [[...], ...]}}` (pandas' split orient; `index` ignored),
`{"dataframe_records": [{"col": v, ...}, ...]}`, `{"instances": [[...], ...]}` (rows, or records),
`{"inputs": [[...], ...]}` (rows, or `{"tensor name": rows}` / `{"column": [values]}`); `params` may be
given only empty (the replica has no per-call parameters). The client's own id: `request_id` beside
the format key, or the `X-Request-Id` header (the only way with CSV); as on /predict it is echoed as
`client_request_id` and the answer's `request_id` is the one the replica made (the Tracker record's id). text/csv: a header line of column names,
then one row per line. Columns are put in the signature's order when the model names its columns;
a tensor model takes the rows as sent. The rows then go through the replica's native `/predict`, so the
same checks, batching and Tracker record apply; the answer is `{"predictions": [...]}`: the native
outputs (a classifier's class per row) with `request_id` (and `client_request_id`). Errors use MLflow's shape
`{"error_code": "BAD_REQUEST", "message": ...}` with status 400 (415 for another content type).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson

from scanflow.serving.oip import OipError, decode_json
from scanflow.serving.payload import PayloadError, check_request_id

REQUEST_ID_HEADER = "x-request-id"

FORMATS = ("dataframe_split", "dataframe_records", "instances", "inputs")


class ScoringError(Exception):
    """A request refused with `status` and MLflow's error body."""

    def __init__(self, status: int, message: str, code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.code)


def error_body(message: str, code: str = "BAD_REQUEST") -> bytes:
    return orjson.dumps({"error_code": code, "message": message})


def is_csv(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "text/csv"


def check_content_type(content_type: str) -> None:
    kind = content_type.split(";")[0].strip().lower()
    if kind not in ("application/json", "text/csv", ""):
        raise ScoringError(415, f"content type {kind!r} is not supported; send application/json or text/csv",
                           "UNSUPPORTED_MEDIA_TYPE")


def csv_to_split(body: bytes) -> dict[str, Any]:
    """A CSV body (header line, then rows) -> a dataframe_split document; numbers parsed as floats."""
    try:
        lines = [r for r in csv.reader(io.StringIO(body.decode("utf-8"))) if r]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ScoringError(400, f"body is not valid CSV: {exc}") from None
    if len(lines) < 2:
        raise ScoringError(400, "CSV needs a header line of column names and at least one row")
    data: list[list[float]] = []
    for i, row in enumerate(lines[1:]):
        try:
            data.append([float(v) for v in row])
        except ValueError:
            raise ScoringError(400, f"CSV row {i} has a value that is not a number") from None
    return {"dataframe_split": {"columns": lines[0], "data": data}}


def scoring_answer(native: dict[str, Any]) -> dict[str, Any]:
    """The /invocations answer of a native /predict answer: the predictions, the replica-made
    `request_id` (the Tracker record's id) and the client's own id echoed, as /predict does."""
    out: dict[str, Any] = {"predictions": native["outputs"], "request_id": native["request_id"]}
    if native.get("client_request_id") is not None:
        out["client_request_id"] = native["client_request_id"]
    return out


def with_request_id(doc: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    """`doc` with the client's id (from the header) unless it names its own."""
    if request_id is not None and "request_id" not in doc:
        doc["request_id"] = request_id
    return doc


def body_with_request_id(body: bytes, request_id: str) -> bytes:
    """A JSON scoring body with the header's id put in (the gateway forwards bodies only); a body that
    is no JSON object goes on as it is, for the replica to refuse."""
    try:
        doc = decode_json(body)
    except OipError:
        return body
    return orjson.dumps(with_request_id(doc, request_id)) if isinstance(doc, dict) else body


def parse_invocation(body: bytes, content_type: str, columns: list[str] | None) -> list[Any]:
    """The rows of a scoring request, in the model's column order when `columns` is known."""
    return parse_scoring(body, content_type, columns)[0]


def parse_scoring(
    body: bytes, content_type: str, columns: list[str] | None, header_id: str | None = None
) -> tuple[list[Any], str | None]:
    """(rows, the client's request id: the body's `request_id`, else `header_id`) of a scoring request."""
    check_content_type(content_type)
    client_id = header_id
    if is_csv(content_type):
        doc: Any = csv_to_split(body)
    else:
        try:
            doc = decode_json(body)
        except OipError as exc:
            raise ScoringError(400, exc.message) from None
    if not isinstance(doc, dict):
        raise ScoringError(400, f"body must be a JSON object with one of {list(FORMATS)}")
    if "request_id" in doc:
        client_id = doc.pop("request_id")
    try:
        client_id = check_request_id(client_id)
    except PayloadError as exc:
        raise ScoringError(400, exc.message) from None
    if doc.get("params"):
        raise ScoringError(400, "'params' are not supported by this model server")
    keys = [k for k in FORMATS if k in doc]
    if len(keys) != 1 or set(doc) - {keys[0], "params"}:
        raise ScoringError(400, f"body must have exactly one of {list(FORMATS)} (and optionally 'params', "
                                f"'request_id'); got {sorted(doc)}")
    return _format_rows(keys[0], doc[keys[0]], columns), client_id


def _format_rows(key: str, value: Any, columns: list[str] | None) -> list[Any]:
    """The rows of one scoring format's value."""
    if key == "dataframe_split":
        if not isinstance(value, dict) or not isinstance(value.get("data"), list):
            raise ScoringError(400, "'dataframe_split' must be {\"columns\": [...], \"data\": [[...], ...]}")
        return _reorder(value["data"], value.get("columns"), columns)
    if key == "dataframe_records":
        return _records(value, columns)
    if isinstance(value, dict):  # inputs as {"tensor": rows} or {"column": [values]}
        if len(value) == 1 and not columns:
            return _rows(next(iter(value.values())), key)
        return _columns(value, columns)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return _records(value, columns)
    return _rows(value, key)


def _rows(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ScoringError(400, f"'{key}' must be a non-empty list of rows")
    return value


def _reorder(data: list[Any], given: Any, columns: list[str] | None) -> list[Any]:
    if not columns or not given:
        return _rows(data, "dataframe_split.data")
    if not isinstance(given, list) or set(given) != set(columns) or len(given) != len(columns):
        raise ScoringError(400, f"columns must be {columns}; got {given}")
    if given == columns:
        return _rows(data, "dataframe_split.data")
    order = [given.index(c) for c in columns]
    try:
        return [[row[i] for i in order] for row in _rows(data, "dataframe_split.data")]
    except (TypeError, IndexError, KeyError):
        raise ScoringError(400, f"each row of 'data' must have {len(columns)} values") from None


def _records(value: Any, columns: list[str] | None) -> list[Any]:
    if not isinstance(value, list) or not value or not all(isinstance(r, dict) for r in value):
        raise ScoringError(400, "'dataframe_records' must be a non-empty list of {column: value} objects")
    names = columns or list(value[0])
    try:
        return [[r[c] for c in names] for r in value]
    except KeyError as exc:
        raise ScoringError(400, f"a record lacks column {exc.args[0]!r}; columns are {names}") from None


def _columns(value: dict[str, Any], columns: list[str] | None) -> list[Any]:
    names = columns or list(value)
    if set(value) != set(names):
        raise ScoringError(400, f"'inputs' must name the columns {names}; got {sorted(value)}")
    cols = [value[c] for c in names]
    if not all(isinstance(c, list) and c for c in cols) or len({len(c) for c in cols}) != 1:
        raise ScoringError(400, "each column of 'inputs' must be a non-empty list, all of the same length")
    return [list(r) for r in zip(*cols, strict=True)]


def native_error(status: int, body: bytes) -> tuple[int, bytes]:
    """A native error answer ({"detail": ...}) -> MLflow's shape; a refused request is 400."""
    try:
        message = str(orjson.loads(body).get("detail", "")) or f"HTTP {status}"
    except (orjson.JSONDecodeError, AttributeError):
        message = body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    if 400 <= status < 500 and status != 413:
        return 400, error_body(message)
    code = "TEMPORARILY_UNAVAILABLE" if status in (503, 504) else "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST"
    return status, error_body(message, code)
