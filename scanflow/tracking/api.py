"""REST face of the prediction log: `POST /predictions` and `GET /predictions/stats`.

Who calls it: the Tracker agent mounts it (`agent.router.include_router(predictions_router(log, token))`);
the gateway and replicas POST batches of PredictionRecord to it. A client that gets no reply re-sends
the same records: request_id de-duplication makes that safe, so clients retry freely.

Why the body is parsed by hand rather than by a pydantic parameter: a size limit must be checked before
parsing (413 instead of building a huge object), and a malformed record must become a 422 that names
the record and the field, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import SecretStr, TypeAdapter, ValidationError

from scanflow.auth import require_token
from scanflow.tracking.predictions import AppendResult, LogStats, PredictionRecord
from scanflow.tracking.record_ids import SERVICE_HEADER, SIGNATURE_HEADER, batch_signed_by, issued_for

_log = logging.getLogger(__name__)


class PredictionStore(Protocol):
    """What the router needs from a log: PredictionLog, or a wrapper that opens one at agent startup."""

    def append(self, records: Sequence[PredictionRecord]) -> AppendResult: ...

    def stats(self) -> LogStats: ...


MAX_BODY_BYTES = 8 * 1024 * 1024  # the Tracker agent raises its app's limit to this (scanflow/standard/tracker.py)

_records_adapter: TypeAdapter[list[PredictionRecord]] = TypeAdapter(list[PredictionRecord])


def predictions_router(
    log: PredictionStore,
    token: SecretStr | str | None,
    *,
    max_records: int = 1000,
    max_body_bytes: int = MAX_BODY_BYTES,
    allow_anonymous: bool = False,
    record_key: bytes | None = None,
) -> APIRouter:
    """Build the router. POST needs the `predictions:write` scope (see scanflow.auth: `token` is the
    Tracker's SCANFLOW_TOKEN or a TokenTable); stats are readable without a token.

    With `record_key` (scanflow.tracking.record_ids), a batch must be signed by a replica of the
    service it names (else 403: the records stay in the sender's spool until an operator fixes its
    key), and a record of another service, or whose request_id was not issued for this service, is
    refused: not stored, counted in the answer's `refused` and in the stats; the rest of the batch is
    stored, so one forged record cannot make a spool retry forever. Records re-sent with a body that
    differs from the stored one are counted as `conflicts` (the first kept)."""
    router = APIRouter(tags=["predictions"])
    totals = {"refused": 0, "conflicts": 0}

    @router.post(
        "/predictions",
        dependencies=[Depends(require_token(token, allow_anonymous=allow_anonymous, scope="predictions:write"))],
        summary="Append prediction records (idempotent by request_id)",
    )
    async def post_predictions(request: Request) -> dict[str, int]:
        body = await read_body(request, max_body_bytes)
        service = request.headers.get(SERVICE_HEADER, "")
        if record_key is not None:  # checked before parsing: a forged batch costs one HMAC
            signature = request.headers.get(SIGNATURE_HEADER, "")
            if not (service and signature and batch_signed_by(record_key, service, body, signature)):
                raise HTTPException(403, "prediction records must come signed by a replica of the service they "
                                         f"name ({SERVICE_HEADER}, {SIGNATURE_HEADER}): this Tracker binds records "
                                         "to their service")
        raw = json_list(body, max_records, "prediction records")
        try:
            records = _records_adapter.validate_python(raw)
        except ValidationError as exc:
            raise HTTPException(422, describe_errors(exc)) from None
        refused = 0
        if record_key is not None:
            bound: list[PredictionRecord] = []
            foreign: list[PredictionRecord] = []
            for r in records:
                ok = r.service == service and issued_for(r.request_id, service, record_key)
                (bound if ok else foreign).append(r)
            refused = len(foreign)
            if foreign:
                _log.warning("refused %d prediction record(s) in a batch signed for service %r: another service's, "
                             "or ids not issued for it (the first claims service %r)", refused, service,
                             foreign[0].service)
            records = bound
        result = await asyncio.to_thread(log.append, records)
        totals["refused"] += refused
        totals["conflicts"] += result.conflicts
        return {"accepted": result.accepted, "stored": result.stored, "duplicates": result.duplicates,
                "refused": refused, "conflicts": result.conflicts}

    @router.get("/predictions/stats", summary="Stored, flushed and pending prediction counts")
    async def prediction_stats() -> dict[str, Any]:
        s = await asyncio.to_thread(log.stats)
        return {
            "stored": s.stored,
            "last_seq": s.last_seq,
            "watermark": s.watermark,
            "pending": s.pending,
            "run_id": s.run_id,
            "refused_total": totals["refused"],  # since this Tracker started
            "conflicts_total": totals["conflicts"],
        }

    return router


async def read_json_list(request: Request, max_body_bytes: int, max_records: int, what: str) -> list[Any]:
    """The request's body as a JSON list of at most `max_records` items, or an HTTPException: 413 when
    the body is over `max_body_bytes` (checked on the declared length and while reading, before any
    parsing) or holds too many items, 422 when it is not a JSON list. Shared by the prediction and
    feedback routers."""
    return json_list(await read_body(request, max_body_bytes), max_records, what)


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request's body, or a 413 when it is over `max_body_bytes` (on the declared length, then
    while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise HTTPException(413, _too_big(max_body_bytes))
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_body_bytes:
            raise HTTPException(413, _too_big(max_body_bytes))
    return bytes(body)


def json_list(body: bytes, max_records: int, what: str) -> list[Any]:
    """`body` as a JSON list of at most `max_records` items, or a 413 / 422 naming why not."""
    raw = parse_json_body(body)
    if not isinstance(raw, list):
        raise HTTPException(422, f"body must be a JSON list of {what}")
    if len(raw) > max_records:
        raise HTTPException(413, f"{len(raw)} records in one request; at most {max_records}: split the batch")
    return raw


def parse_json_body(body: bytes) -> Any:
    """A request body read by hand as JSON, or a 422 naming why not. The depth middleware checks JSON
    content types only and these readers take any, so nesting past json.loads' recursion is caught here."""
    try:
        return json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise HTTPException(422, f"body is not JSON: {exc}") from None
    except RecursionError:
        raise HTTPException(422, "body is nested too deeply to parse") from None


def _too_big(limit: int) -> str:
    return f"request body larger than {limit} bytes: send fewer records per request"


def describe_errors(exc: ValidationError, limit: int = 5) -> list[dict[str, Any]]:
    """Validation errors as plain JSON: where (record index, field) and why; input values left out.
    `msg` repeats the place in words ("record 3, field 'labels.0': ...") for clients that print it."""
    out = [
        {"loc": list(e["loc"]), "msg": f"{_where(e['loc'])}: {e['msg']}", "type": e["type"]}
        for e in exc.errors(include_input=False)
    ]
    return out[:limit]


def _where(loc: tuple[int | str, ...]) -> str:
    if loc and isinstance(loc[0], int):
        rest = ".".join(str(p) for p in loc[1:])
        return f"record {loc[0]}, field '{rest}'" if rest else f"record {loc[0]}"
    return "field '" + ".".join(str(p) for p in loc) + "'"
