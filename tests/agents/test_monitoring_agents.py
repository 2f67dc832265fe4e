"""What the agents leave in MLflow for its UI, driven in-process through their real actuators, sensors
and hooks (the detector, the model behind the accuracy estimate, the prediction log reads and the
feedback lookups stubbed): the Checker's drift checks and accuracy estimates in the monitoring run, its
latency checks with the replicas' CPU (its real watch sensor scraping a gateway and a replica over
loopback HTTP), the Planner's decision at the step of the check it answered, the link chain from a
training run to its plan and those checks, the version's description, the cleared challenger, and the
predictions and monitoring runs ended when their agent stops. Read back through MlflowClient from a
real MLflow server."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from agents_support import digits_workflow, spec_of
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from mlflow import MlflowClient
from prometheus_client import generate_latest

from scanflow.platform.jobruns import jobs_experiment
from scanflow.settings import Settings
from scanflow.spec import Workflow
from scanflow.tracking import monitoring, registry

pytestmark = pytest.mark.timeout(300)


class FakeContext:
    """The parts of scanflow.agent.Context the actuators and hooks under test touch."""

    def __init__(self, name: str, home: Path, workflow: Workflow | None = None) -> None:
        self.name, self.key, self.event = name, f"{name}-strategy:1:0", None
        self.workflow = workflow or digits_workflow()
        self.spec = spec_of(self.workflow, name)
        self.resources: dict[str, Any] = {}
        self.state: dict[str, Any] = {}
        self.settings = Settings(home=home)
        self.log = logging.getLogger(f"test.{name}")
        self.peers: dict[str, str] = {}
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def now(self) -> float:
        return time.time()

    async def emit(self, name: str, payload: dict[str, Any], key: str | None = None) -> int:
        return self.emit_sync(name, payload, key)

    def emit_sync(self, name: str, payload: dict[str, Any], key: str | None = None) -> int:
        self.emitted.append((name, dict(payload)))
        return len(self.emitted)


class Detector:
    """Answers the windows in turn: calm, drifted, drifted."""

    def __init__(self) -> None:
        self.verdicts = iter([(False, 0.01, 0.05), (True, 0.3, 0.6), (True, 0.4, 0.7)])

    def metadata(self) -> dict[str, Any]:
        return {"min_window": 2}

    def predict(self, x: np.ndarray) -> Any:
        drift, score, rate = next(self.verdicts)
        return SimpleNamespace(is_drift=drift, score=score, p_value=0.5 if not drift else 0.001, threshold=0.05,
                               drift_rate=rate,
                               n=len(x), critical_indices=list(range(5)) if drift else [], schema_violation=None,
                               metadata={})


def _estimator() -> Any:
    """A real PerformanceEstimator over a stand-in model: class 0 always, with confidence from column 0."""
    from scanflow.drift.performance import ConfidenceCalibration, PerformanceEstimator

    rng = np.random.default_rng(0)
    conf = rng.uniform(0.5, 1.0, 500)
    cal = ConfidenceCalibration.fit(np.stack([conf, 1 - conf], 1), [0] * 500,
                                    list(np.where(rng.random(500) < conf, 0, 1)))

    def predict(x: np.ndarray) -> tuple[list[int], np.ndarray]:
        c = np.clip(x[:, 0] + 0.8, 0.5, 1.0)
        return [0] * len(x), np.stack([c, 1 - c], 1)

    return PerformanceEstimator(predict, cal)


def _window(after: int, size: int = 200) -> Any:
    records = [SimpleNamespace(request_id=f"req-{after + i}", service="digits", inputs=[[0.1] * 4])
               for i in range(1, size + 1)]
    x = np.full((size, 4), 0.1, np.float32)
    return SimpleNamespace(records=records, watermark=after + size, inputs=lambda: x)


@pytest.fixture
def workflow() -> Workflow:
    """The agents supervise the digits example under a name of this test's own (its own experiment)."""
    return digits_workflow().model_copy(update={"name": f"mon-{uuid.uuid4().hex[:8]}"})


@pytest.fixture
def workflow_name(workflow: Workflow) -> str:
    return workflow.name


def test_drift_checks_decisions_and_the_retrain_chain(mlflow_server: str, tmp_path: Path, workflow: Workflow,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from scanflow.standard import checker, planner
    from scanflow.tracking import predictions

    client = MlflowClient()
    detector = Detector()
    monkeypatch.setattr(checker, "_current_detector", lambda ctx: (detector, "1"))
    monkeypatch.setattr(predictions, "prediction_run_id", lambda exp, name: "predictions-run")
    monkeypatch.setattr(predictions, "read_since", lambda run_id, wm: _window(wm))
    monkeypatch.setattr(planner, "count_labelled", lambda ctx, ids: len(ids))
    # this test follows the monitoring chain, not the rule: 2 of 3 windows decides on its third check
    retrain = {"rule": "k_of_m", "k": 2, "m": 3, "cooldown_s": 600.0, "min_points": 2, "quick_min_points": 2,
               "min_labelled": 1, "quick_min_labelled": 1}
    workflow_name = workflow.name
    workflow = workflow.model_copy(update={"agents": [
        a.model_copy(update={"settings": {**a.settings, "retrain": retrain}}) if a.role == "planner" else a
        for a in workflow.agents]})
    # the accuracy estimate: a real estimator; feedback for the first window arrives after its check
    from scanflow.tracking import feedback_client

    monkeypatch.setattr(checker, "_current_estimator", lambda ctx, version: _estimator())
    labels: dict[str, list[Any]] = {}
    monkeypatch.setattr(feedback_client, "lookup_labels", lambda ctx, ids: {i: labels[i] for i in ids if i in labels})

    # the Checker checks three windows and forwards each verdict; the Planner decides on each
    c_ctx: Any = FakeContext("checker", tmp_path, workflow)  # Any: it stands in for scanflow.agent.Context
    c_ctx.peers = {"tracker": "http://tracker.invalid"}  # where feedback would come from (stubbed above)
    p_ctx: Any = FakeContext("planner", tmp_path, workflow)
    checker.load_detector(c_ctx)  # its startup: the monitoring run exists and is RUNNING
    decisions = []
    for i in range(3):
        asyncio.run(checker.check_drift(c_ctx, {}))
        decisions.append(planner.plan_retrain(p_ctx, c_ctx.emitted[-1][1]))
        if i == 0:  # 3 in 4 of the first window's rows were right (the model always says 0)
            labels.update({f"req-{n}": [0 if n % 4 else 1] for n in range(1, 201)})
    assert [d["retrain"] for d in decisions] == [False, False, True]
    assert monitoring.WRITER.flush(60)
    assert c_ctx.state["mlflow_monitor"]["failed"] == 0 and "mlflow_failures" not in p_ctx.state

    target = monitoring.monitor_target(workflow_name, "digits", tmp_path)
    mon = monitoring.ensure_monitor_run(target)
    run = client.get_run(mon)
    assert run.info.run_name == "monitor-digits" and run.info.status == "RUNNING"

    def history(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(mon, key))

    assert history("drift/flag") == [(200, 0.0), (400, 1.0), (600, 1.0)]
    assert history("drift/drift_rate") == [(200, 0.05), (400, 0.6), (600, 0.7)]
    assert history("drift/window_size") == [(200, 200.0), (400, 200.0), (600, 200.0)]
    assert history("serving/model_version") == [(200, 1.0), (400, 1.0), (600, 1.0)]
    assert history("plan/retrain") == [(200, 0.0), (400, 0.0), (600, 1.0)]  # at the step of the check it answered
    assert history("plan/drifted_windows") == [(200, 0.0), (400, 1.0), (600, 2.0)]
    # the label-free accuracy estimate of each check, and the accuracy measured once feedback arrived
    estimates = [(int(p["to_seq"]), p["performance"]["estimated_accuracy"]) for n, p in c_ctx.emitted
                 if n == "drift.checked"]
    assert [step for step, _ in estimates] == [200, 400, 600] and all(0 < e <= 1 for _, e in estimates)
    assert history("performance/estimated_accuracy") == estimates
    assert history("performance/measured_accuracy") == [(400, 0.75)]  # window 1, labelled before check 2
    assert history("performance/estimate_error") == [(400, estimates[0][1] - 0.75)]

    # the plan the Executor gets, and what it writes for it (as retrain / evaluate_and_promote / swap_model do)
    name, detected = p_ctx.emitted[-1]
    assert name == "drift.detected" and detected["drift_steps"] == [400, 600] and detected["from_seq"] == 200
    plan = {**detected, "plan": "retrain"}
    model = f"mon-{uuid.uuid4().hex[:8]}"
    exp_id = registry.ensure_experiment(jobs_experiment(workflow_name))
    client.create_registered_model(model)
    runs, versions = [], []
    for _ in range(2):
        r = client.create_run(exp_id, run_name="train")
        runs.append(r.info.run_id)
        versions.append(str(client.create_model_version(model, f"runs:/{r.info.run_id}/model",
                                                        run_id=r.info.run_id).version))
    registry.set_alias(model, "champion", versions[0], actor="bootstrap", reason="first model")
    registry.set_alias(model, "challenger", versions[1], actor="train", reason="trained")
    state: dict[str, Any] = {}
    counts = {"n_train": 70, "n_holdout": 30, "labelled": 100, "critical": 130}
    monitoring.safe(state, "link", monitoring.link_retrain, model, versions[1], runs[1], "7", plan, target, counts)
    gate = {"challenger_accuracy_drifted": 0.9, "champion_accuracy_drifted": 0.5, "challenger_accuracy_clean": 0.95}
    monitoring.safe(state, "gate", monitoring.record_gate, model, versions[1], runs[1], "7", plan, gate, True,
                    "challenger beats the champion on the drifted holdout", versions[0])
    registry.set_alias(model, "champion", versions[1], actor="executor", reason="challenger beats the champion")
    monitoring.safe(state, "swap", monitoring.record_swap, model, versions[1], runs[1], ["digits"])
    assert state == {}

    # follow the chain back from the training run
    trained = client.get_run(runs[1])
    tags = trained.data.tags
    assert trained.info.run_name == f"retrain-{model}-plan-7"
    assert tags["scanflow.plan_id"] == "7" and tags["scanflow.caused_by"] == "seq 200-600"
    assert tags["scanflow.plan.decision"] == p_ctx.key and tags["scanflow.plan.reason"] == decisions[-1]["reason"]
    assert tags["scanflow.caused_by.run_id"] == mon
    steps = [int(s) for s in tags["scanflow.caused_by.steps"].split(",")]
    assert all(dict(history("drift/flag"))[s] == 1.0 for s in steps) and steps == [400, 600]
    assert tags["mlflow.note.content"].startswith(f"Retrain of {model} for plan 7, decided by the Planner because")
    assert tags["scanflow.promoted"] == "true" and tags["scanflow.swapped"] == "digits"
    assert trained.data.metrics["gate/challenger_accuracy_drifted"] == 0.9
    mv = client.get_model_version(model, versions[1])
    text = mv.description or ""
    assert text.startswith(f"Version {versions[1]} of {model} was trained by plan 7 for drift in predictions seq 200-600")
    assert "challenger_accuracy_drifted 0.9" in text and "Promoted to champion" in text
    assert mv.tags["scanflow.training_run_id"] == runs[1] and mv.tags["scanflow.caused_by.run_id"] == mon
    assert registry.get_alias_version(model, "challenger") is None  # never left on the champion
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"

    checker.end_monitoring(c_ctx)  # the Checker stops: its monitoring run is finished
    assert client.get_run(mon).info.status == "FINISHED"


def test_the_predictions_run_ends_with_the_tracker_and_resumes(mlflow_server: str, tmp_path: Path,
                                                               workflow: Workflow) -> None:
    from scanflow.standard import tracker
    from scanflow.tracking.predictions import PredictionRecord

    client = MlflowClient()
    workflow_name = workflow.name
    ctx: Any = FakeContext("tracker", tmp_path, workflow)
    tracker.open_log(ctx)
    log = ctx.resources["log"].log
    assert log is not None
    log.append([PredictionRecord(request_id="r1", service="digits", inputs=[[0.0] * 4], outputs=[1],
                                 model_version="1", latency_ms=1.0, ts=time.time())])
    run_id = log.flush_to_mlflow(workflow_name).run_id
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.info.run_name == f"predictions-{workflow_name}"
    tracker.close_log(ctx)
    assert client.get_run(run_id).info.status == "FINISHED"
    tracker.open_log(ctx)  # a restarted Tracker writes the same run again
    try:
        assert client.get_run(run_id).info.status == "RUNNING"
    finally:
        tracker.close_log(ctx)
    assert "mlflow_failures" not in ctx.state
    exp = client.get_experiment_by_name(workflow_name)
    assert exp is not None and exp.tags["mlflow.experimentKind"] == "custom_model_development"


def _replica_metrics(at: float, cpu_s: float, periods: int, throttled: int, requests: int) -> str:
    """A replica's /metrics as scanflow.serving.cpustat and the replica write it (the families the
    Checker reads), with the figures given: its clock, CPU seconds, CFS periods, requests."""
    return (f"# TYPE scanflow_replica_scrape_time_seconds gauge\nscanflow_replica_scrape_time_seconds {at}\n"
            f"# TYPE scanflow_replica_cpu_seconds counter\nscanflow_replica_cpu_seconds_total {cpu_s}\n"
            "# TYPE scanflow_replica_cpu_limit_cores gauge\nscanflow_replica_cpu_limit_cores 2.0\n"
            f"# TYPE scanflow_replica_cpu_periods counter\nscanflow_replica_cpu_periods_total {periods}\n"
            "# TYPE scanflow_replica_cpu_throttled_periods counter\n"
            f"scanflow_replica_cpu_throttled_periods_total {throttled}\n"
            "# TYPE scanflow_replica_threads gauge\nscanflow_replica_threads 2.0\n"
            f"# TYPE scanflow_replica_requests counter\nscanflow_replica_requests_total{{status=\"200\"}} {requests}\n")


def test_latency_checks_carry_the_replicas_cpu(mlflow_server: str, tmp_path: Path, workflow: Workflow,
                                               monkeypatch: pytest.MonkeyPatch, serve_app: Any) -> None:
    """The Checker's real watch sensor scrapes a gateway and its replica over loopback HTTP (their
    /admin/state and /metrics, the gateway's from its real metrics registry); each latency check it logs
    carries the replicas' CPU use against their limit and their throttling."""
    from scanflow.serving.gateway_server import _Metrics
    from scanflow.standard import checker

    gw = _Metrics()
    scrape: dict[str, str] = {}
    app = FastAPI()

    @app.get("/admin/state")
    def state() -> dict[str, Any]:
        return {"replicas": [{"url": scrape["replica_url"], "healthy": True, "outstanding": 0}],
                "backup": {"healthy": True}, "routed_to": "primary", "route": "auto"}

    @app.get("/metrics", response_class=PlainTextResponse)
    def gateway_metrics() -> str:
        return generate_latest(gw.registry).decode()

    @app.get("/replica/metrics", response_class=PlainTextResponse)
    def replica_metrics() -> str:
        return scrape["replica"]

    base = serve_app(app)
    scrape["replica_url"] = f"{base}/replica"
    monkeypatch.setattr(checker, "service_url", lambda svc: base)
    workflow_name = workflow.name
    ctx: Any = FakeContext("checker", tmp_path, workflow)

    # (replica clock, CPU seconds, CFS periods, throttled periods, requests) at each scrape
    ticks = [(100.0, 10.0, 100, 10, 0), (100.0, 10.0, 100, 10, 0), (102.0, 13.0, 120, 15, 40),
             (104.0, 14.0, 140, 15, 80)]
    logged = []
    for at, cpu, periods, throttled, requests in ticks:
        scrape["replica"] = _replica_metrics(at, cpu, periods, throttled, requests)
        events = asyncio.run(checker.watch(ctx))
        logged += [p for n, p in events if n == "latency.checked" and p.get("cpu_used_cores") is not None]
        for _ in range(40):  # the next interval's traffic, through the gateway's real histogram and counter
            gw.latency.observe(0.004)
            gw.requests.inc("200", "primary")
    assert [(p["cpu_used_cores"], p["cpu_limit_cores"], p["throttled_ratio"]) for p in logged] == [
        (1.5, 2.0, 0.25), (0.5, 2.0, 0.0)]
    assert monitoring.WRITER.flush(60)
    assert ctx.state["mlflow_monitor"]["failed"] == 0

    client = MlflowClient()
    mon = monitoring.ensure_monitor_run(monitoring.monitor_target(workflow_name, "digits", tmp_path))

    def values(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(mon, key), key=lambda m: m.step)]

    assert values("resources/cpu_used_cores") == [1.5, 0.5]
    assert values("resources/cpu_limit_cores") == [2.0, 2.0]
    assert values("resources/cpu_utilization") == [0.75, 0.25]
    assert values("resources/throttled_ratio") == [0.25, 0.0]
    assert values("resources/threads") == [2.0, 2.0]
    assert values("latency/slo_ms") == [50.0, 50.0] and values("latency/replicas") == [1.0, 1.0]
    assert values("latency/p99_ms") and max(values("latency/p99_ms")) <= 5.0
