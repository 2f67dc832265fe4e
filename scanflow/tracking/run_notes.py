"""The sentences and tags that say, in MLflow, why a model was retrained: run names, the plan's tags on
a training run, the training run's note and the model version's description.

Separate from scanflow.tracking.monitoring, which makes the MLflow calls and keeps the monitoring runs:
these are pure functions of a plan (its reason, seq range and drift checks) and of names, with no MLflow
in sight, that monitoring's retrain chain writes onto runs and model versions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

PLAN_ID_TAG = "scanflow.plan_id"
DECISION_TAG = "scanflow.plan.decision"
REASON_TAG = "scanflow.plan.reason"
CAUSED_BY_TAG = "scanflow.caused_by"
CAUSED_BY_RUN_TAG = "scanflow.caused_by.run_id"
CAUSED_BY_STEPS_TAG = "scanflow.caused_by.steps"

MAX_TAG_CHARS = 5000  # MLflow refuses tag values above 8,000 characters; notes stay well under


def finite_number(value: Any) -> float | None:
    """A finite float, or None (bools count as 0/1; NaN, inf and non-numbers are left out)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return float(value)
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def caused_by(from_seq: Any, to_seq: Any) -> str:
    """The prediction seq range of the drift checks behind a plan, e.g. 'seq 200-1400'."""
    lo, hi = finite_number(from_seq), finite_number(to_seq)
    if lo is None or hi is None:
        return "unknown (the plan carries no seq range)"
    return f"seq {int(lo)}-{int(hi)}"


def retrain_run_name(model: str, plan_id: str) -> str:
    return f"retrain-{model}-plan-{plan_id}"


def bootstrap_run_name(model: str, version: str) -> str:
    return f"bootstrap-{model}-v{version}"


def clip(text: str) -> str:
    return text if len(text) <= MAX_TAG_CHARS else text[: MAX_TAG_CHARS - 3] + "..."


_VERDICT = re.compile(r"^(retrain|promote|keep|reject|hold|wait)\s*:\s*", re.IGNORECASE)


def because(reason: str | None, default: str) -> str:
    """Pure: a policy's reason as the end of a sentence. Reasons start with their verdict ("retrain: drift
    in 3 of the last 3 windows"); inside "decided because ..." or "Promoted to champion: ..." the verdict
    would be said twice, so it is left out."""
    return _VERDICT.sub("", (reason or "").strip(), count=1).strip() or default


def _drift_phrase(plan: Mapping[str, Any]) -> str:
    parts = [f"drift in predictions {caused_by(plan.get('from_seq'), plan.get('to_seq'))}"]
    rate, score = finite_number(plan.get("drift_rate")), finite_number(plan.get("score"))
    if rate is not None:
        parts.append(f"drift rate {rate:.3f}")
    if score is not None:
        parts.append(f"score {score:.4g}")
    return ", ".join(parts)


def plan_tags(plan_id: str, plan: Mapping[str, Any], monitor_run_id: str | None) -> dict[str, str]:
    """Tags that link a training run (and its model version) back to the plan and the drift checks:
    plan id, the Planner's decision key and reason, the seq range, the monitoring run and its steps."""
    steps = plan.get("drift_steps") or []
    tags = {PLAN_ID_TAG: str(plan_id), CAUSED_BY_TAG: caused_by(plan.get("from_seq"), plan.get("to_seq")),
            REASON_TAG: clip(str(plan.get("reason") or "no reason recorded")),
            CAUSED_BY_STEPS_TAG: clip(",".join(str(int(s)) for s in steps if finite_number(s) is not None)
                                      or "unknown")}
    if plan.get("decision_key"):
        tags[DECISION_TAG] = str(plan["decision_key"])
    if monitor_run_id:
        tags[CAUSED_BY_RUN_TAG] = monitor_run_id
    return tags


def retrain_note(model: str, plan_id: str, plan: Mapping[str, Any], n_train: int, n_holdout: int,
                 labelled: int, critical: int) -> str:
    """The training run's description, in sentences."""
    return clip(
        f"Retrain of {model} for plan {plan_id}, decided by the Planner because {because(plan.get('reason'), 'drift')}. "
        f"It answers {_drift_phrase(plan)}; the drift checks are the steps "
        f"{', '.join(str(s) for s in plan.get('drift_steps') or []) or '(unknown)'} of the service's monitoring run. "
        f"Feedback labelled {labelled} of {critical} critical requests; {n_train} distinct labelled rows were "
        f"added to the training data and {n_holdout} held out for the promotion gate.")


def version_description(model: str, version: str, plan_id: str, plan: Mapping[str, Any],
                        gate: Mapping[str, float] | None = None, promoted: bool | None = None,
                        reason: str | None = None, previous: str | None = None) -> str:
    """The model version's description, in sentences: which drift it was trained for and, once
    evaluated, the gate scores and the verdict."""
    text = f"Version {version} of {model} was trained by plan {plan_id} for {_drift_phrase(plan)}."
    if gate:
        scores = "; ".join(f"{k} {v:.4g}" for k, v in sorted(gate.items()))
        text += f" Promotion gate against champion version {previous or '?'}: {scores}."
    if promoted is True:
        text += f" Promoted to champion: {because(reason, 'the gate passed')}."
    elif promoted is False:
        text += f" Not promoted: {because(reason, 'the gate did not pass')}."
    else:
        text += " Awaiting evaluation against the champion."
    return clip(text)
