"""`scanflow init NAME`: a skeleton that validates and trains as written, outside this repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scanflow.scaffold import ScaffoldError, check_name, render, write

REPO = Path(__file__).resolve().parents[2]


def test_names() -> None:
    assert check_name("fraud_v2") == "fraud_v2"
    for bad in ("Churn", "2fast", "a-b", "class", "x_", "a" * 42):
        with pytest.raises(ScaffoldError):
            check_name(bad)
    files = render("fraud_v2")
    assert "fraud-v2" in files["workflow.py"] and "from fraud_v2.data import load" in files["train.py"]
    assert "{{" not in "".join(files.values())


def test_refuses_a_non_empty_target(tmp_path: Path) -> None:
    write("churn", tmp_path)
    with pytest.raises(ScaffoldError, match="not empty"):
        write("churn", tmp_path)


def test_init_then_validate_from_elsewhere(tmp_path: Path) -> None:
    """Through the CLI, run from a directory the repository is not in: the workflow's own package imports."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SCANFLOW_WORKFLOW")}
    scanflow = [sys.executable, "-c", "import sys; from scanflow.cli import main; sys.argv[0] = 'scanflow'; main()"]
    init = subprocess.run([*scanflow, "init", "churn"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert init.returncode == 0, init.stderr
    sub = tmp_path / "sub"
    sub.mkdir()
    ok = subprocess.run([*scanflow, "validate", "../churn/workflow.py"], cwd=sub, env=env, capture_output=True,
                        text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*scanflow, "init", "Churn"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_the_skeleton_keeps_the_training_contract(tmp_path: Path, mlflow_server: str) -> None:
    import importlib
    import uuid

    import numpy as np

    from scanflow.serving.model import load_model
    from scanflow.tracking.reference import load_reference
    from scanflow.tracking.registry import get_alias_version

    unique_name = f"skel-{uuid.uuid4().hex[:8]}"
    write("skel", tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        train = importlib.import_module("skel.train").train
        first = train(model_name=unique_name, experiment=unique_name)
        extra = tmp_path / "extra.npz"
        rng = np.random.default_rng(0)
        np.savez(extra, x=rng.normal(size=(40, 8)).astype(np.float32), y=rng.integers(0, 3, 40))
        second = train(model_name=unique_name, experiment=unique_name, extra_points_path=str(extra))
    finally:
        sys.path.remove(str(tmp_path))
        for m in [m for m in sys.modules if m == "skel" or m.startswith("skel.")]:
            del sys.modules[m]
    assert get_alias_version(unique_name, "champion") == first["version"]
    assert get_alias_version(unique_name, "challenger") == second["version"] != first["version"]
    ref = load_reference(first["run_id"])
    assert ref.schema.n_features == 8 and ref.schema.task == "classification" and len(ref.x_holdout) == 1000
    outputs, _ = load_model(f"models:/{unique_name}/{second['version']}").predict(ref.x_holdout[:4])
    assert len(outputs) == 4
