"""A progressive delivery's steps in the Planner and the Executor, without processes: the Planner's stage
kept per delivery across ticks and restarts, its plan carrying the figures; the Executor's start, stage
moves, promotion and rollback on a recording platform, each plan applied once."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from scanflow import messages
from scanflow.spec import Delivery, Service, Workflow
from scanflow.standard import executor_delivery, planner_delivery

DELIVERY = Delivery.model_validate({"mode": "progressive", "stages": [
    {"kind": "shadow", "share": 1.0, "min_labelled": 100, "min_seconds": 10, "timeout_s": 300},
    {"kind": "canary", "share": 0.3, "min_labelled": 20, "min_seconds": 10, "timeout_s": 300}]})
SERVICE = Service(name="digits", model_uri="models:/digits@champion", replicas=2, max_replicas=4, backup="digits-backup",
                  delivery=DELIVERY)
WORKFLOW = Workflow(name="digits", services=[SERVICE, Service(name="digits-backup", model_uri="models:/digits@champion")])


def checked(delivery: str = "http://c:1@100.0", paired_n: int = 0, paired_total: float = 0.0, **kw: Any) -> messages.DeliveryChecked:
    return messages.DeliveryChecked.model_validate({
        "service": "digits", "challenger_service": "digits-challenger", "delivery": delivery, "mode": "shadow",
        "share": 1.0, "paired": {"n": paired_n, "total": paired_total, "total_sq": abs(paired_total)}, **kw})


def ctx_at(now: float, state: dict[str, Any]) -> Any:
    return SimpleNamespace(workflow=WORKFLOW, state=state, now=lambda: now)


def test_the_planner_keeps_each_deliverys_stage_and_plans_the_next_with_its_figures() -> None:
    state: dict[str, Any] = {}
    d, plan = planner_delivery.decide(ctx_at(0.0, state), checked(paired_n=50, paired_total=5.0))
    assert d.action == "hold" and plan is None  # 50 of 100 labelled rows
    state = json.loads(json.dumps(state))  # a restart: the state is what the store kept
    d, plan = planner_delivery.decide(ctx_at(11.0, state), checked(paired_n=400, paired_total=40.0))
    assert d.action == "advance" and plan is not None
    assert (plan.action, plan.kind, plan.share, plan.stage, plan.challenger_service) == (
        "advance", "canary", 0.3, 1, "digits-challenger")
    assert plan.figures["paired_rows"] == 400 and plan.figures["not_worse"] is True
    assert messages.parse("plan.approved", plan.payload()).plan == "delivery"  # what the Executor accepts
    # another delivery (a new challenger) starts from its first stage
    d, plan = planner_delivery.decide(ctx_at(12.0, state), checked(delivery="http://c:2@200.0", paired_n=400,
                                                                   paired_total=40.0))
    assert d.action == "hold" and d.kind == "shadow"
    metrics = planner_delivery.monitoring_metrics(d)
    assert metrics["delivery/stage"] == 0.0 and metrics["delivery/paired_gap"] == pytest.approx(0.1)


def test_a_service_without_a_progressive_delivery_is_not_judged() -> None:
    plain = Workflow(name="digits", services=[Service(name="digits", model_uri="models:/digits@champion")])
    d, plan = planner_delivery.decide(SimpleNamespace(workflow=plain, state={}, now=lambda: 0.0),
                                      checked(paired_n=400, paired_total=40.0))
    assert d.action == "hold" and plan is None and "no progressive delivery" in d.reason


class RecordingPlatform:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def deploy(self, spec: Service) -> None:
        self.calls.append(("deploy", spec.name, spec.model_uri, spec.replicas, spec.backup, spec.delivery.mode))

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow", share: float = 0.0,
                       delivery: str | None = None) -> None:
        self.calls.append(("set_challenger", service, challenger, mode, share, delivery) if challenger else
                          ("set_challenger", service, None))

    def delete(self, name: str) -> None:
        self.calls.append(("delete", name))


def plan(action: str, rec: dict[str, Any], **kw: Any) -> messages.DeliveryPlan:
    """A plan about the delivery `rec` (its id, as the gateways echo it to the Checker and the Planner)."""
    return messages.DeliveryPlan.model_validate({"service": "digits", "challenger_service": "digits-challenger",
                                                 "delivery": rec["id"], "action": action, **kw})


def test_the_executor_starts_moves_and_promotes_once() -> None:
    plat = RecordingPlatform()
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    assert rec["id"].startswith("digits:v7@")
    assert plat.calls == [("set_challenger", "digits", None),  # a stale challenger cleared, the platform asked first
                          ("deploy", "digits-challenger", "models:/digits/7", 1, None, "none"),
                          ("set_challenger", "digits", "digits-challenger", "shadow", 1.0, rec["id"])]
    deliveries = {"digits": rec}
    promoted: list[str] = []
    plat.calls.clear()
    out = executor_delivery.apply(plat, deliveries, plan("advance", rec, kind="canary", share=0.3, stage=1),
                                  lambda v, r: [], lambda v, r: None)
    assert out["action"] == "advance"
    assert plat.calls == [("set_challenger", "digits", "digits-challenger", "canary", 0.3, rec["id"])]
    stale = executor_delivery.apply(plat, deliveries, plan("advance", rec, kind="shadow", share=1.0, stage=1),
                                    lambda v, r: [], lambda v, r: None)
    assert "at stage 1 already" in stale["ignored"] and len(plat.calls) == 1  # a repeated plan moves nothing back
    out = executor_delivery.apply(plat, deliveries, plan("promote", rec, share=1.0, figures={"requests": 90}),
                                  lambda v, r: promoted.append(v) or ["digits", "digits-backup"], lambda v, r: None)
    assert promoted == ["7"] and out["swapped"] == ["digits", "digits-backup"] and out["challenger_requests"] == 90
    assert plat.calls[-2:] == [("set_challenger", "digits", None), ("delete", "digits-challenger")]
    assert rec["state"] == "promoted" and [s["action"] for s in rec["steps"]] == ["advance", "promote"]
    # the same plan again (a retry after the step finished) does nothing more
    again = executor_delivery.apply(plat, deliveries, plan("promote", rec, share=1.0),
                                    lambda v, r: promoted.append(v) or [], lambda v, r: None)
    assert "already promoted" in again["ignored"] and promoted == ["7"]


def test_the_executor_rolls_back_and_ignores_a_plan_for_another_challenger_or_delivery() -> None:
    plat = RecordingPlatform()
    rec = executor_delivery.start(plat, SERVICE, "digits", "8")
    deliveries = {"digits": rec}
    tagged: list[tuple[str, str]] = []
    other = messages.DeliveryPlan.model_validate({"service": "digits", "challenger_service": "digits-other",
                                                  "delivery": rec["id"], "action": "rollback"})
    assert "no delivery" in executor_delivery.apply(plat, deliveries, other, lambda v, r: [], lambda v, r: None)["ignored"]
    # a late verdict on an earlier delivery of this service (same challenger name) moves nothing
    earlier = {**rec, "id": "digits:v7@1.000"}
    calls = len(plat.calls)
    late = executor_delivery.apply(plat, deliveries, plan("promote", earlier), lambda v, r: [], lambda v, r: None)
    assert "not" in late["ignored"] and rec["state"] == "running" and len(plat.calls) == calls
    out = executor_delivery.apply(plat, deliveries, plan("rollback", rec, reason="p99 over the SLO"), lambda v, r: [],
                                  lambda v, r: tagged.append((v, r)))
    assert out["action"] == "rollback" and tagged == [("8", "p99 over the SLO")]
    assert deliveries["digits"]["state"] == "rolled_back" and plat.calls[-1] == ("delete", "digits-challenger")


def test_challenger_names_stay_dns_labels() -> None:
    assert executor_delivery.challenger_name("digits") == "digits-challenger"
    long = "a" * 63
    assert len(executor_delivery.challenger_name(long)) == 63
    assert executor_delivery.numeric({"a": 1, "b": True, "c": "x", "d": 0.5}) == {"a": 1.0, "d": 0.5}


def test_a_delivery_starts_only_where_declared_and_one_at_a_time() -> None:
    plat = RecordingPlatform()
    plain = Service(name="digits", model_uri="models:/digits@champion")
    with pytest.raises(executor_delivery.DeliveryRefused, match="declares no progressive delivery"):
        executor_delivery.start(plat, plain, "digits", "7")
    deliveries = {"digits": executor_delivery.start(plat, SERVICE, "digits", "7")}
    calls = len(plat.calls)
    # the same version again is the running delivery (a retried step): nothing deployed twice
    assert executor_delivery.start(plat, SERVICE, "digits", "7", deliveries)["version"] == "7" and len(plat.calls) == calls
    with pytest.raises(executor_delivery.DeliveryRefused, match="v7 is running"):
        executor_delivery.start(plat, SERVICE, "digits", "9", deliveries)
    deliveries["digits"]["state"] = "rolled_back"
    assert executor_delivery.start(plat, SERVICE, "digits", "9", deliveries)["version"] == "9"


def test_drift_windows_leave_the_challengers_records_out() -> None:
    from scanflow.agentkit.delivery_outcomes import declared_only
    from scanflow.tracking.prediction_records import PredictionBatch, PredictionRecord

    def rec(rid: str, service: str, x: float) -> PredictionRecord:
        return PredictionRecord(request_id=rid, service=service, inputs=[[x, x]], outputs=[0], model_version="1",
                                latency_ms=1.0, ts=1.0)

    batch = PredictionBatch(records=[rec("a", "digits", 1.0), rec("m", "digits-challenger", 2.0),
                                     rec("b", "digits-backup", 3.0)], seqs=[4, 5, 6], watermark=7)
    kept = declared_only(batch, {"digits", "digits-backup"})
    assert [r.request_id for r in kept.records] == ["a", "b"] and kept.seqs == [4, 6] and kept.watermark == 7
    assert kept.inputs().tolist() == [[1.0, 1.0], [3.0, 3.0]]
    assert declared_only(kept, {"digits", "digits-backup"}) is kept


class NoSplitPlatform(RecordingPlatform):
    """A platform that cannot put a challenger behind a service (no gateway found for it)."""

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow", share: float = 0.0,
                       delivery: str | None = None) -> None:
        from scanflow.platform.base import PlatformError

        raise PlatformError("progressive delivery is not supported here")


def test_a_platform_without_a_split_refuses_before_deploying_anything() -> None:
    plat = NoSplitPlatform()
    with pytest.raises(executor_delivery.DeliveryRefused, match="not supported"):
        executor_delivery.start(plat, SERVICE, "digits", "7")
    assert plat.calls == []


def test_a_delivery_without_verdicts_is_overdue_after_its_declared_timeouts() -> None:
    rec = {"state": "running", "started": 1000.0}
    budget = sum(s.timeout_s for s in DELIVERY.stages) + executor_delivery.GRACE_S
    assert executor_delivery.overdue(rec, SERVICE, 1000.0 + budget) is None
    assert "no verdict" in (executor_delivery.overdue(rec, SERVICE, 1000.0 + budget + 1) or "")
    assert executor_delivery.overdue({**rec, "state": "promoted"}, SERVICE, 1e12) is None



def test_tending_repeats_the_stage_while_running_and_never_after_the_end() -> None:
    plat = RecordingPlatform()
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    plat.calls.clear()
    assert executor_delivery.tend(plat, rec, None) == ("repeated", None)  # a restarted gateway gets it back
    assert plat.calls == [("set_challenger", "digits", "digits-challenger", "shadow", 1.0, rec["id"])]
    with executor_delivery.STEPS:  # a step runs (a deploy): the repeat waits for the next round
        assert executor_delivery.tend(plat, rec, None) == ("skipped", None)
    assert executor_delivery.tend(plat, rec, "no verdict") == ("rolled_back", "no verdict")
    assert rec["state"] == "rolled_back" and rec["steps"][-1]["reason"] == "no verdict"
    assert plat.calls[-2:] == [("set_challenger", "digits", None), ("delete", "digits-challenger")]
    calls = len(plat.calls)
    assert executor_delivery.tend(plat, rec, None) == ("skipped", None) and len(plat.calls) == calls  # ended


class FlakyGatewayPlatform(RecordingPlatform):
    """Its gateway refuses to take the challenger off `fail` times (a gateway restarting)."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow", share: float = 0.0,
                       delivery: str | None = None) -> None:
        from scanflow.platform.base import PlatformError

        if challenger is None and self.fail > 0:
            self.fail -= 1
            raise PlatformError("gateway restarting", retryable=True)
        super().set_challenger(service, challenger, mode, share, delivery)


def test_a_rollback_cut_short_is_finished_and_its_stage_never_put_back() -> None:
    from scanflow.platform.base import PlatformError

    plat = FlakyGatewayPlatform(fail=0)
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    deliveries, tagged = {"digits": rec}, []
    plat.fail, plat.calls = 2, []
    with pytest.raises(PlatformError):
        executor_delivery.apply(plat, deliveries, plan("rollback", rec, reason="worse"), lambda v, r: [],
                                lambda v, r: tagged.append(v))
    assert rec["state"] == "ending" and tagged == []
    # the sensor does not put the shadow back on the gateways; it finishes the rollback (the tag is the caller's)
    with pytest.raises(PlatformError):
        executor_delivery.tend(plat, rec, None)
    assert executor_delivery.tend(plat, rec, None) == ("rolled_back", "worse")
    assert not [c for c in plat.calls if c[0] == "set_challenger" and c[2] is not None]
    assert rec["state"] == "rolled_back" and plat.calls[-1] == ("delete", "digits-challenger")


def test_a_promotion_cut_short_is_finished_by_its_retry_without_a_second_swap() -> None:
    from scanflow.platform.base import PlatformError

    plat = FlakyGatewayPlatform(fail=0)
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    deliveries, swaps = {"digits": rec}, []
    plat.fail = 1
    promote = plan("promote", rec, share=1.0)
    with pytest.raises(PlatformError):
        executor_delivery.apply(plat, deliveries, promote, lambda v, r: swaps.append(v) or ["digits"], lambda v, r: None)
    assert rec["state"] == "ending" and swaps == ["7"]
    late_rollback = executor_delivery.apply(plat, deliveries, plan("rollback", rec), lambda v, r: [], lambda v, r: None)
    assert "already ending" in late_rollback["ignored"]  # the promotion is finishing: no other verdict now
    out = executor_delivery.apply(plat, deliveries, promote, lambda v, r: swaps.append(v) or ["digits"], lambda v, r: None)
    assert swaps == ["7"] and "swapped" not in out and rec["state"] == "promoted"


def test_a_promotion_whose_swap_failed_is_finished_by_the_next_round() -> None:
    plat = RecordingPlatform()
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    deliveries, swaps = {"digits": rec}, []

    def failing(version: str, reason: str) -> list[str]:
        raise RuntimeError("a replica did not swap")

    with pytest.raises(RuntimeError):
        executor_delivery.apply(plat, deliveries, plan("promote", rec, share=1.0, figures={"paired_rows": 120}),
                                failing, lambda v, r: None)
    assert rec["state"] == "ending" and rec["ending"]["metrics"] == {"paired_rows": 120.0}
    # a new delivery of the same version is refused while this one ends (it is not running any more)
    with pytest.raises(executor_delivery.DeliveryRefused, match="is running"):
        executor_delivery.start(plat, SERVICE, "digits", "7", deliveries)
    assert executor_delivery.tend(plat, rec, None) == ("skipped", None)  # no way to promote: left as it is
    done = executor_delivery.tend(plat, rec, None, lambda v, r: swaps.append(v) or ["digits"])
    assert done == ("promoted", None) and swaps == ["7"] and rec["state"] == "promoted"
    assert plat.calls[-1] == ("delete", "digits-challenger")


def test_tend_all_logs_what_failed_and_tags_the_rollbacks_it_finishes() -> None:
    import logging

    plat = FlakyGatewayPlatform(fail=0)
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    rec["started"] = 1.0  # long overdue
    wf = SimpleNamespace(service=lambda name: SERVICE)
    tags: list[tuple[str, str]] = []
    plat.fail = 1
    executor_delivery.tend_all(plat, {"digits": rec}, wf, lambda m: lambda v, r: [], lambda v, r: tags.append((v, r)),
                               logging.getLogger("test"))
    assert rec["state"] == "ending" and tags == []  # the gateway refused: logged, not raised
    executor_delivery.tend_all(plat, {"digits": rec}, wf, lambda m: lambda v, r: [], lambda v, r: tags.append((v, r)),
                               logging.getLogger("test"))
    assert rec["state"] == "rolled_back" and tags and tags[0][0] == "7" and "no verdict" in tags[0][1]


def test_a_gateway_that_does_not_echo_ids_names_the_delivery_by_when_it_was_set() -> None:
    plat = RecordingPlatform()
    rec = executor_delivery.start(plat, SERVICE, "digits", "7")
    deliveries = {"digits": rec}
    earlier = plan("advance", {"id": f"http://127.0.0.1:9/@{rec['started'] - 60:.3f}"}, kind="canary", share=0.3, stage=1)
    assert "is about delivery" in executor_delivery.apply(plat, deliveries, earlier, lambda v, r: [],
                                                          lambda v, r: None)["ignored"]
    since = plan("advance", {"id": f"http://127.0.0.1:9/@{rec['started'] + 1:.3f}"}, kind="canary", share=0.3, stage=1)
    assert executor_delivery.apply(plat, deliveries, since, lambda v, r: [], lambda v, r: None)["action"] == "advance"
    assert rec["stage"] == 1


def test_ending_takes_the_replicas_away_even_where_no_gateway_is_left() -> None:
    from scanflow.platform.base import PlatformError

    class GoneGateway(RecordingPlatform):
        def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow", share: float = 0.0,
                           delivery: str | None = None) -> None:
            raise PlatformError("no pod of its gateway")  # not retryable: nothing to take it off

    plat = GoneGateway()
    executor_delivery.end(plat, {"service": "digits", "challenger": "digits-challenger"})
    assert plat.calls == [("delete", "digits-challenger")]
