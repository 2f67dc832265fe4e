"""What each process of the embedded stack is given (no process is started): its own token and MLflow
login, the accepted tokens as digests only, and for the Executor the credentials it hands on."""

from __future__ import annotations

from pathlib import Path

from scanflow.auth import AUTH_TOKENS_ENV, TokenTable
from scanflow.credentials import child_env
from scanflow.embedded.stack import EmbeddedStack


def test_each_component_gets_only_its_own_credentials(tmp_path: Path) -> None:
    from scanflow.examples.digits.workflow import workflow

    stack = EmbeddedStack(tmp_path / "stack", workflow, token="operator-token-0123456789")
    secrets = {n: t for n, t in stack.tokens.items()} | {f"mlflow-{n}": p for n, (p, _) in stack.mlflow_logins.items()}
    assert len(set(secrets.values()) - {stack.token}) == len(secrets) - 2  # all distinct but the operator's
    table = TokenTable.parse(stack._env("tracker")[AUTH_TOKENS_ENV])
    for role in ("tracker", "checker", "planner", "executor"):
        env = stack._env(role)
        assert env["SCANFLOW_TOKEN"] == stack.tokens[role] and env["MLFLOW_TRACKING_USERNAME"] == role
        assert table.identify(f"Bearer {env['SCANFLOW_TOKEN']}").name == role  # type: ignore[union-attr]
        others = {v for k, v in secrets.items() if k not in (role, f"mlflow-{role}")}
        if role != "executor":
            assert not others & set(env.values()), role
        assert not any(t in env[AUTH_TOKENS_ENV] for t in stack.tokens.values())  # digests only
    assert "SCANFLOW_TOKEN" not in stack._env("bootstrap") and stack._env("bootstrap")["MLFLOW_TRACKING_USERNAME"] == "bootstrap"
    executor = stack._env("executor")
    replica = child_env(executor, "replica")
    assert replica["SCANFLOW_TOKEN"] == stack.tokens["replica"] and replica["MLFLOW_TRACKING_USERNAME"] == "replica"
    job = child_env(executor, "job")
    assert "SCANFLOW_TOKEN" not in job and job["MLFLOW_TRACKING_USERNAME"] == "job"
    gateway = child_env(executor, "gateway")
    assert "SCANFLOW_TOKEN" not in gateway and "MLFLOW_TRACKING_PASSWORD" not in gateway
    for env in (replica, job, gateway):  # never the Executor's own
        assert stack.tokens["executor"] not in env.values() and stack.mlflow_logins["executor"][0] not in env.values()
    assert stack.mlflow_logins["replica"][1] == "reader" and stack.mlflow_logins["job"][1] == "job"


def test_only_the_tracker_and_the_executor_hold_the_record_key(tmp_path: Path) -> None:
    """The key that binds prediction records to their service: the Tracker checks with it, the
    Executor derives each service's key from it; no other agent, the bootstrap, or any child holds it."""
    from scanflow.examples.digits.workflow import workflow

    from scanflow.tracking.record_ids import RECORD_KEY_ENV, SERVICE_RECORD_KEY_ENV

    stack = EmbeddedStack(tmp_path / "stack", workflow, token="operator-token-0123456789")
    holders = {role for role in ("tracker", "checker", "planner", "executor", "bootstrap")
               if RECORD_KEY_ENV in stack._env(role)}
    assert holders == {"tracker", "executor"}
    executor = stack._env("executor")
    for kind in ("replica", "gateway", "job"):
        child = child_env(executor, kind)  # type: ignore[arg-type]
        assert RECORD_KEY_ENV not in child and stack.record_key not in child.values()
        assert SERVICE_RECORD_KEY_ENV not in child  # the platform adds the service's key for replicas only
