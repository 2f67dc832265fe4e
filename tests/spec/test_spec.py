"""Workflow declarations: validation messages name the field and value; YAML round-trips exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scanflow.spec import (
    SLO,
    ActionSpec,
    Affinity,
    AgentSpec,
    Job,
    Resources,
    Service,
    SpecError,
    StrategySpec,
    Workflow,
    load_workflow,
    parse_memory,
)


def sample() -> Workflow:
    return Workflow(
        name="digits",
        jobs=[Job(name="train", entrypoint="scanflow.examples.digits.train:train", params={"epochs": 5})],
        services=[
            Service(
                name="digits",
                model_uri="models:/digits@champion",
                replicas=2,
                resources=Resources(cpu=1, memory="256Mi"),
                affinity=Affinity(policy="pinned"),
                slo=SLO(latency_ms=20, percentile=99),
                backup="digits-backup",
            ),
            Service(name="digits-backup", model_uri="models:/digits/1"),
        ],
        agents=[
            AgentSpec(
                name="planner",
                role="planner",
                strategies=[
                    StrategySpec(
                        name="retrain-on-drift",
                        event="drift.detected",
                        constraint="event.drift_rate > 0.1 and since('retrain') > 600",
                        actions=[ActionSpec(actuator="run_job", agent="executor", args={"job": "train"})],
                        cooldown_s=600,
                    )
                ],
            )
        ],
    )


def test_yaml_round_trip_is_exact() -> None:
    wf = sample()
    assert Workflow.from_yaml(wf.to_yaml()) == wf
    assert Workflow.from_dict(wf.to_dict()).to_yaml() == wf.to_yaml()


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"replicas": 500}, "services.0.replicas = 500"),
        ({"name": "Digits_Svc"}, "services.0.name = 'Digits_Svc'"),
        ({"model_uri": "models:/a/b/c"}, "models:/NAME@ALIAS"),
        ({"resources": {"cpu": 1, "memory": "lots"}}, "memory 'lots' is not a quantity"),
        ({"resources": {"cpu": -1}}, "services.0.resources.cpu = -1"),
        ({"affinity": {"policy": "sticky"}}, "'none', 'pinned' or 'numa'"),
        ({"backup": "nowhere"}, "backup='nowhere' is not a service"),
        ({"unknown_field": 1}, "services.0.unknown_field"),
    ],
)
def test_errors_name_field_value_and_rule(patch: dict, needle: str) -> None:
    data = sample().to_dict()
    data["services"][0].update(patch)
    with pytest.raises(SpecError) as info:
        Workflow.from_dict(data)
    assert needle in str(info.value)


def test_bounds_and_duplicates() -> None:
    with pytest.raises(ValueError, match="min_replicas=5 is above max_replicas=2"):
        Service(name="s", model_uri="m", min_replicas=5, max_replicas=2)
    data = sample().to_dict()
    data["jobs"].append(dict(data["jobs"][0]))
    with pytest.raises(SpecError, match="duplicate names"):
        Workflow.from_dict(data)


def test_memory_quantities() -> None:
    assert parse_memory("512Mi") == 512 * 2**20
    assert parse_memory("1G") == 10**9
    assert parse_memory(42) == 42
    assert Resources(memory="1Gi").memory_bytes == 2**30


@pytest.mark.parametrize(("given", "cores"), [("500m", 0.5), ("250m", 0.25), ("1.5", 1.5), (" 2 ", 2.0), (2, 2.0),
                                              (0.1, 0.1), (".5", 0.5)])
def test_cpu_takes_cores_or_millicores(given: object, cores: float) -> None:
    assert Resources(cpu=given).cpu == cores
    # and a workflow's YAML round trip keeps the cores
    assert Resources.model_validate(Resources(cpu=given).model_dump()).cpu == cores


@pytest.mark.parametrize("bad", ["abc", "-1", "0m", "1.5Gi", "500 m", True, 0, 600])
def test_cpu_refuses_what_is_not_a_positive_quantity_with_the_forms_it_takes(bad: object) -> None:
    with pytest.raises(ValueError, match="cpu") as err:
        Resources(cpu=bad)
    if isinstance(bad, str) and bad != "0m":
        assert "'500m'" in str(err.value)  # the message shows the forms accepted


def test_job_entrypoint_forms() -> None:
    Job(name="a", entrypoint=["python", "-c", "print(1)"])
    with pytest.raises(ValueError, match="entrypoint"):
        Job(name="a", entrypoint="not a module path")


def test_bad_yaml_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        Workflow.from_yaml("name: [unclosed")
    with pytest.raises(SpecError, match="mapping at the top"):
        Workflow.from_yaml("- a\n- b\n")


def test_validate_cli(tmp_path: Path) -> None:
    # sample()'s planner calls an 'executor' it does not declare: a meaning error, so no agents here
    # (tests/spec/test_validate_semantics.py covers the meaning checks)
    wf = sample().model_copy(update={"agents": []})
    good = tmp_path / "wf.yaml"
    good.write_text(wf.to_yaml())
    out = subprocess.run(
        [sys.executable, "-m", "scanflow.cli", "validate", "--yaml", str(good)], capture_output=True, text=True,
        check=False)
    assert out.returncode == 0, out.stderr
    assert Workflow.from_yaml(out.stdout) == wf

    py = tmp_path / "wf.py"
    py.write_text("from scanflow.spec import Workflow\nworkflow = Workflow(name='x')\n")
    assert load_workflow(py) == Workflow(name="x")

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nservices:\n  - name: s\n    model_uri: m\n    replicas: -1\n")
    out = subprocess.run(
        [sys.executable, "-m", "scanflow.cli", "validate", str(bad)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "services.0.replicas = -1" in out.stderr
