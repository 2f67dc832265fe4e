"""The digits workflow: a training job, an inference service with its backup, and the four agents.

`workflow` is what `scanflow validate workflows/digits/workflow.py` and `scanflow deploy` read;
workflow.yaml beside it is its exact YAML form (regenerate it with `python -m scanflow.examples.digits.workflow`;
a test checks the two are equal). The agents' behaviour lives in scanflow/standard/*.py (`module`); the
strategies declared here are the MAPE-K chain of docs/architecture.md, and `settings` hold the
parameters of the Planner's policies (scanflow/policies).
"""

from __future__ import annotations

from pathlib import Path

from scanflow.spec import SLO, ActionSpec, AgentSpec, Job, Resources, Service, StrategySpec, Workflow

MODEL_NAME = "digits"
SLO_DIGITS = SLO(latency_ms=50.0, percentile=99.0, error_rate=0.01)

train_job = Job(
    name="train",
    entrypoint="scanflow.examples.digits.train:train",
    params={"model_name": MODEL_NAME, "epochs": 60, "alias": "challenger"},
    resources=Resources(cpu=1.0, memory="1Gi"),
    timeout_s=600.0,
)

digits_service = Service(
    name="digits",
    model_uri=f"models:/{MODEL_NAME}@champion",
    replicas=1,
    min_replicas=1,
    max_replicas=4,
    threads=1,
    resources=Resources(cpu=1.0, memory="512Mi"),
    slo=SLO_DIGITS,
    backup="digits-backup",
)

# The backup serves the same champion from its own replica: it takes traffic when the primary is down.
backup_service = Service(
    name="digits-backup",
    model_uri=f"models:/{MODEL_NAME}@champion",
    replicas=1,
    min_replicas=1,
    max_replicas=1,
    threads=1,
    resources=Resources(cpu=0.5, memory="512Mi"),
    slo=SLO_DIGITS,
)

# The MAPE-K chain (scanflow/standard/*.py implement the actuators; docs/scenarios.md walks through it):
# Tracker predictions.logged -> Checker.check_drift -> drift.checked -> Planner.plan_retrain ->
# drift.detected -> Planner.submit_plan -> Executor plan.approved -> retrain, evaluate_and_promote,
# swap_model. Events cross agents through `forward` / `submit_plan` (the receiver's durable inbox).
tracker = AgentSpec(
    name="tracker",
    role="tracker",
    module="scanflow.standard.tracker:agent",
    strategies=[
        StrategySpec(
            name="check-drift",
            event="predictions.logged",
            constraint="event.count_since_check >= event.window",
            actions=[ActionSpec(actuator="check_drift", agent="checker")],
        )
    ],
    settings={"service": "digits", "window": 500, "quick_window": 200},
)

checker = AgentSpec(
    name="checker",
    role="checker",
    module="scanflow.standard.checker:agent",
    strategies=[
        # every verdict goes on: the Planner's policy needs the clean windows too (its CUSUM falls on them)
        StrategySpec(
            name="drift-to-planner",
            event="drift.checked",
            actions=[ActionSpec(actuator="forward", args={"agent": "planner"})],
        ),
        # each watch tick with a breach, or with replicas above the minimum (the autoscale policy owns
        # hysteresis and cooldowns; a cooldown here would hide the ticks its scale-down counts)
        StrategySpec(
            name="latency-to-planner",
            event="latency.checked",
            actions=[ActionSpec(actuator="forward", args={"agent": "planner"})],
        ),
        StrategySpec(
            name="health-to-planner",
            event="service.checked",
            actions=[ActionSpec(actuator="forward", args={"agent": "planner"})],
        ),
        # while a progressive delivery runs: what each model did on the labelled rows
        StrategySpec(
            name="delivery-to-planner",
            event="delivery.checked",
            actions=[ActionSpec(actuator="forward", args={"agent": "planner"})],
        ),
    ],
    # the traffic replays digits through one scanner: copies differ by read noise (RMS 0.028, at most 0.036
    # over S1's pool), closer than the detector's default allows after a washed-out scanner (0.016): 0.04
    # counts each digit once in the serving reference the Checker refits on after a promotion
    settings={"fpr": 0.05, "copy_tolerance": 0.04},
)

planner = AgentSpec(
    name="planner",
    role="planner",
    module="scanflow.standard.planner:agent",
    strategies=[
        StrategySpec(name="assess-drift", event="drift.checked", actions=[ActionSpec(actuator="plan_retrain")]),
        StrategySpec(
            name="retrain-on-drift",
            event="drift.detected",
            constraint="since('submit_plan') > 600",
            actions=[ActionSpec(actuator="submit_plan", args={"plan": "retrain"})],
            cooldown_s=600.0,
        ),
        StrategySpec(name="failover", event="service.checked", actions=[ActionSpec(actuator="plan_failover")]),
        StrategySpec(name="delivery", event="delivery.checked", actions=[ActionSpec(actuator="plan_delivery")]),
        StrategySpec(name="autoscale", event="latency.checked", actions=[ActionSpec(actuator="plan_scale")]),
    ],
    settings={
        "retrain": {"rule": "cusum", "false_alarms_per_day": 0.1, "cooldown_s": 600.0},
        "promotion": {"min_gain_drifted": 0.0, "clean_tolerance": 0.01},
        # vertical-first (scanflow.policies.elastic): a throttled replica grows in place (cgroup quota +
        # threads, read back by the Executor) before replicas are added; max_cpu unset: the node's CPUs
        "autoscale": {"mode": "vertical-first", "target_utilization": 0.7, "latency_low": 0.5,
                      "down_window_s": 30.0, "min_cpu": 0.25, "cpu_step": 0.25},
        "failover": {"fail_checks": 3, "recover_checks": 5},
    },
)

executor = AgentSpec(
    name="executor",
    role="executor",
    module="scanflow.standard.executor:agent",
    # the traffic replays digits through one scanner: copies differ by read noise (RMS 0.028, at most 0.036
    # over S1's pool) while distinct digits are >= 0.042 apart, so 0.04 counts each digit once
    settings={"duplicate_tolerance": 0.04, "holdout_fraction": 0.3},
    strategies=[
        StrategySpec(
            name="execute-retrain",
            event="plan.approved",
            constraint="event.plan == 'retrain'",
            actions=[
                ActionSpec(actuator="retrain"),
                ActionSpec(actuator="evaluate_and_promote"),
                ActionSpec(actuator="swap_model"),
            ],
        ),
        StrategySpec(name="execute-route", event="plan.approved", constraint="event.plan == 'route'",
                     actions=[ActionSpec(actuator="route")]),
        StrategySpec(name="execute-scale", event="plan.approved", constraint="event.plan == 'scale'",
                     actions=[ActionSpec(actuator="scale")]),
        StrategySpec(name="execute-resources", event="plan.approved", constraint="event.plan == 'resources'",
                     actions=[ActionSpec(actuator="set_resources")]),
        StrategySpec(name="execute-delivery", event="plan.approved", constraint="event.plan == 'delivery'",
                     actions=[ActionSpec(actuator="deliver")]),
    ],
)

workflow = Workflow(
    name="digits",
    jobs=[train_job],
    services=[digits_service, backup_service],
    agents=[tracker, checker, planner, executor],
    labels={"app": "digits", "scenario": "s1-s4"},
)

YAML_PATH = Path(__file__).with_name("workflow.yaml")

if __name__ == "__main__":
    YAML_PATH.write_text(workflow.to_yaml())
    print(f"wrote {YAML_PATH}")
