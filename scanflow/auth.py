"""Bearer tokens with scopes for mutating endpoints (agents, Tracker, replicas, gateway admin).

One FastAPI dependency shared by every server so the rules are the same everywhere. A server accepts
the tokens of a `TokenTable`: each entry is a principal (a component: "replica", "planner", ...) with
the SHA-256 digest of its token and its scopes. A route names the scope it needs (`SCOPES`); a token
without it gets 403, a missing or unknown token 401, a server with no token at all 403 unless it was
started with `allow_anonymous=True` (tests, notebooks on one laptop).

Where the table comes from (`TokenTable.from_env`): `SCANFLOW_AUTH_TOKENS`, a JSON list of
`{"name", "sha256", "scopes"}` (digests only: a server never holds another component's token); without
it, the legacy single token `SCANFLOW_TOKEN` is accepted with every scope ("admin"), so one-token
setups keep working. Why scopes: with one shared token a replica's token could call the Executor's
actuators or move models; now a stolen replica token can only append prediction records.

Comparison is constant-time (hmac.compare_digest on digests); tokens never appear in errors or logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Header, HTTPException, status
from pydantic import SecretStr

AUTH_TOKENS_ENV = "SCANFLOW_AUTH_TOKENS"

ADMIN = "admin"  # every scope: the operator, and the legacy single SCANFLOW_TOKEN
SCOPES: dict[str, str] = {
    ADMIN: "everything below, and the strategies of every agent",
    "events:write": "POST /events to an agent (peers hand events on)",
    "actuate": "POST /actuators/* and /sensors/* of an agent (a strategy's action on a peer)",
    "strategies": "POST/DELETE /strategies of an agent",
    "predictions:write": "POST /predictions to the Tracker (replicas' records)",
    "feedback:write": "POST /feedback to the Tracker (true labels: they feed retraining)",
    "feedback:read": "POST /feedback/lookup and GET /feedback at the Tracker",
    "serving:admin": "/admin/* of replicas and gateways (swap model, drain, threads, route, replicas)",
}

# What each component of the reference loop holds (the embedded stack mints one token per entry).
COMPONENT_SCOPES: dict[str, frozenset[str]] = {
    "operator": frozenset({ADMIN}),
    # agents call each other's actuators when a strategy names a peer (the Tracker's check-drift runs
    # the Checker's check_drift), so each holds `actuate`; none may add strategies or administer serving
    "tracker": frozenset({"events:write", "actuate", "feedback:read"}),
    "checker": frozenset({"events:write", "actuate", "feedback:read"}),
    "planner": frozenset({"events:write", "actuate", "feedback:read"}),
    "executor": frozenset({"events:write", "actuate", "feedback:read", "serving:admin"}),
    "replica": frozenset({"predictions:write"}),
    "feedback": frozenset({"feedback:write"}),
}


def env_records(text: str, env: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """The JSON list of objects, each with exactly `keys`, that variable `env` holds; ValueError naming the
    variable and the entry at fault, never a value (they hold credential digests)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"{env} is not JSON") from None
    shape = ", ".join(f'"{k}"' for k in keys)
    if not isinstance(doc, list):
        raise ValueError(f"{env} must be a JSON list of {{{shape}}}")  # noqa: TRY004
    for i, e in enumerate(doc):
        if not isinstance(e, dict) or set(e) != set(keys):
            raise ValueError(f"{env}[{i}] must have exactly {shape}")
    return doc


def sha256_digest(value: Any, where: str) -> bytes:
    """The 32 bytes of a SHA-256 digest written as 64 hex digits; ValueError naming `where` otherwise."""
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"{where} must be 64 hex digits")
    return raw


def _secret(token: SecretStr | str) -> str:
    return token.get_secret_value() if isinstance(token, SecretStr) else token


def token_digest(token: SecretStr | str) -> str:
    """Hex SHA-256 of a token: what a TokenTable stores (a token is random, so no salt is needed)."""
    return hashlib.sha256(_secret(token).encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who a token belongs to and what it may do."""

    name: str
    scopes: frozenset[str]

    def allows(self, scope: str | None) -> bool:
        return scope is None or ADMIN in self.scopes or scope in self.scopes


@dataclass(frozen=True)
class TokenTable:
    """Accepted tokens (by digest) -> principals. Empty: no token configured."""

    entries: tuple[tuple[str, bytes, Principal], ...] = ()

    @classmethod
    def of(cls, tokens: Mapping[str, tuple[SecretStr | str, Iterable[str]]]) -> TokenTable:
        """From {name: (token, scopes)} (tests, the embedded stack)."""
        return cls(tuple((name, bytes.fromhex(token_digest(tok)), Principal(name, frozenset(sc)))
                         for name, (tok, sc) in tokens.items()))

    @classmethod
    def parse(cls, text: str) -> TokenTable:
        """From the JSON of SCANFLOW_AUTH_TOKENS; ValueError naming what is wrong (never a token)."""
        out = []
        for i, e in enumerate(env_records(text, AUTH_TOKENS_ENV, ("name", "sha256", "scopes"))):
            name, scopes = e["name"], e["scopes"]
            if not isinstance(name, str) or not name:
                raise ValueError(f"{AUTH_TOKENS_ENV}[{i}].name must be a non-empty string")
            raw = sha256_digest(e["sha256"], f"{AUTH_TOKENS_ENV}[{i}].sha256")
            if not isinstance(scopes, list) or not all(isinstance(s, str) and s in SCOPES for s in scopes):
                raise ValueError(f"{AUTH_TOKENS_ENV}[{i}].scopes must be a list of: {', '.join(SCOPES)}")
            out.append((name, raw, Principal(name, frozenset(scopes))))
        return cls(tuple(out))

    @classmethod
    def from_env(cls, legacy_token: SecretStr | str | None, env: Mapping[str, str] | None = None) -> TokenTable:
        """SCANFLOW_AUTH_TOKENS when set; else `legacy_token` (SCANFLOW_TOKEN) as an all-scopes admin."""
        env = os.environ if env is None else env
        text = env.get(AUTH_TOKENS_ENV, "").strip()
        if text:
            return cls.parse(text)
        if legacy_token is None or not _secret(legacy_token):
            return cls()
        return cls.of({"admin": (legacy_token, {ADMIN})})

    def to_json(self) -> str:
        """The SCANFLOW_AUTH_TOKENS value of this table (digests only)."""
        return json.dumps([{"name": n, "sha256": d.hex(), "scopes": sorted(p.scopes)} for n, d, p in self.entries])

    def identify(self, authorization: str | None) -> Principal | None:
        """The principal whose token the header carries, or None. Every entry is compared (no early
        exit), in constant time per entry."""
        if not authorization:
            return None
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return None
        digest = hashlib.sha256(given.strip().encode()).digest()
        found = None
        for _, want, principal in self.entries:
            if hmac.compare_digest(digest, want):
                found = principal
        return found

    def __bool__(self) -> bool:
        return bool(self.entries)


def bearer_header(token: SecretStr | str | None) -> dict[str, str]:
    """Headers for an outbound call carrying the token (empty when there is none)."""
    if token is None:
        return {}
    value = _secret(token)
    return {"Authorization": f"Bearer {value}"} if value else {}


def token_matches(expected: SecretStr | str, authorization: str | None) -> bool:
    """Whether the header carries exactly `expected` (a single-token check)."""
    return TokenTable.of({"t": (expected, ())}).identify(authorization) is not None


def require_token(
    token: SecretStr | str | TokenTable | None,
    *,
    allow_anonymous: bool = False,
    scope: str | None = None,
) -> Callable[..., None]:
    """Build a dependency: `app.post(..., dependencies=[Depends(require_token(settings.token, scope=...))])`.

    `token`: a TokenTable, or the server's SCANFLOW_TOKEN (then the table is `TokenTable.from_env`).
    `scope`: what the route needs (a key of SCOPES); None: any accepted token."""
    if scope is not None and scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    table = token if isinstance(token, TokenTable) else TokenTable.from_env(token)

    def check(authorization: str | None = Header(default=None)) -> None:
        if not table:
            if allow_anonymous:
                return
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                "this server has no token configured (set SCANFLOW_TOKEN or SCANFLOW_AUTH_TOKENS); "
                "mutating calls are refused",
            )
        if authorization is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "missing 'Authorization: Bearer <token>' header",
                headers={"WWW-Authenticate": "Bearer"},
            )
        principal = table.identify(authorization)
        if principal is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                "invalid bearer token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not principal.allows(scope):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"the token of {principal.name!r} lacks the scope {scope!r} this call needs",
            )

    return check
