"""Registry against a real MLflow server: logging, registering, alias moves, history, loading."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from scanflow.tracking import registry


def test_ensure_experiment_is_idempotent(mlflow_server: str, unique_name: str) -> None:
    a = registry.ensure_experiment(unique_name)
    b = registry.ensure_experiment(unique_name)
    assert a == b
    assert MlflowClient().get_experiment(a).name == unique_name


def test_log_register_alias_promote_and_load(
    mlflow_server: str,
    unique_name: str,
    digits: tuple[np.ndarray, np.ndarray],
    make_mlp,  # type: ignore[no-untyped-def]
) -> None:
    x, _ = digits
    m1, m2 = make_mlp(1), make_mlp(2)
    first = registry.log_pytorch_model(m1, unique_name, x[:2], experiment=f"wf-{unique_name}")
    second = registry.log_pytorch_model(
        m2, unique_name, x[:4], experiment=f"wf-{unique_name}", metrics={"accuracy": 0.9}
    )
    assert (first.version, second.version) == ("1", "2")
    assert registry.get_alias_version(unique_name, "champion") is None

    r1 = registry.set_alias(unique_name, "champion", first.version, actor="test", reason="first model")
    assert r1["moved"] and r1["previous_version"] is None
    registry.set_alias(unique_name, "challenger", second.version, actor="trainer", reason="retrained")
    again = registry.set_alias(unique_name, "challenger", second.version, actor="trainer", reason="retry")
    assert again["moved"] is False  # idempotent: a retried action records nothing new

    rec = registry.promote(unique_name, actor="executor", reason="beats champion", metrics={"acc": 0.93})
    assert rec["version"] == "2" and rec["previous_version"] == "1"
    assert registry.get_alias_version(unique_name, "champion") == "2"

    history = registry.promotion_history(unique_name)
    assert [(h["alias"], h["version"], h["previous_version"]) for h in history] == [
        ("champion", "1", None),
        ("challenger", "2", None),
        ("champion", "2", "1"),
    ]
    assert history[-1]["actor"] == "executor" and history[-1]["metrics"] == {"acc": 0.93}
    assert [h["version"] for h in registry.promotion_history(unique_name, "champion")] == ["1", "2"]
    tags = MlflowClient().get_model_version(unique_name, "2").tags
    assert any(json.loads(v)["reason"] == "beats champion" for k, v in tags.items() if "promotion" in k)

    model = registry.load_model(f"models:/{unique_name}@champion")
    out = model(x[:5])
    with torch.inference_mode():
        want = m2(torch.from_numpy(x[:5])).numpy()
    assert out.shape == (5, 10) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert model.predict(x[:3]).shape == (3,)
    assert model(x[0]).shape == (1, 10)  # one row is accepted too (no frozen batch size)


def test_register_model_adds_a_version(mlflow_server: str, unique_name: str, mlp, digits) -> None:  # type: ignore[no-untyped-def]
    logged = registry.log_pytorch_model(mlp, unique_name, digits[0][:2], register=False)
    assert logged.version is None
    assert registry.register_model(logged.model_uri, unique_name) == "1"
    assert registry.register_model(logged.model_uri, unique_name) == "2"


def test_promote_without_challenger_is_a_clear_error(mlflow_server: str, unique_name: str) -> None:
    assert registry.get_alias_version(unique_name, "champion") is None  # no such model yet
    MlflowClient().create_registered_model(unique_name)
    with pytest.raises(registry.RegistryError, match="no alias 'challenger'"):
        registry.promote(unique_name, actor="x", reason="y")
    with pytest.raises(registry.RegistryError, match="no version '7'"):
        registry.set_alias(unique_name, "champion", 7, actor="x", reason="y")


def test_one_row_example_is_refused(mlflow_server: str, mlp, digits) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=">= 2 rows"):
        registry.log_pytorch_model(mlp, "never", digits[0][:1])


def test_champion_files_changed_behind_mlflow_are_refused_at_load(
    mlflow_server: str, unique_name: str, digits: tuple[np.ndarray, np.ndarray], make_mlp,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Promotion records the digest of the champion's files; a replica's loader refuses the version
    once its files are changed in the artifact store (around MLflow and its proxy), and says why."""
    from scanflow.serving.model import ModelLoadError
    from scanflow.serving.model import load_model as serve_load
    from scanflow.tracking.model_digest import DIGEST_TAG

    x, _ = digits
    logged = registry.log_pytorch_model(make_mlp(3), unique_name, x[:2], experiment=f"wf-{unique_name}")
    registry.set_alias(unique_name, "champion", logged.version, actor="test", reason="first model")
    client = MlflowClient()
    digest = client.get_model_version(unique_name, logged.version).tags[DIGEST_TAG]
    assert digest.startswith("sha256:")
    assert serve_load(f"models:/{unique_name}@champion").version == logged.version  # intact: loads
    # promoting again keeps the first digest (a later promotion cannot bless changed files)
    registry.set_alias(unique_name, "champion", logged.version, actor="test", reason="again")
    assert client.get_model_version(unique_name, logged.version).tags[DIGEST_TAG] == digest

    source = client.get_model_version(unique_name, logged.version).source  # models:/m-<id> in MLflow 3
    model_id = source.removeprefix("models:/")
    folders = list({p.resolve() for p in tmp_path_factory.getbasetemp().glob(
        f"mlflow*/artifacts/*/models/{model_id}/artifacts")})  # pytest links mlflowcurrent to mlflowN
    assert len(folders) == 1, (source, folders)
    pickled = next(p for p in folders[0].rglob("*.pth") if p.is_file())
    pickled.write_bytes(pickled.read_bytes() + b"\0")  # what an attacker with the bucket's keys does
    with pytest.raises(ModelLoadError, match="do not match the digest"):
        serve_load(f"models:/{unique_name}@champion")
