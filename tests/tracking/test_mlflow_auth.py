"""Security: MLflow, the knowledge base, refuses calls without a login, and each login is held to
its role (issue #15, item 3). The real MLflow server behind scanflow's authenticating proxy, and the
proxy's rules as pure functions."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scanflow.tracking.mlflow_proxy import alias_of, allowed, identify, parse_users, users_json
from scanflow.tracking.server import MlflowServer

USERS = {"admin": ("adm-pw-0123456789", "admin"), "tracker": ("trk-pw-0123456789", "writer"),
         "job": ("job-pw-0123456789", "job"), "replica": ("rep-pw-0123456789", "reader")}
API = "/api/2.0/mlflow"


def basic(name: str, password: str | None = None) -> dict[str, str]:
    raw = f"{name}:{password or USERS[name][0]}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def test_rules_by_role() -> None:
    assert allowed("reader", "GET", f"{API}/registered-models/alias")
    assert allowed("reader", "POST", f"{API}/runs/search")
    assert not allowed("reader", "POST", f"{API}/runs/log-batch")
    assert not allowed("reader", "PUT", "/api/2.0/mlflow-artifacts/artifacts/1/x")
    assert allowed("job", "POST", f"{API}/model-versions/create")
    assert allowed("job", "POST", f"{API}/registered-models/alias", "challenger")
    for alias in ("champion", None):
        assert not allowed("job", "POST", f"{API}/registered-models/alias", alias)
        assert not allowed("job", "DELETE", f"{API}/registered-models/alias", alias)
    assert allowed("writer", "POST", f"{API}/registered-models/alias", "champion")
    assert not allowed("writer", "DELETE", f"{API}/registered-models/delete")
    assert not allowed("writer", "POST", f"{API}/experiments/delete")
    assert allowed("admin", "DELETE", f"{API}/registered-models/delete")
    assert alias_of(b'{"name": "m", "alias": "champion", "version": "1"}', {}) == "champion"
    assert alias_of(b"", {"alias": "x"}) == "x" and alias_of(b"{", {}) is None


def test_logins_are_digests_and_checked_by_name_and_password() -> None:
    users = parse_users(users_json(USERS))  # type: ignore[arg-type]
    assert "adm-pw" not in users_json(USERS)  # type: ignore[arg-type]
    assert identify(users, basic("replica")["Authorization"]).role == "reader"  # type: ignore[union-attr]
    assert identify(users, "Bearer " + USERS["job"][0]).name == "job"  # type: ignore[union-attr]
    assert identify(users, basic("replica", USERS["admin"][0])["Authorization"]) is None  # wrong name
    for header in (None, "", "Basic !!", "Basic " + base64.b64encode(b"nocolon").decode(), "Bearer x", "Digest a"):
        assert identify(users, header) is None
    with pytest.raises(ValueError, match="role"):
        parse_users('[{"name": "a", "sha256": "' + "0" * 64 + '", "role": "root"}]')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-auth"), users=USERS, startup_timeout_s=240)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.integration
def test_unauthenticated_writes_are_refused_and_roles_hold(server: MlflowServer) -> None:
    url = server.url + API
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no login
    for headers in ({}, basic("admin", "wrong-password"), {"Authorization": "Bearer nope"}):
        for method, path, body in (("POST", "/experiments/create", {"name": "evil"}),
                                   ("POST", "/registered-models/create", {"name": "evil"}),
                                   ("GET", "/experiments/search?max_results=1", None)):
            r = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401, (headers, path, r.text)
    # MLflow behind the proxy has no TCP port of its own
    assert server.socket_path is not None and Path(server.socket_path).exists()
    admin = basic("admin")
    assert httpx.post(url + "/registered-models/create", json={"name": "m"}, headers=admin, timeout=30).status_code == 200
    run = httpx.post(url + "/runs/create", json={"experiment_id": "0"}, headers=basic("tracker"), timeout=30)
    assert run.status_code == 200, run.text
    info = run.json()["run"]["info"]
    mv = httpx.post(url + "/model-versions/create", headers=basic("job"), timeout=30,
                    json={"name": "m", "source": info["artifact_uri"] + "/model", "run_id": info["run_id"]})
    assert mv.status_code == 200, mv.text
    version = mv.json()["model_version"]["version"]
    champion = {"name": "m", "alias": "champion", "version": version}
    # a replica reads only; a Job may name a challenger but never move the champion; the admin may
    assert httpx.post(url + "/registered-models/alias", json=champion, headers=basic("replica"), timeout=30).status_code == 403
    assert httpx.post(url + "/registered-models/alias", json=champion, headers=basic("job"), timeout=30).status_code == 403
    assert httpx.post(url + "/registered-models/alias", json={**champion, "alias": "challenger"},
                      headers=basic("job"), timeout=30).status_code == 200
    assert httpx.post(url + "/registered-models/alias", json=champion, headers=admin, timeout=30).status_code == 200
    got = httpx.get(url + "/registered-models/alias", params={"name": "m", "alias": "champion"},
                    headers=basic("replica"), timeout=30)
    assert got.status_code == 200 and got.json()["model_version"]["version"] == version
    assert httpx.request("DELETE", url + "/registered-models/delete", json={"name": "m"}, headers=basic("tracker"),
                         timeout=30).status_code == 403
