"""REST face of the feedback log: POST /feedback, POST /feedback/lookup, GET /feedback, GET /feedback/stats.

Who calls it: the Tracker agent mounts it (`agent.router.include_router(feedback_router(log, token))`);
clients that learn the true labels POST them (scanflow.tracking.feedback_client.post_feedback, the
embedded Traffic); agents that retrain look them up by request_id (`lookup_feedback`) or page through
them (GET /feedback). Re-sending is safe (exactly once per request_id, first wins), so clients retry.

Bodies are parsed by hand, as in scanflow.tracking.api: the size limit is checked before parsing
(413), and a malformed record becomes a 422 naming the record index and field, never a 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import SecretStr, TypeAdapter, ValidationError

from scanflow.auth import require_token
from scanflow.tracking.api import describe_errors, parse_json_body, read_json_list
from scanflow.tracking.feedback import (
    MAX_LOOKUP_IDS,
    MAX_PAGE,
    FeedbackPage,
    FeedbackRecord,
    FeedbackStats,
    Label,
)
from scanflow.tracking.predictions import AppendResult

MAX_FEEDBACK_RECORDS = 5_000  # records per POST /feedback
MAX_SEQ = 2**63 - 1  # a seq is a SQL BIGINT: a larger `after` would overflow the query (a 500, not a 422)
MAX_FEEDBACK_BODY_BYTES = 4 * 1024 * 1024
MAX_LOOKUP_BODY_BYTES = 4 * 1024 * 1024  # 10,000 ids of 200 characters fit

_records_adapter: TypeAdapter[list[FeedbackRecord]] = TypeAdapter(list[FeedbackRecord])


class FeedbackStore(Protocol):
    """What the router needs: FeedbackLog, or a wrapper that opens one at agent startup."""

    def append(self, records: Sequence[FeedbackRecord]) -> AppendResult: ...

    def since(self, after_seq: int = 0, limit: int = 1000) -> FeedbackPage: ...

    def lookup(self, request_ids: Iterable[str]) -> dict[str, list[Label]]: ...

    def stats(self) -> FeedbackStats: ...


def feedback_router(
    log: FeedbackStore,
    token: SecretStr | str | None,
    *,
    max_records: int = MAX_FEEDBACK_RECORDS,
    max_body_bytes: int = MAX_FEEDBACK_BODY_BYTES,
    max_lookup_ids: int = MAX_LOOKUP_IDS,
    allow_anonymous: bool = False,
) -> APIRouter:
    """Build the router. POST /feedback needs the `feedback:write` scope (labels feed retraining: only
    an authenticated caller may send them), the lookup and the paged read `feedback:read` (they reveal
    labels); the stats are readable without a token, like /predictions/stats. `token`: the Tracker's
    SCANFLOW_TOKEN or a TokenTable (scanflow.auth)."""
    router = APIRouter(tags=["feedback"])
    writes = [Depends(require_token(token, allow_anonymous=allow_anonymous, scope="feedback:write"))]
    reads = [Depends(require_token(token, allow_anonymous=allow_anonymous, scope="feedback:read"))]

    @router.post("/feedback", dependencies=writes, summary="Append true labels (exactly once per request_id)")
    async def post_feedback(request: Request) -> dict[str, int]:
        raw = await read_json_list(request, max_body_bytes, max_records, "feedback records")
        try:
            records = _records_adapter.validate_python(raw)
        except ValidationError as exc:
            raise HTTPException(422, describe_errors(exc)) from None
        result = await asyncio.to_thread(log.append, records)
        return {"accepted": result.accepted, "stored": result.stored, "duplicates": result.duplicates}

    @router.post("/feedback/lookup", dependencies=reads, summary="Labels of the given request ids")
    async def lookup(request: Request) -> dict[str, Any]:
        ids = await _read_ids(request, max_lookup_ids)
        found = await asyncio.to_thread(log.lookup, ids)
        return {"labels": found, "missing": len(set(ids)) - len(found)}

    @router.get("/feedback", dependencies=reads, summary="Stored feedback after a seq, in seq order")
    async def page(
        after: int = Query(0, ge=0, le=MAX_SEQ, description="the `next` of the previous page (0: from the start)"),
        limit: int = Query(1000, ge=1, le=MAX_PAGE),
    ) -> dict[str, Any]:
        got = await asyncio.to_thread(log.since, after, limit)
        return {
            "records": [
                {"seq": r.seq, "request_id": r.request_id, "labels": r.labels, "ts": r.ts} for r in got.records
            ],
            "next": got.next,
        }

    @router.get("/feedback/stats", summary="Stored feedback count and last seq")
    async def stats() -> dict[str, int]:
        s = await asyncio.to_thread(log.stats)
        return {"stored": s.stored, "last_seq": s.last_seq}

    return router


async def _read_ids(request: Request, max_ids: int) -> list[str]:
    """The `request_ids` of a lookup body, or 413/422 naming what is wrong (the id's index)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_LOOKUP_BODY_BYTES:
        raise HTTPException(413, f"request body larger than {MAX_LOOKUP_BODY_BYTES} bytes: ask for fewer ids")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > MAX_LOOKUP_BODY_BYTES:
            raise HTTPException(413, f"request body larger than {MAX_LOOKUP_BODY_BYTES} bytes: ask for fewer ids")
    doc = parse_json_body(bytes(body))
    if not isinstance(doc, dict) or set(doc) != {"request_ids"} or not isinstance(doc["request_ids"], list):
        raise HTTPException(422, 'body must be {"request_ids": [...]} and nothing else')
    ids = doc["request_ids"]
    if len(ids) > max_ids:
        raise HTTPException(413, f"{len(ids)} request ids in one lookup; at most {max_ids}: split it")
    for i, rid in enumerate(ids):
        if not isinstance(rid, str) or not 0 < len(rid) <= 200:
            raise HTTPException(422, f"request_ids[{i}]: must be a string of 1 to 200 characters")
    return ids

