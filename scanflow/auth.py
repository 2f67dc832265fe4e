"""Bearer-token check for mutating endpoints (agents, replicas, gateway admin).

One FastAPI dependency shared by every server so the rules are the same everywhere: no token
configured -> mutating endpoints are refused (403) unless the server was started with
`allow_anonymous=True` (tests, notebooks on one laptop); wrong or missing token -> 401 with a clear
message. Comparison is constant-time (hmac.compare_digest); the token never appears in errors or logs.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Header, HTTPException, status
from pydantic import SecretStr


def bearer_header(token: SecretStr | str | None) -> dict[str, str]:
    """Headers for an outbound call carrying the token (empty when there is none)."""
    if token is None:
        return {}
    value = token.get_secret_value() if isinstance(token, SecretStr) else token
    return {"Authorization": f"Bearer {value}"} if value else {}


def token_matches(expected: SecretStr | str, authorization: str | None) -> bool:
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    want = expected.get_secret_value() if isinstance(expected, SecretStr) else expected
    return hmac.compare_digest(given.strip().encode(), want.encode())


def require_token(token: SecretStr | str | None, *, allow_anonymous: bool = False) -> Callable[..., None]:
    """Build a dependency: `app.post(..., dependencies=[Depends(require_token(settings.token))])`."""

    def check(authorization: str | None = Header(default=None)) -> None:
        if token is None or (isinstance(token, SecretStr) and not token.get_secret_value()):
            if allow_anonymous:
                return
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "this server has no token configured (set SCANFLOW_TOKEN); mutating calls are refused",
            )
        if authorization is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing 'Authorization: Bearer <token>' header",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not token_matches(token, authorization):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
