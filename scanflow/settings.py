"""Settings read from the environment (prefix SCANFLOW_) or passed in as a mapping.

pydantic-settings rather than hand-written os.environ parsing: typed conversion, errors that name
the variable, and `Settings(**mapping)` in tests. Secrets are `SecretStr`, so a repr or a log line
shows '**********', never the token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SCANFLOW_", extra="ignore")

    home: Path = Field(Path(".scanflow"), description="state directory: SQLite stores, MLflow, logs")
    token: SecretStr | None = Field(None, description="bearer token for mutating agent endpoints")
    store_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite in home")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; default: a local server")
    host: str = "127.0.0.1"
    http_timeout_s: float = Field(10.0, gt=0)
    http_retries: int = Field(3, ge=0, le=20)
    log_level: str = "INFO"
    platform: Literal["local", "kubernetes"] = Field(
        "local", description="where the Executor runs services and jobs (SCANFLOW_PLATFORM)"
    )
    namespace: str | None = Field(None, description="Kubernetes namespace of the workflow (SCANFLOW_NAMESPACE)")
    prediction_retention_s: float = Field(
        3600.0, gt=0, description="flushed predictions kept locally this long: the request_id dedup horizon"
    )

    def store_url_for(self, agent_name: str) -> str:
        if self.store_url:
            return self.store_url
        self.home.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.home / f'{agent_name}.db').resolve()}"
