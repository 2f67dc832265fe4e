"""How a Scanflow pod runs confined and receives its credentials (pure).

Non-root (uid 10001), no privilege escalation, a read-only root filesystem, no capabilities, the
runtime's default seccomp profile; secrets only by `secretKeyRef` on the Secret `scanflow-secrets`,
never as literal values, and each component only its own (scanflow.deploy_secrets): a replica holds the
replica's token and a read-only MLflow login, a Job only the `job` MLflow login. Separate from the
object builders in `manifests` so the rules every pod follows are in one place, apart from the shapes
of the objects that carry them.
"""

from __future__ import annotations

from typing import Any

from scanflow.deploy_secrets import AUTH_TOKENS_KEY, mlflow_password_key, token_key

SECRET_NAME = "scanflow-secrets"  # keys: scanflow.deploy_secrets
RUN_AS_USER = 10001


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def secret_env(name: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    """An env var read from the Secret `scanflow-secrets` (the only way secrets enter a pod)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": key, "optional": optional}}}


def credential_env(component: str, *, token: bool = True, mlflow: bool = True) -> list[dict[str, Any]]:
    """A component's own credentials, by reference: its Scanflow token (SCANFLOW_TOKEN), the accepted
    tokens' digests (SCANFLOW_AUTH_TOKENS: what its own endpoints check), its MLflow login."""
    env: list[dict[str, Any]] = []
    if token:
        env += [secret_env("SCANFLOW_TOKEN", token_key(component)),
                secret_env("SCANFLOW_AUTH_TOKENS", AUTH_TOKENS_KEY)]
    if mlflow:
        env += [{"name": "MLFLOW_TRACKING_USERNAME", "value": component},
                secret_env("MLFLOW_TRACKING_PASSWORD", mlflow_password_key(component))]
    return env
