"""The four standard agents' declarations for a workflow: the MAPE-K chain, with its settings.

A team that supervises one service with the reference agents (scanflow/standard/tracker.py, checker.py, planner.py,
executor.py) declares the same strategies every time: the Tracker asks for a drift check at each full
window, the Checker forwards its verdicts and observations to the Planner, the Planner plans retrains,
failovers and scaling, the Executor carries out plans. `standard_agents(service)` builds those
AgentSpecs, so a workflow file states only what differs (settings), and a change to the chain is made
once. workflows/digits/workflow.py spells the same chain out in full, as documentation of the long form.

Who calls: workflow declarations (workflows/*, `scanflow init` scaffolds, users).
"""

from __future__ import annotations

from typing import Any

from scanflow.spec import ActionSpec, AgentSpec, StrategySpec

# a CUSUM on drift verdicts, its threshold set for one false retrain per ten days of stable traffic at the
# window rate the Planner observes (scanflow.policies.retrain)
RETRAIN = {"rule": "cusum", "false_alarms_per_day": 0.1, "cooldown_s": 600.0}
PROMOTION = {"min_gain_drifted": 0.0, "clean_tolerance": 0.01}
# vertical-first (scanflow.policies.elastic): grow a throttled replica in place before adding replicas
AUTOSCALE = {"mode": "vertical-first", "target_utilization": 0.7, "latency_low": 0.5, "down_window_s": 30.0,
             "min_cpu": 0.25, "cpu_step": 0.25}
FAILOVER = {"fail_checks": 3, "recover_checks": 5}


def _forward(name: str, event: str) -> StrategySpec:
    return StrategySpec(name=name, event=event, actions=[ActionSpec(actuator="forward", args={"agent": "planner"})])


def standard_agents(
    service: str,
    *,
    window: int = 500,
    quick_window: int = 200,
    fpr: float = 0.05,
    copy_tolerance: float | None = None,
    retrain: dict[str, Any] | None = None,
    promotion: dict[str, Any] | None = None,
    autoscale: dict[str, Any] | bool = True,
    failover: dict[str, Any] | None = None,
    executor: dict[str, Any] | None = None,
    retrain_cooldown_s: float = 600.0,
) -> list[AgentSpec]:
    """Tracker, Checker, Planner and Executor supervising `service` (the primary: the one with a backup).

    window / quick_window: prediction records per drift check (quick: tests and demos). fpr: the drift
    detector's false-positive rate. copy_tolerance: what counts as a near-copy of one input for the drift
    detector (scanflow.drift.copies; None: its default). retrain, promotion, failover: the Planner's policy settings, merged
    over the defaults above (e.g. {"min_labelled": 100}); autoscale: its settings, or False to leave the
    autoscale strategy out. executor: the Executor's settings (duplicate_tolerance, holdout_fraction,
    reference_rows). retrain_cooldown_s: at most one retrain plan per this many seconds.
    """
    if window < 1 or quick_window < 1:
        raise ValueError(f"window and quick_window must be >= 1, got {window}, {quick_window}")
    tracker = AgentSpec(
        name="tracker", role="tracker", module="scanflow.standard.tracker:agent",
        strategies=[StrategySpec(name="check-drift", event="predictions.logged",
                                 constraint="event.count_since_check >= event.window",
                                 actions=[ActionSpec(actuator="check_drift", agent="checker")])],
        settings={"service": service, "window": window, "quick_window": quick_window},
    )
    checker = AgentSpec(
        name="checker", role="checker", module="scanflow.standard.checker:agent",
        strategies=[_forward("drift-to-planner", "drift.checked"), _forward("latency-to-planner", "latency.checked"),
                    _forward("health-to-planner", "service.checked"), _forward("delivery-to-planner", "delivery.checked")],
        settings={"fpr": fpr, **({} if copy_tolerance is None else {"copy_tolerance": copy_tolerance})},
    )
    planner_strategies = [
        StrategySpec(name="assess-drift", event="drift.checked", actions=[ActionSpec(actuator="plan_retrain")]),
        StrategySpec(name="retrain-on-drift", event="drift.detected",
                     constraint=f"since('submit_plan') > {retrain_cooldown_s:g}",
                     actions=[ActionSpec(actuator="submit_plan", args={"plan": "retrain"})],
                     cooldown_s=retrain_cooldown_s),
        StrategySpec(name="failover", event="service.checked", actions=[ActionSpec(actuator="plan_failover")]),
        StrategySpec(name="delivery", event="delivery.checked", actions=[ActionSpec(actuator="plan_delivery")]),
    ]
    if autoscale is not False:
        planner_strategies.append(StrategySpec(name="autoscale", event="latency.checked",
                                               actions=[ActionSpec(actuator="plan_scale")]))
    planner = AgentSpec(
        name="planner", role="planner", module="scanflow.standard.planner:agent", strategies=planner_strategies,
        settings={"retrain": {**RETRAIN, **(retrain or {})}, "promotion": {**PROMOTION, **(promotion or {})},
                  "autoscale": {**AUTOSCALE, **(autoscale if isinstance(autoscale, dict) else {})},
                  "failover": {**FAILOVER, **(failover or {})}},
    )
    plans = ("retrain", "route", "scale", "resources", "delivery")
    actuators = {"route": "route", "scale": "scale", "resources": "set_resources", "delivery": "deliver"}
    executor_spec = AgentSpec(
        name="executor", role="executor", module="scanflow.standard.executor:agent",
        strategies=[
            StrategySpec(name="execute-retrain", event="plan.approved", constraint="event.plan == 'retrain'",
                         actions=[ActionSpec(actuator="retrain"), ActionSpec(actuator="evaluate_and_promote"),
                                  ActionSpec(actuator="swap_model")]),
            *[StrategySpec(name=f"execute-{p}", event="plan.approved", constraint=f"event.plan == '{p}'",
                           actions=[ActionSpec(actuator=actuators[p])]) for p in plans[1:]],
        ],
        settings=dict(executor or {}),
    )
    return [tracker, checker, planner, executor_spec]
