"""A workflow run through `scanflow up`, driven from outside as a user does: stack.json for the addresses,
the token file for the bearer token, HTTP for everything else. Offers the attributes the scenarios read
from an EmbeddedStack (service_url, agent_urls, token, tracking_uri, get, decisions, events), so the same
scenario code runs on both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import wait_for

REPO = Path(__file__).resolve().parents[2]
READY_S = 480.0  # MLflow, the bootstrap's training and detector fit, four agents: minutes on a busy machine


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("SCANFLOW_WORKFLOW", None)
    return env


class UpStack:
    """`scanflow up FILE --quick` as a subprocess; `down()` stops it (`scanflow down`)."""

    def __init__(self, workflow: Path, home: Path, out: Path) -> None:
        self.home, self.out = home, out
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scanflow.cli", "up", str(workflow), "--quick", "--home", str(home)],
                cwd=REPO, env=cli_env(), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.state = self._wait_running()
        self.token = (home / "token").read_text().strip()
        urls: dict[str, Any] = self.state["urls"]
        self.agent_urls: dict[str, str] = dict(urls["agents"])
        self.service_urls: dict[str, str] = dict(urls["services"])
        self.tracking_uri: str = urls["mlflow"]
        self.workflow_name: str = self.state["workflow"]
        self.service_url: str = urls["primary"]  # the primary service's gateway
        # MLflow needs a login (docs/security.md): this test process reads it as the operator, as a user would
        self._saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
        os.environ.update({"MLFLOW_TRACKING_USERNAME": "operator", "MLFLOW_TRACKING_PASSWORD": self.token})

    def _wait_running(self) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                pytest.fail(f"up exited with {self.proc.returncode}:\n{self.out.read_text(errors='replace')}")
            try:
                s = json.loads((self.home / "stack.json").read_text())
            except (OSError, ValueError):
                return None
            return s if s.get("state") == "running" else None
        return wait_for(running, READY_S, 1.0, "scanflow up to say running")  # type: ignore[no-any-return]

    def get(self, role: str, path: str, **params: Any) -> Any:
        r = httpx.get(self.agent_urls[role] + path, params=params or None, timeout=30.0,
                      headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()

    def decisions(self, role: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.get(role, "/decisions", limit=limit))

    def events(self, role: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.get(role, "/events", limit=limit))

    def down(self) -> None:
        for k, v in getattr(self, "_saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.proc.poll() is None:
            subprocess.run([sys.executable, "-m", "scanflow.cli", "down", "--home", str(self.home)], cwd=REPO,
                           env=cli_env(), capture_output=True, timeout=240, check=False)
            self.proc.wait(timeout=60)


def detector_sources(stack: UpStack) -> dict[str, str]:
    """model version -> the reference its logged drift detector was fitted on (MLflow tags)."""
    import mlflow
    from mlflow import MlflowClient

    from scanflow.drift.lifecycle import DETECTOR_KIND, DETECTOR_TAG, SOURCE_TAG, VERSION_TAG

    mlflow.set_tracking_uri(stack.tracking_uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(stack.workflow_name)
    runs = client.search_runs([exp.experiment_id], f"tags.`{DETECTOR_TAG}` = '{DETECTOR_KIND}'")
    return {r.data.tags[VERSION_TAG]: r.data.tags.get(SOURCE_TAG, "") for r in runs}
