"""One rule for which parameter names are secrets, so every platform hides the same ones.

Why: the local platform and the Kubernetes manifests used to keep two filters that disagreed
(`private_key` and `aws_access_key_id` passed one of them), so a job param could reach a Job's env
literal or MLflow on one platform and not on the other. A name is secret when it contains, in any
case, one of SECRET_MARKERS; secrets never go to env literals, logs or MLflow params.
Who calls: scanflow.platform.manifests (Job env), scanflow.platform.kubernetes (MLflow params of a Job
run), scanflow.platform.jobrunner (the params it logs; re-exported for the local platform).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECRET_MARKERS = ("token", "secret", "password", "passwd", "key", "credential", "auth")
MLFLOW_PARAM_CHARS = 500  # well under MLflow's 6000-character cap


def is_secret(name: str) -> bool:
    """Pure: whether a parameter named `name` must be hidden (e.g. api_key, DB_PASSWORD, private_key)."""
    lower = name.lower()
    return any(m in lower for m in SECRET_MARKERS)


def public_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the params whose names are not secret, values unchanged (for a Job's JSON env)."""
    return {k: v for k, v in params.items() if not is_secret(k)}


def mlflow_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Pure: the public params as short strings, fit to log as MLflow params."""
    return {k: str(v)[:MLFLOW_PARAM_CHARS] for k, v in public_params(params).items()}
