"""An authenticating proxy in front of MLflow: no caller reaches the knowledge base without a login,
and each login may do only what its role allows.

Why a proxy and not MLflow's own `--app-name basic-auth`: that app needs Flask-WTF (the `mlflow[auth]`
extra), which Scanflow's environment does not carry, and its permission model cannot say "may register
a model version but not move an alias" (both are EDIT on the registered model). The embedded stack runs
MLflow on a Unix socket in a 0700 directory (no TCP port at all) and this proxy on the TCP port clients
use; clients keep talking plain MLflow REST with `MLFLOW_TRACKING_USERNAME`/`_PASSWORD` (HTTP Basic, as
MLflow's client sends them) or `MLFLOW_TRACKING_TOKEN` (Bearer).

Logins come from `SCANFLOW_MLFLOW_USERS` (env, never argv): a JSON list of `{"name", "sha256", "role"}`,
the digest of the password (random, so unsalted SHA-256 is enough). Roles (`allowed`, a pure function):
- admin: everything (the stack's own bootstrap, the operator, the Executor which moves aliases).
- writer: everything but deleting experiments, registered models and model versions (agents).
- job: a writer that also may not set or delete a protected alias (`champion`, the one every replica
  loads: moving it is code execution in every replica at the next swap), rename models or change
  stages. A training Job logs runs, registers versions and may name its own (`challenger`); only the
  Executor promotes.
- reader: reads only (GETs and MLflow's read-only POSTs: searches, batch gets): replicas load models.
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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger("scanflow.tracking.mlflow_proxy")

USERS_ENV = "SCANFLOW_MLFLOW_USERS"
USERS_FILE_ENV = "SCANFLOW_MLFLOW_USERS_FILE"  # a mounted Secret file holding the same JSON
Role = Literal["admin", "writer", "job", "reader"]
ROLES: tuple[Role, ...] = ("admin", "writer", "job", "reader")
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# MLflow's read-only POSTs (searches and batch reads the Python client sends as POST)
_READ_POST = re.compile(r"/(search|get-history-bulk|get-history-bulk-interval|batch-get|search-datasets)$")
_DELETES = re.compile(r"/(experiments|registered-models|model-versions)/delete$")
_PROMOTION = re.compile(r"/registered-models/rename$|/model-versions/transition-stage$")
_ALIAS = re.compile(r"/registered-models/alias$")
PROTECTED_ALIASES = frozenset({"champion"})
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
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"{USERS_ENV} is not JSON") from None
    if not isinstance(doc, list):
        raise ValueError(f'{USERS_ENV} must be a JSON list of {{"name", "sha256", "role"}}')  # noqa: TRY004
    out: list[tuple[str, bytes, Role]] = []
    for i, e in enumerate(doc):
        if not isinstance(e, dict) or set(e) != {"name", "sha256", "role"}:
            raise ValueError(f'{USERS_ENV}[{i}] must have exactly "name", "sha256" and "role"')
        if not isinstance(e["name"], str) or not e["name"] or ":" in e["name"]:
            raise ValueError(f"{USERS_ENV}[{i}].name must be a non-empty string without ':'")
        if e["role"] not in ROLES:
            raise ValueError(f"{USERS_ENV}[{i}].role must be one of {', '.join(ROLES)}")
        try:
            digest = bytes.fromhex(e["sha256"]) if isinstance(e["sha256"], str) else b""
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise ValueError(f"{USERS_ENV}[{i}].sha256 must be 64 hex digits")
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
    import uvicorn

    try:
        users = load_users(os.environ)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(users, upstream_client(upstream, upstream_uds))
    from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S, HeadDeadlineProtocol, with_head_timeout

    # slow request heads are cut (408) as on every Scanflow server
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
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


def allowed(role: Role, method: str, path: str, alias: str | None = None) -> bool:
    """Pure: whether `role` may send `method path` to MLflow; `alias`: the alias an alias call names
    (None when it names none or could not be read: then a job is refused)."""
    if role == "admin":
        return True
    if method in _READ_METHODS or (method == "POST" and _READ_POST.search(path)):
        return True
    if role == "reader":
        return False
    if _DELETES.search(path):
        return False
    moves_protected = _ALIAS.search(path) is not None and (alias is None or alias in PROTECTED_ALIASES)
    return not (role == "job" and (_PROMOTION.search(path) is not None or moves_protected))


def alias_of(body: bytes, query: Mapping[str, str]) -> str | None:
    """The alias an alias call names: `alias` in its JSON body (POST) or its query (DELETE)."""
    if "alias" in query:
        return query["alias"]
    try:
        doc = json.loads(body) if body else None
    except (ValueError, RecursionError):  # not an alias MLflow would read either
        return None
    value = doc.get("alias") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


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
        path = request.url.path
        body: bytes | None = None
        alias = None
        if login.role == "job" and _ALIAS.search(path) and request.method not in _READ_METHODS:
            body = await request.body()  # a small JSON document: read it to see which alias it moves
            alias = alias_of(body, request.query_params)
        if not allowed(login.role, request.method, path, alias):
            log.warning("refused %s %s to %s (role %s)", request.method, path, login.name, login.role)
            return JSONResponse({"error_code": "PERMISSION_DENIED",
                                 "message": f"{login.name!r} ({login.role}) may not {request.method} {path}"},
                                status_code=403)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        if body is None and request.method not in _READ_METHODS:
            # whole, with its length: MLflow's WSGI app reads no chunked body (models are MBs, not GBs)
            body = await request.body()
        url = f"{path}?{request.url.query}" if request.url.query else path
        req = upstream.build_request(request.method, url, headers=headers, content=body)
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
