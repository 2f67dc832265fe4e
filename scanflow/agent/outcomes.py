"""What an actuator hands back, as the loop records it: its return value or exception as an Outcome
(strict JSON, or a failure saying why; a temporary error to retry, a permanent one to stop).

Separate from scanflow.agent.runtime, which decides when actions run and records their outcomes in the
store exactly once: these are the rules for reading user code's results, the same for every caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from scanflow.agent.jsonsafe import NotJSONError, to_json_value
from scanflow.agent.types import ActuatorSpec, Outcome, PermanentError, TemporaryError
from scanflow.secrets import is_secret

if TYPE_CHECKING:
    from scanflow.agent.context import Context


RESULT_BYTES = 2048  # a recorded result's bound: what an operator reads on a decision, not a data dump
HIDDEN = "[hidden]"


def recorded_outcome(outcome: Outcome) -> dict[str, Any]:
    """Pure: what a decision keeps of an action's outcome: its status, error and result, so that
    `GET /decisions` (and `scanflow decisions`) shows what an action did (the version promoted, the
    replicas set, the method of a resize) without a trip to MLflow or the logs.

    The result is the public part only: a value under a secret-looking key (scanflow.secrets) is
    hidden, at any depth; and it is bounded: a result of more than RESULT_BYTES of JSON is kept as its
    size and its top-level keys. The result is already strict JSON (`json_outcome`)."""
    result = _public(outcome.result)
    size = len(orjson.dumps(result))
    if size > RESULT_BYTES:
        keys = sorted(result)[:50] if isinstance(result, dict) else []
        result = {"truncated": True, "bytes": size, "keys": keys}
    return {"status": outcome.status, "error": outcome.error, "result": result}


def _public(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: HIDDEN if is_secret(str(k)) else _public(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_public(v) for v in value]
    return value


def outcome_from_exception(exc: BaseException) -> Outcome:
    if isinstance(exc, TemporaryError):
        return Outcome.retry(str(exc), exc.delay_s)
    if isinstance(exc, PermanentError):
        return Outcome.failed(str(exc))
    # An unexpected exception is treated as temporary (bounded retries), as kopf does.
    return Outcome.retry(f"{type(exc).__name__}: {exc}", 0.0)


def json_outcome(actuator: str, outcome: Outcome) -> Outcome:
    """Pure: the outcome with its result as strict JSON (non-JSON objects such as datetimes or numpy
    scalars become strings), or a failed outcome saying why when the result holds NaN/infinity,
    which no JSON response or store can carry (it used to surface as a 500 from the REST call)."""
    try:
        result = to_json_value(outcome.result, f"actuator {actuator!r} result")
    except NotJSONError as exc:
        return Outcome.failed(f"{exc}; return None or a finite number instead")
    return Outcome(outcome.status, result, outcome.error, outcome.retry_after_s)


async def call_actuator(name: str, spec: ActuatorSpec, ctx: Context, args: dict[str, Any], key: str,
                        log: logging.Logger) -> Outcome:
    """Run the handler of local actuator `name` once (a sync one in a worker thread) -> its Outcome. Never
    raises but for cancellation: an exception becomes an Outcome, a result that is not a dict a failed one."""
    try:
        if spec.is_async:
            raw = await spec.fn(ctx, args)
        else:
            raw = await asyncio.to_thread(spec.fn, ctx, args)
        if raw is None:
            raw = {}
        if isinstance(raw, Outcome):
            outcome = json_outcome(name, raw)
        elif isinstance(raw, Mapping):
            outcome = json_outcome(name, Outcome.ok(dict(raw)))
        else:
            outcome = Outcome.failed(
                f"actuator {name!r} returned {type(raw).__name__}; it must return a dict"
            )
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code becomes an Outcome, never a crash
        log.warning("actuator %s (key %s) raised %s: %s", name, key, type(exc).__name__, exc)
        outcome = outcome_from_exception(exc)
    return outcome
