"""What the MLflow UI shows (scanflow/tracking/monitoring.py and run_notes.py): the pure names, tags,
metrics and sentences; the monitoring run found again by its tags, its status, the failure accounting,
the experiment kind and the challenger alias cleared on promotion. Read back through MlflowClient from
the session's real server."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from scanflow.tracking import monitoring, registry, run_notes
from scanflow.tracking.monitoring import MonitorTarget, MonitorWriter

DRIFT = {"drift": True, "score": 0.31, "p_value": 0.002, "drift_rate": 0.4, "n": 200, "from_seq": 200,
         "to_seq": 400, "detector_version": "3", "critical_ids": ["a"]}


def test_drift_metrics_hold_the_verdict_as_0_1_at_the_seq_watermark() -> None:
    metrics, step = monitoring.drift_metrics(DRIFT)
    assert step == 400
    assert metrics == {"drift/score": 0.31, "drift/p_value": 0.002, "drift/drift_rate": 0.4,
                       "drift/window_size": 200.0, "drift/flag": 1.0, "serving/model_version": 3.0}
    calm, _ = monitoring.drift_metrics({**DRIFT, "drift": False, "p_value": float("nan")})
    assert calm["drift/flag"] == 0.0 and "drift/p_value" not in calm  # NaN is left out, not logged


def test_latency_metrics_leave_out_an_idle_percentile() -> None:
    ev = {"latency_ms": None, "slo_ms": 50.0, "breached": False, "replicas": 3, "healthy_replicas": 2,
          "in_flight": 0}
    m = monitoring.latency_metrics(ev, 99.0)
    assert "latency/p99_ms" not in m and m["latency/replicas"] == 3.0 and m["latency/breached"] == 0.0
    assert monitoring.latency_metrics({**ev, "latency_ms": 71.5, "breached": True}, 95.0)["latency/p95_ms"] == 71.5


def test_resource_metrics_leave_out_what_was_not_measured() -> None:
    first_tick = {"cpu_used_cores": None, "cpu_limit_cores": None, "throttled_ratio": None, "threads": None}
    assert monitoring.resource_metrics(first_tick) == {}
    m = monitoring.resource_metrics({"cpu_used_cores": 1.5, "cpu_limit_cores": 2.0, "cpu_utilization": 0.75,
                                     "throttled_ratio": None, "threads": 2})
    assert m == {"resources/cpu_used_cores": 1.5, "resources/cpu_limit_cores": 2.0,
                 "resources/cpu_utilization": 0.75, "resources/threads": 2.0}


def test_plan_tags_and_sentences_name_the_drift_checks() -> None:
    plan = {"reason": "drift in 2 of the last 3 windows", "from_seq": 200, "to_seq": 800, "drift_steps": [400, 800],
            "decision_key": "assess-drift:12:0", "drift_rate": 0.4, "score": 0.3}
    tags = run_notes.plan_tags("7", plan, "run123")
    assert tags == {"scanflow.plan_id": "7", "scanflow.caused_by": "seq 200-800",
                    "scanflow.plan.reason": "drift in 2 of the last 3 windows", "scanflow.caused_by.steps": "400,800",
                    "scanflow.plan.decision": "assess-drift:12:0", "scanflow.caused_by.run_id": "run123"}
    assert run_notes.retrain_run_name("digits", "7") == "retrain-digits-plan-7"
    note = run_notes.retrain_note("digits", "7", plan, 80, 34, 120, 300)
    assert "plan 7" in note and "seq 200-800" in note and "400, 800" in note and "34 held out" in note
    before = run_notes.version_description("digits", "4", "7", plan)
    assert before.startswith("Version 4 of digits was trained by plan 7 for drift in predictions seq 200-800")
    assert before.endswith("Awaiting evaluation against the champion.")
    after = run_notes.version_description("digits", "4", "7", plan, {"challenger_accuracy_drifted": 0.91}, True,
                                          "beats the champion", "3")
    assert "champion version 3: challenger_accuracy_drifted 0.91." in after and "Promoted to champion" in after
    assert run_notes.caused_by(None, 5) == "unknown (the plan carries no seq range)"


def test_sentences_say_a_verdict_once() -> None:
    plan = {"reason": "retrain: drift in 3 of the last 3 windows >= 2", "from_seq": 1, "to_seq": 9}
    note = run_notes.retrain_note("m", "4", plan, 10, 5, 15, 20)
    assert "because drift in 3 of the last 3 windows >= 2." in note and "retrain: " not in note
    text = run_notes.version_description("m", "2", "4", plan, {"a": 1.0}, True, "promote: drifted +0.6", "1")
    assert "Promoted to champion: drifted +0.6." in text
    assert run_notes.because("", "drift") == "drift" and run_notes.because("retrain: ", "drift") == "drift"
    assert run_notes.because("a reason: with a colon", "x") == "a reason: with a colon"


def test_the_filter_quotes_what_it_finds_by() -> None:
    f = monitoring.monitor_filter(MonitorTarget("wf", "it's", "/h"))
    assert "tags.`scanflow.service` = 'it\\'s'" in f and "tags.`scanflow.kind` = 'monitoring'" in f


def _target(tmp_path: Path, unique_name: str, service: str = "svc") -> MonitorTarget:
    return monitoring.monitor_target(f"wf-{unique_name}", service, tmp_path)


def test_the_monitoring_run_holds_each_check_and_is_found_again(mlflow_server: str, tmp_path: Path,
                                                                unique_name: str) -> None:
    client = MlflowClient()
    target = _target(tmp_path, unique_name)
    writer, state = MonitorWriter(), dict[str, Any]()
    for i, (drift, score) in enumerate([(False, 0.01), (True, 0.3), (True, 0.4)]):
        writer.submit(state, target, *monitoring.drift_metrics({**DRIFT, "drift": drift, "score": score,
                                                                "to_seq": 200 * (i + 1)}))
    writer.submit(state, target, monitoring.latency_metrics({"latency_ms": 80.0, "slo_ms": 50.0, "breached": True,
                                                             "replicas": 1}, 99.0), 1)
    assert writer.flush(60)
    assert writer.counts()["written"] == 4 and writer.counts()["failed"] == 0
    run_id = monitoring.ensure_monitor_run(target)
    run = client.get_run(run_id)
    assert run.info.run_name == "monitor-svc" and run.data.tags["scanflow.kind"] == "monitoring"
    assert run.data.tags["scanflow.stack_home"] == str(tmp_path.resolve())
    flags = client.get_metric_history(run_id, "drift/flag")
    assert [(m.step, m.value) for m in sorted(flags, key=lambda m: m.step)] == [(200, 0.0), (400, 1.0), (600, 1.0)]
    assert sorted(m.value for m in client.get_metric_history(run_id, "drift/score")) == [0.01, 0.3, 0.4]
    assert [m.value for m in client.get_metric_history(run_id, "latency/p99_ms")] == [80.0]
    # a restarted agent (empty cache) finds the same run by its tags; another home gets its own
    monitoring.forget_monitor_runs()
    assert monitoring.ensure_monitor_run(target) == run_id
    other = monitoring.ensure_monitor_run(monitoring.monitor_target(target.experiment, "svc", tmp_path / "other"))
    assert other != run_id


def test_monitoring_runs_end_with_their_agent_and_resume(mlflow_server: str, tmp_path: Path,
                                                         unique_name: str) -> None:
    client = MlflowClient()
    target, state = _target(tmp_path, unique_name), dict[str, Any]()
    monitoring.start_monitoring(state, [target])
    run_id = monitoring.ensure_monitor_run(target)
    assert client.get_run(run_id).info.status == "RUNNING"
    monitoring.stop_monitoring(state, [target])
    assert client.get_run(run_id).info.status == "FINISHED" and client.get_run(run_id).info.end_time
    monitoring.start_monitoring(state, [target])
    assert client.get_run(run_id).info.status == "RUNNING"
    assert monitoring.FAILURES_KEY not in state


def test_failed_and_dropped_writes_are_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    state: dict[str, Any] = {}

    def boom() -> None:
        raise ConnectionError("mlflow is down")

    assert monitoring.safe(state, "tag a run", boom) is None
    assert monitoring.safe(state, "tag a run", boom) is None
    assert state["mlflow_failures"]["count"] == 2 and "mlflow is down" in state["mlflow_failures"]["last"]

    release = threading.Event()
    calls: list[int] = []

    def slow_or_failing(run_id: str, metrics: dict[str, float], step: int, ts_ms: int | None = None) -> None:
        calls.append(step)
        release.wait(30)
        raise ConnectionError("still down")

    monkeypatch.setattr(monitoring, "ensure_monitor_run", lambda target: "run")
    monkeypatch.setattr(monitoring, "log_metrics", slow_or_failing)
    writer, target = MonitorWriter(maxsize=1), MonitorTarget("wf", "svc", "/h")
    writer.submit(state, target, {"a": 1.0}, 1)
    for _ in range(200):  # the thread took the first item and waits on MLflow
        if calls:
            break
        threading.Event().wait(0.01)
    writer.submit(state, target, {"a": 2.0}, 2)  # queued
    writer.submit(state, target, {"a": 3.0}, 3)  # the queue is full: dropped, never blocks
    release.set()
    assert writer.flush(10)
    writer.submit(state, target, {}, 4)  # nothing to write: only refreshes the counts in the state
    assert state["mlflow_monitor"]["failed"] == 2 and state["mlflow_monitor"]["dropped"] == 1
    assert state["mlflow_monitor"]["queued"] == 0 and "still down" in state["mlflow_monitor"]["last_error"]


def test_experiments_are_tagged_for_the_model_training_view(mlflow_server: str, unique_name: str) -> None:
    client = MlflowClient()
    exp_id = registry.ensure_experiment(f"new-{unique_name}")
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment(f"old-{unique_name}")  # made before this version: tagged when next used
    assert registry.ensure_experiment(f"old-{unique_name}") == old
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    chosen = client.create_experiment(f"genai-{unique_name}", tags={"mlflow.experimentKind": "genai_development"})
    registry.ensure_experiment(f"genai-{unique_name}")
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"  # a choice is kept


def test_promotion_clears_the_challenger_and_keeps_its_history(mlflow_server: str, unique_name: str) -> None:
    client = MlflowClient()
    exp_id = registry.ensure_experiment(f"wf-{unique_name}")
    client.create_registered_model(unique_name)
    versions = []
    for _ in range(2):
        run = client.create_run(exp_id)
        versions.append(client.create_model_version(unique_name, f"runs:/{run.info.run_id}/model",
                                                    run_id=run.info.run_id).version)
    registry.set_alias(unique_name, "champion", versions[0], actor="test", reason="first")
    registry.set_alias(unique_name, "challenger", versions[1], actor="train", reason="trained")
    registry.promote(unique_name, actor="executor", reason="beats the champion")
    assert registry.get_alias_version(unique_name, "champion") == str(versions[1])
    assert registry.get_alias_version(unique_name, "challenger") is None
    assert [(h["alias"], h["version"]) for h in registry.promotion_history(unique_name)] == [
        ("champion", str(versions[0])), ("challenger", str(versions[1])), ("champion", str(versions[1]))]
    # a retry after a crash between the alias move and the clearing clears it too
    client.set_registered_model_alias(unique_name, "challenger", str(versions[1]))
    again = registry.set_alias(unique_name, "champion", versions[1], actor="executor", reason="retry")
    assert again["moved"] is False and registry.get_alias_version(unique_name, "challenger") is None


def test_agents_of_one_embedded_stack_share_its_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The embedded stack gives each agent a home of its own and names the stack's in SCANFLOW_STACK_HOME."""
    monkeypatch.setenv("SCANFLOW_STACK_HOME", str(tmp_path))
    checker = monitoring.monitor_target("wf", "svc", tmp_path / "agents" / "checker")
    planner = monitoring.monitor_target("wf", "svc", tmp_path / "agents" / "planner")
    assert checker == planner and checker.home == str(tmp_path.resolve())
    monkeypatch.delenv("SCANFLOW_STACK_HOME")
    assert monitoring.monitor_target("wf", "svc", tmp_path / "agents" / "checker").home.endswith("checker")
