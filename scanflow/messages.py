"""The events the standard agents send each other, as typed models both sides import.

Why one module: the sender builds the model and the receiver validates the same model, so a field
renamed on one side fails a test instead of arriving as a silent `None` in a policy. Each agent
declares the models of the events it receives (`Agent(messages=...)`); its POST /events answers a
payload that does not fit with a 422 naming the field, and its OpenAPI document carries the models.

The flow (docs/architecture.md walks it):

    Tracker  --predictions.logged (its own), then the check_drift actuator-->  Checker
    Checker  --drift.checked, latency.checked, service.checked, delivery.checked-->  Planner
    Planner  --plan.approved (retrain | route | scale | resources | delivery)-->  Executor

Fields a newer sender adds are ignored, not refused, so agents can be upgraded one at a time (a
rolling update has old and new agents talking for a while); a missing required field or a wrong
type is refused.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from scanflow.spec import Affinity, Resources


def _json_int(value: Any) -> Any:
    """A JSON number with no fraction (`3.0`) is an integer, as JSON Schema says; `true` and `"3"` are not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# the bounds sit on the inner int, so the OpenAPI document says them as JSON Schema's `minimum`
Int = Annotated[int, BeforeValidator(_json_int)]
Count = Annotated[Annotated[int, Field(ge=0)], BeforeValidator(_json_int)]
Positive = Annotated[Annotated[int, Field(ge=1)], BeforeValidator(_json_int)]
Seq = Annotated[Annotated[int, Field(ge=0, description="a position in the prediction log (its watermark)")],
                BeforeValidator(_json_int)]


class Message(BaseModel):
    """Base of every inter-agent event payload: immutable, unknown fields ignored (see the module doc)."""

    # strict: a number is never read from a string or a boolean (a sender's bug to name, not to guess)
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    def payload(self) -> dict[str, Any]:
        """The JSON object to send as the event's payload."""
        return self.model_dump(mode="json")


class PredictionsLogged(Message):
    """Tracker (to itself; its strategy asks the Checker for a check): records were flushed to MLflow."""

    count_since_check: Count = Field(description="records logged since the last full window was announced")
    window: Positive = Field(description="the records a drift check needs")
    records: Count = Field(0, description="records flushed by this flush")
    watermark: Seq
    run_id: str | None = None


class DriftChecked(Message):
    """Checker -> Planner: the verdict of one drift check over the window `from_seq`..`to_seq`."""

    drift: bool = Field(description="the detector's verdict on this window")
    score: float | None = None
    p_value: float | None = None
    fpr: float | None = Field(None, description="the false-positive rate the verdict was taken at")
    drift_rate: float | None = None
    n: Count | None = Field(None, description="rows checked")
    critical_ids: list[str] = Field(default_factory=list,
                                    description="request ids of the rows that moved most (retraining points)")
    from_seq: Seq | None = None
    to_seq: Seq | None = None
    run_id: str | None = Field(None, description="the prediction log's MLflow run")
    detector_version: str | None = Field(None, description="the champion version the detector was fitted for")
    schema_violation: dict[str, Any] | None = None
    evidence_p: dict[str, float] | None = None
    shifted_inputs: list[dict[str, Any]] | None = None
    window_check: dict[str, Any] | None = None
    performance: dict[str, Any] | None = Field(None, description="accuracy estimate, and measured accuracy "
                                                                 "of earlier windows whose labels arrived")


class ServiceChecked(Message):
    """Checker -> Planner: the primary service's health as its gateway reports it (sent on trouble, and
    while a failover is in force)."""

    service: str
    primary_healthy: bool = True
    backup_healthy: bool = True
    routed_to: str | None = None
    route: str | None = None
    healthy_replicas: Count | None = None
    replicas: Count | None = None
    in_flight: float = Field(0.0, ge=0)


class Observations(Message):
    """What the Checker measured over one watch interval, each field None when it could not be measured
    this tick (docs/policies.md says what each means)."""

    interval_s: float | None = None
    arrival_rate: float | None = None
    completion_rate: float | None = None
    mean_latency_ms: float | None = None
    service_time_ms: float | None = None
    cpu_per_request_ms: float | None = None
    cpu_used_cores: float | None = None
    cpu_limit_cores: float | None = None
    cpu_utilization: float | None = None
    throttled_ratio: float | None = None
    threads: Int | None = None
    node_cpus: Int | None = None
    node_idle_cores: float | None = None
    headroom_cores_per_replica: float | None = None
    observed_replicas: Int | None = None


class LatencyChecked(ServiceChecked, Observations):
    """Checker -> Planner: one watch tick's latency against the SLO, with the gateway's view and the
    interval's observations, for the scaling policy. `slo_ms` is the SLO the Checker judged by (the
    declared one, or an operator's override), so the Planner never assumes one of its own."""

    latency_ms: float | None = Field(None, description="the SLO percentile of the interval; None: no request "
                                                       "completed")
    latency_lower_bound: bool = Field(False, description="the percentile fell past the histogram's top bucket")
    slo_ms: float = Field(gt=0)
    breached: bool = False
    min_replicas: Count | None = None


class DriftDetected(Message):
    """Planner (to itself): the retrain policy decided to retrain; carries the pooled critical points."""

    reason: str = ""
    critical_ids: list[str] = Field(default_factory=list)
    from_seq: Seq | None = None
    to_seq: Seq | None = None
    labelled: Count | None = None
    drift_rate: float | None = None
    score: float | None = None
    drift_steps: list[Int] = Field(default_factory=list)
    decision_key: str | None = None


class RetrainPlan(DriftDetected):
    """Planner -> Executor: retrain on the critical points, evaluate, promote, swap."""

    plan: Literal["retrain"] = "retrain"


class RoutePlan(Message):
    """Planner -> Executor: route the service's traffic to `to` (its backup), or back (`to` None)."""

    plan: Literal["route"] = "route"
    service: str | None = None
    to: str | None = None
    reason: str = ""


class ScalePlan(Message):
    """Planner -> Executor: run `replicas` replicas of `service`."""

    plan: Literal["scale"] = "scale"
    service: str
    replicas: Count
    reason: str = ""


class ResourcesPlan(Message):
    """Planner -> Executor: give each replica of `service` these resources (and threads, and affinity when
    pinning is on)."""

    plan: Literal["resources"] = "resources"
    service: str
    resources: Resources
    threads: Positive | None = None
    affinity: Affinity | None = Field(None, description="None: the platform keeps the placement it has")
    pinning: str | None = None
    reason: str = ""
    decision_key: str | None = None


class OutcomeSums(Message):
    """Running sums of per-row scores (scanflow.policies.delivery.OutcomeSums)."""

    n: Count = 0
    total: float = 0.0
    total_sq: float = Field(0.0, ge=0)


class DeliveryChecked(Message):
    """Checker -> Planner: what a progressive delivery's challenger did since it was set on the gateway.

    paired: score differences (challenger minus champion) of labelled rows both models answered (shadow);
    challenger / champion: scores of labelled rows each answered to clients. requests / errors / timed /
    p99_ms / agreement: the challenger's answers as the gateway saw them."""

    service: str = Field(description="the champion's service")
    challenger_service: str
    delivery: str = Field(description="which delivery: the Executor's id for it, as the gateways echo it")
    mode: Literal["shadow", "canary"]
    share: float = Field(ge=0, le=1)
    paired: OutcomeSums = Field(default_factory=OutcomeSums)
    challenger: OutcomeSums = Field(default_factory=OutcomeSums)
    champion: OutcomeSums = Field(default_factory=OutcomeSums)
    requests: Count = 0
    errors: Count = 0
    timed: Count = 0
    p99_ms: float | None = None
    champion_p99_ms: float | None = Field(None, description="the champion's p99 on the same gateways, same period")
    champion_timed: Count = 0
    recent_p99_ms: float | None = Field(None, description="the challenger's p99 over its newest `recent_timed` answers")
    recent_timed: Count = 0
    champion_recent_p99_ms: float | None = Field(None, description="the champion's p99 over its newest answers")
    slo_p99_ms: float | None = None
    agreement: float | None = None
    dropped: Count = Field(0, description="rows that got no label in time (not evidence either way)")


class DeliveryPlan(Message):
    """Planner -> Executor: move a delivery on: `advance` (the challenger to `kind` at `share`), `promote`
    (it becomes the champion everywhere) or `rollback` (its replicas go; the champion keeps serving)."""

    plan: Literal["delivery"] = "delivery"
    service: str
    challenger_service: str
    delivery: str
    action: Literal["advance", "promote", "rollback"]
    kind: Literal["shadow", "canary"] | None = None
    share: float = Field(0.0, ge=0, le=1)
    stage: Count = 0
    reason: str = ""
    figures: dict[str, Any] = Field(default_factory=dict, description="the decision's inputs (bounds, counts)")


Plan = Annotated[RetrainPlan | RoutePlan | ScalePlan | ResourcesPlan | DeliveryPlan, Field(discriminator="plan")]
PLAN: TypeAdapter[Plan] = TypeAdapter(Plan)
PLAN_KINDS = ("retrain", "route", "scale", "resources", "delivery")

# event name -> the model of its payload; the names are the standard agents' strategy events
class ImageOutdated(Message):
    """Executor (to itself, at start-up): a service it adopted runs another image than the configured one
    (an upgrade: kustomize's `images:` or SCANFLOW_IMAGE moved); its `execute-upgrade` strategy rolls it."""

    service: str
    running: str = Field(description="the image the service's replicas run now")
    configured: str = Field(description="the image the configuration names (the service's own, else the Executor's)")


EVENTS: dict[str, Any] = {
    "predictions.logged": PredictionsLogged,
    "drift.checked": DriftChecked,
    "service.checked": ServiceChecked,
    "latency.checked": LatencyChecked,
    "delivery.checked": DeliveryChecked,
    "drift.detected": DriftDetected,
    "plan.approved": Plan,
    "image.outdated": ImageOutdated,
}


class MessageError(ValueError):
    """A payload does not fit its event's model; the message names the fields."""

    def __init__(self, event: str, exc: ValidationError) -> None:
        self.event = event
        self.errors = exc.errors(include_url=False, include_input=False)
        super().__init__(f"{event}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in self.errors))


@functools.cache
def adapter(model: Any) -> TypeAdapter[Any]:
    """A validator for a model class or an annotated union (built once per model)."""
    return TypeAdapter(model)


def parse(event: str, payload: dict[str, Any], model: Any = None) -> Any:
    """The typed payload of `event` (its model in EVENTS, or `model`); MessageError naming the fields."""
    try:
        return adapter(model if model is not None else EVENTS[event]).validate_python(payload)
    except ValidationError as exc:
        raise MessageError(event, exc) from None


def receiving(*names: str) -> dict[str, Any]:
    """`{name: model}` for the named events, for an agent's `Agent(messages=...)`."""
    return {n: EVENTS[n] for n in names}
