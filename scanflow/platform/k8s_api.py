"""How the Kubernetes platform's calls to the API server read: patch content types and errors.

`map_api_error` turns the client's ApiException into a PlatformError subclass whose message names the
verb, the resource and the namespace (a 403 names what the Role lacks), and `retryable` says which
failures a bounded retry may cure (429, 5xx, transport errors). Separate from `KubernetesPlatform`
because every module that calls the API (the platform, the in-place resize, the Jobs) raises and
catches these same errors and speaks the same patch types; pure, no client.
"""

from __future__ import annotations

import json

import urllib3

from scanflow.extras import missing_extra
from scanflow.platform.base import PlatformError

try:
    from kubernetes.client.exceptions import ApiException
except ModuleNotFoundError as _exc:
    raise missing_extra(_exc, "k8s", "the Kubernetes platform") from None

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_RETRYABLE_STATUS = {429, 500, 502, 503, 504}


class KubernetesForbidden(PlatformError):
    """The ServiceAccount's Role lacks a verb on a resource (HTTP 403); the message names both."""


class KubernetesNotFound(PlatformError):
    """The object (or the API itself, on an old cluster) does not exist (HTTP 404)."""


class KubernetesConflict(PlatformError):
    """The object already exists, or changed under us (HTTP 409); retrying later may work."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class KubernetesInvalid(PlatformError):
    """The API server refused the object or patch (HTTP 400/422); the message carries its reason."""


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in _RETRYABLE_STATUS
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _api_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason or "")[:500]
    except (ValueError, TypeError):
        return str(exc.reason or "")


def map_api_error(exc: ApiException, verb: str, resource: str, namespace: str) -> PlatformError:
    """An ApiException -> a PlatformError that says what was refused and what to do about it."""
    where = f"{verb} {resource} in namespace {namespace!r}"
    msg = _api_message(exc)
    if exc.status == 403:
        return KubernetesForbidden(
            f"forbidden: {where}: the Role bound to this ServiceAccount lacks verb {verb!r} on "
            f"resource {resource!r} (grant it in deploy/base/rbac.yaml). API server said: {msg}"
        )
    if exc.status == 401:
        return PlatformError(f"unauthorized: {where}: the credentials were refused (token expired?)")
    if exc.status == 404:
        return KubernetesNotFound(f"not found: {where}: {msg}")
    if exc.status in (400, 422):
        return KubernetesInvalid(f"invalid: {where}: {msg}")
    if exc.status == 409:
        return KubernetesConflict(f"conflict: {where}: {msg}")
    return PlatformError(f"{where} failed with HTTP {exc.status}: {msg}", retryable=exc.status in _RETRYABLE_STATUS)
