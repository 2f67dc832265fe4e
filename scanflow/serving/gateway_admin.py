"""The bodies of the gateway's admin API (PUT /admin/replicas, /admin/backup, /admin/route,
/admin/challenger), validated before anything changes: a URL the gateway could not append paths to, a
repeated replica or a share outside [0, 1] is a 422 naming the field.

Who uses it: scanflow.serving.gateway_server's routes; the OpenAPI document carries these models.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from scanflow.serving.challenger import ChallengerMode
from scanflow.serving.routing import RouteMode, normalize_url


class ReplicasRequest(BaseModel):
    replicas: list[str] = Field(max_length=1024)

    @field_validator("replicas")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        out = [normalize_url(u) for u in v]
        if len(set(out)) != len(out):
            raise ValueError("replicas must not repeat a URL")
        return out


class BackupRequest(BaseModel):
    url: str | None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else normalize_url(v)


class RouteRequest(BaseModel):
    to: RouteMode


class ChallengerRequest(BaseModel):
    """A challenger for this service: `url` its gateway (or a replica), `mode` shadow (`share` of the
    answered requests mirrored to it) or canary (`share` of the requests answered by it)."""

    url: str
    mode: ChallengerMode
    share: float = Field(ge=0.0, le=1.0)
    service: str | None = Field(None, max_length=200, description="the challenger's service (its records' name)")
    delivery: str | None = Field(None, max_length=200, description="which delivery: the Executor's id, echoed in "
                                 "/admin/state, so every gateway and a restarted one name the same delivery")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return normalize_url(v)
