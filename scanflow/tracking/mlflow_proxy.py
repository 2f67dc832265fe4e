"""An authenticating proxy in front of MLflow: no caller reaches the knowledge base without a login,
and each login may do only what its role allows.

Why a proxy and not MLflow's own `--app-name basic-auth`: that app needs Flask-WTF (the `mlflow[auth]`
extra), which Scanflow's environment does not carry, and its permission model cannot say "may register
a model version but not move an alias" (both are EDIT on the registered model). The embedded stack runs
MLflow on a Unix socket in a 0700 directory (no TCP port at all) and this proxy on the TCP port clients
use; clients keep talking plain MLflow REST with `MLFLOW_TRACKING_USERNAME`/`_PASSWORD` (HTTP Basic, as
MLflow's client sends them) or `MLFLOW_TRACKING_TOKEN` (Bearer).

Logins come from `SCANFLOW_MLFLOW_USERS` (env, never argv): a JSON list of `{"name", "sha256", "role"}`,
the digest of the password (random, so unsalted SHA-256 is enough). What each role may call is decided
by scanflow.tracking.mlflow_routes (default-deny, by route group; the alias and tag a call touches read
from its body, where MLflow reads them); this module gathers the facts it needs: the body, and for a
write into a logged model's folder whether MLflow already finalized that model.
`GET /health` is open (liveness probes). Anything else without a known login is 401, a known login
outside its role 403; the password is never logged.

Launched as `scanflow mlflow proxy --port P --upstream URL` (compose, Kubernetes: a second container in
MLflow's pod, MLflow bound to the pod's loopback) or `python -m scanflow.tracking.mlflow_proxy --port P
--upstream-uds PATH` (scanflow.tracking.server.MlflowServer, when given users: the embedded stack). The
logins come from the environment or a mounted Secret file (`SCANFLOW_MLFLOW_USERS_FILE`), never argv.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from scanflow.auth import env_records, sha256_digest
from scanflow.tracking.mlflow_routes import (
    ROLE_GROUPS,
    ROLES,
    Facts,
    Role,
    body_facts,
    decide,
    logged_model_of,
    needs_body,
    route_group,
)

log = logging.getLogger("scanflow.tracking.mlflow_proxy")

USERS_ENV = "SCANFLOW_MLFLOW_USERS"
USERS_FILE_ENV = "SCANFLOW_MLFLOW_USERS_FILE"  # a mounted Secret file holding the same JSON
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                  "transfer-encoding", "upgrade", "host", "authorization", "content-length"})


@dataclass(frozen=True)
class Login:
    name: str
    role: Role


def password_digest(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def parse_users(text: str) -> list[tuple[str, bytes, Role]]:
    """SCANFLOW_MLFLOW_USERS -> (name, digest, role); ValueError naming what is wrong (never a secret)."""
    out: list[tuple[str, bytes, Role]] = []
    for i, e in enumerate(env_records(text, USERS_ENV, ("name", "sha256", "role"))):
        if not isinstance(e["name"], str) or not e["name"] or ":" in e["name"]:
            raise ValueError(f"{USERS_ENV}[{i}].name must be a non-empty string without ':'")
        if e["role"] not in ROLES:
            raise ValueError(f"{USERS_ENV}[{i}].role must be one of {', '.join(ROLES)}")
        digest = sha256_digest(e["sha256"], f"{USERS_ENV}[{i}].sha256")
        out.append((e["name"], digest, e["role"]))
    return out


def load_users(env: Mapping[str, str]) -> list[tuple[str, bytes, Role]]:
    """The logins from SCANFLOW_MLFLOW_USERS, else from the file SCANFLOW_MLFLOW_USERS_FILE names;
    ValueError (never a secret in it) when neither names a login: every call would be refused."""
    text = env.get(USERS_ENV, "").strip()
    if not text and env.get(USERS_FILE_ENV):
        try:
            with open(env[USERS_FILE_ENV], encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as exc:
            raise ValueError(f"{USERS_FILE_ENV}: cannot read {env[USERS_FILE_ENV]!r} ({exc.strerror})") from None
    users = parse_users(text or "[]")
    if not users:
        raise ValueError(f"{USERS_ENV} (or {USERS_FILE_ENV}) names no login: every call would be refused")
    return users


def serve(host: str, port: int, upstream: str | None, upstream_uds: str | None) -> None:
    """Run the proxy in the foreground (uvicorn handles SIGINT/SIGTERM); logins from the environment."""
    from scanflow.handoff import serve_uvicorn

    try:
        users = load_users(os.environ)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(users, upstream_client(upstream, upstream_uds))
    from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S, HeadDeadlineProtocol, with_head_timeout

    # slow request heads are cut (408) as on every Scanflow server
    serve_uvicorn(app, host=host, port=port, log_level="warning", access_log=False,
                  http=with_head_timeout(HeadDeadlineProtocol, DEFAULT_HEAD_TIMEOUT_S))


def users_json(users: Mapping[str, tuple[str, Role]]) -> str:
    """{name: (password, role)} -> the SCANFLOW_MLFLOW_USERS value (digests only)."""
    return json.dumps([{"name": n, "sha256": password_digest(p), "role": r} for n, (p, r) in users.items()])


def identify(users: list[tuple[str, bytes, Role]], authorization: str | None) -> Login | None:
    """The login an Authorization header proves (Basic user:password, or Bearer password), or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    name: str | None = None
    if scheme.lower() == "basic":
        try:
            name, sep, secret = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        if not sep:
            return None
    elif scheme.lower() == "bearer":
        secret = value
    else:
        return None
    digest = hashlib.sha256(secret.encode()).digest()
    found = None
    for user, want, role in users:
        if hmac.compare_digest(digest, want) and (name is None or hmac.compare_digest(name.encode(), user.encode())):
            found = Login(user, role)
    return found


async def finalized(upstream: httpx.AsyncClient, model_id: str) -> bool:
    """Whether MLflow finalized logged model `model_id` (its files are then immutable): True unless
    MLflow says it is still pending or does not exist; an unanswered lookup counts as finalized
    (refusing a write is recoverable, an overwritten model is not)."""
    try:
        r = await upstream.get("/api/2.0/mlflow/logged-models/" + model_id, timeout=30.0)
    except httpx.HTTPError:
        return True
    if r.status_code == 404:
        return False
    try:
        status = r.json()["model"]["info"]["status"]
    except (ValueError, KeyError, TypeError):
        return True
    return status != "LOGGED_MODEL_PENDING"


def create_app(users: list[tuple[str, bytes, Role]], upstream: httpx.AsyncClient) -> Starlette:
    async def health(_: Request) -> Response:
        """MLflow's own /health (open), so a probe of the proxy says whether MLflow answers."""
        try:
            r = await upstream.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return PlainTextResponse("MLflow is not answering", status_code=503)
        return PlainTextResponse(r.text, status_code=r.status_code)

    async def forward(request: Request) -> Response:
        login = identify(users, request.headers.get("authorization"))
        if login is None:
            return JSONResponse({"error_code": "UNAUTHENTICATED", "message": "MLflow needs a login "
                                 "(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)"},
                                status_code=401, headers={"WWW-Authenticate": 'Basic realm="mlflow"'})
        path, method = request.url.path, request.method
        body: bytes | None = None
        facts = Facts()
        if login.role != "admin":
            group = route_group(method, path)
            if method not in _READ_METHODS:
                body = await request.body()  # MLflow's REST bodies are small JSON; artifacts go whole anyway
            if needs_body(group):
                facts = body_facts(method, body or b"", request.query_params)
            model_id = logged_model_of(method, path)
            if model_id is not None and group in ROLE_GROUPS[login.role]:
                facts = replace(facts, frozen=await finalized(upstream, model_id))
        verdict = decide(login.role, method, path, facts)
        if not verdict.allowed:
            log.warning("refused %s %s to %s (role %s): %s", method, path, login.name, login.role, verdict.reason)
            return JSONResponse({"error_code": "PERMISSION_DENIED",
                                 "message": f"{login.name!r} ({login.role}) may not {method} {path}: "
                                            f"{verdict.reason}"}, status_code=403)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        if body is None and method not in _READ_METHODS:
            # whole, with its length: MLflow's WSGI app reads no chunked body (models are MBs, not GBs)
            body = await request.body()
        url = f"{path}?{request.url.query}" if request.url.query else path
        req = upstream.build_request(method, url, headers=headers, content=body)
        try:
            resp = await upstream.send(req, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error_code": "TEMPORARILY_UNAVAILABLE",
                                 "message": f"MLflow is not answering: {type(exc).__name__}"}, status_code=503)
        out = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP]
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=dict(out),
                                 background=BackgroundTask(resp.aclose))

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(routes=[Route("/health", health, methods=["GET", "HEAD"]),
                             Route("/{path:path}", forward, methods=methods)])


def upstream_client(url: str | None, uds: str | None) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
    return httpx.AsyncClient(base_url=url or "http://localhost", transport=transport,
                             timeout=httpx.Timeout(300.0, connect=10.0))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scanflow.tracking.mlflow_proxy")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", default=None, help="MLflow's URL (default http://localhost over --upstream-uds)")
    p.add_argument("--upstream-uds", default=None, help="MLflow's Unix socket")
    args = p.parse_args(argv)
    serve(args.host, args.port, args.upstream, args.upstream_uds)


if __name__ == "__main__":
    main()
