"""Settings read from the environment (prefix SCANFLOW_), an optional config file, or passed in as a mapping.

pydantic-settings rather than hand-written os.environ parsing: typed conversion, errors that name
the variable, and `Settings(**mapping)` in tests. Secrets are `SecretStr`, so a repr or a log line
shows '**********', never the token.

Discovery lives here, the same on every platform: where the other agents are (`peers`), where the
Tracker is for the replicas (`tracker_url`), and where each watched service answers (`service_urls`).
Kubernetes manifests and docker-compose.yml set them to Service DNS names; the embedded stack sets the
same variables to loopback addresses. No agent builds an address of its own. Sources, highest first:
constructor arguments, SCANFLOW_* variables, the YAML file named by SCANFLOW_CONFIG (same keys, no
prefix: `peers: {tracker: http://tracker:8080}`), the defaults.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

CONFIG_ENV = "SCANFLOW_CONFIG"

UrlMap = Annotated[dict[str, str], NoDecode]


def parse_url_map(value: Any, what: str = "value") -> dict[str, str]:
    """'a=http://x:1,b=http://y:2' or a JSON object or a mapping -> {'a': 'http://x:1', ...}.

    Why a comma list: it reads well in a manifest's env and in compose; JSON is accepted too. Every
    URL must be http(s), so a typo fails at start-up naming the entry, not at the first call."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            value = json.loads(text)
        else:
            pairs: dict[str, str] = {}
            for item in filter(None, (p.strip() for p in text.split(","))):
                name, sep, url = item.partition("=")
                if not sep:
                    raise ValueError(f"{what}: {item!r} is not NAME=URL")
                pairs[name.strip()] = url.strip()
            value = pairs
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected NAME=URL pairs, got {type(value).__name__}")  # noqa: TRY004  # noqa: TRY004  # pydantic wants ValueError
    out: dict[str, str] = {}
    for name, url in value.items():
        url = str(url).strip().rstrip("/")
        if not str(name).strip() or not url.startswith(("http://", "https://")):
            raise ValueError(f"{what}: {name}={url!r}: expected NAME=http(s)://HOST:PORT")
        out[str(name).strip()] = url
    return out


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SCANFLOW_", extra="ignore")

    home: Path = Field(Path(".scanflow"), description="state directory: SQLite stores, MLflow, logs")
    token: SecretStr | None = Field(None, description="bearer token for mutating agent endpoints")
    record_key: SecretStr | None = Field(None, description="hex key binding prediction ids to their service "
                                         "(SCANFLOW_RECORD_KEY: the Tracker and the Executor; "
                                         "scanflow.tracking.record_ids)")
    store_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite in home")
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; default: a local server")
    host: str = "127.0.0.1"
    http_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(10.0, gt=0, description="a request body must arrive in full within this "
                                  "(SCANFLOW_BODY_TIMEOUT_S; else 408 and the connection closes)")
    head_timeout_s: float = Field(10.0, gt=0, description="a request line and headers must arrive in full within "
                                  "this (SCANFLOW_HEAD_TIMEOUT_S; else 408 and the connection closes)")
    http_retries: int = Field(3, ge=0, le=20)
    claim_check_s: float = Field(5.0, gt=0, description="how often an agent on a PostgreSQL store checks that its "
                                 "session still holds the store's owner lock (SCANFLOW_CLAIM_CHECK_S)")
    log_level: str = "INFO"
    platform: Literal["local", "kubernetes"] = Field(
        "local", description="where the Executor runs services and jobs (SCANFLOW_PLATFORM)"
    )
    namespace: str | None = Field(None, description="Kubernetes namespace of the workflow (SCANFLOW_NAMESPACE)")
    image: str | None = Field(None, description="image of the pods the Executor creates (SCANFLOW_IMAGE); "
                              "on Kubernetes default: the Executor's own pod's image")
    pod_name: str | None = Field(None, description="this pod's name (SCANFLOW_POD_NAME, downward API)")
    sync_template_after_resize: bool = Field(
        False, description="Kubernetes: after an in-place resize also write the new size into the Deployment's "
        "pod template (SCANFLOW_SYNC_TEMPLATE_AFTER_RESIZE); that starts a rollout replacing the pods just "
        "resized. Off: the size is kept in an annotation and pods started later are resized to it")
    peers: UrlMap = Field(default_factory=dict, description="other agents: SCANFLOW_PEERS='tracker=http://tracker:8080,...'")
    tracker_url: str | None = Field(None, description="the Tracker replicas post predictions to (SCANFLOW_TRACKER_URL); "
                                    "default: peers['tracker']")
    service_urls: UrlMap = Field(default_factory=dict, description="endpoint (gateway) of each watched service: "
                                 "SCANFLOW_SERVICE_URLS='digits=http://digits-gateway:8080'")
    gateway_discovery: Literal["static", "dns"] = Field(
        "static", description="how the Checker reads a service's gateways (SCANFLOW_GATEWAY_DISCOVERY): `static` "
        "reads the endpoint as configured; `dns` reads every address its name resolves to and sums their "
        "counters (a Kubernetes headless Service in front of several gateways; http endpoints only)")
    prediction_retention_s: float = Field(
        3600.0, gt=0, description="flushed predictions kept locally this long: the request_id dedup horizon"
    )

    @field_validator("peers", mode="before")
    @classmethod
    def _peers(cls, value: Any) -> dict[str, str]:
        return parse_url_map(value, "SCANFLOW_PEERS")

    @field_validator("service_urls", mode="before")
    @classmethod
    def _service_urls(cls, value: Any) -> dict[str, str]:
        return parse_url_map(value, "SCANFLOW_SERVICE_URLS")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment wins over the file SCANFLOW_CONFIG names (a missing file is an error)."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV, "").strip()
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(f"{CONFIG_ENV}={path!r}: no such file")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return (*sources, dotenv_settings, file_secret_settings)

    def store_url_for(self, agent_name: str) -> str:
        if self.store_url:
            return self.store_url
        self.home.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.home / f'{agent_name}.db').resolve()}"

    def peer_urls(self, flags: dict[str, str] | None = None, *, own_name: str | None = None) -> dict[str, str]:
        """The peers an agent talks to: the configured ones, overridden by command-line flags, minus itself."""
        merged = {**self.peers, **(flags or {})}
        merged.pop(own_name or "", None)
        return merged

    def tracker_endpoint(self) -> str | None:
        """Where replicas send their prediction records: SCANFLOW_TRACKER_URL, else the `tracker` peer."""
        return (self.tracker_url or "").rstrip("/") or self.peers.get("tracker")
