"""Security: MLflow, the knowledge base, refuses calls without a login, and each login is held to
its role (issue #15, item 3). The real MLflow server behind scanflow's authenticating proxy, and the
proxy's rules as pure functions."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scanflow.private_files import open_to_others
from scanflow.tracking.mlflow_proxy import identify, parse_users, users_json
from scanflow.tracking.mlflow_routes import (
    GROUPS,
    ROLE_GROUPS,
    Facts,
    body_facts,
    decide,
    logged_model_of,
    route_group,
)
from scanflow.tracking.server import MlflowServer

USERS = {"admin": ("adm-pw-0123456789", "admin"), "executor": ("exe-pw-0123456789", "executor"),
         "tracker": ("trk-pw-0123456789", "writer"), "checker": ("chk-pw-0123456789", "writer"),
         "planner": ("pln-pw-0123456789", "writer"), "job": ("job-pw-0123456789", "job"),
         "replica": ("rep-pw-0123456789", "reader")}
API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"


def basic(name: str, password: str | None = None) -> dict[str, str]:
    raw = f"{name}:{password or USERS[name][0]}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


def allowed(role: str, method: str, path: str, alias: str | None = None) -> bool:
    facts = Facts(aliases=frozenset({alias}) if alias else frozenset())
    return decide(role, method, path, facts).allowed  # type: ignore[arg-type]


def test_rules_by_role() -> None:
    assert allowed("reader", "GET", f"{API}/registered-models/alias")
    assert allowed("reader", "POST", f"{API}/runs/search")
    assert not allowed("reader", "POST", f"{API}/runs/log-batch")
    assert not allowed("reader", "PUT", f"{ARTIFACTS}/1/x")
    assert allowed("job", "POST", f"{API}/model-versions/create")
    assert allowed("job", "POST", f"{API}/registered-models/alias", "challenger")
    for alias in ("champion", None):
        assert not allowed("job", "POST", f"{API}/registered-models/alias", alias)
        assert not allowed("job", "DELETE", f"{API}/registered-models/alias", alias)
    # only the Executor moves aliases among the agents
    assert not allowed("writer", "POST", f"{API}/registered-models/alias", "champion")
    assert not allowed("writer", "POST", f"{API}/registered-models/alias", "challenger")
    assert allowed("executor", "POST", f"{API}/registered-models/alias", "champion")
    # nobody but admin deletes anything
    for role in ("executor", "writer", "job", "reader"):
        for method, path in (("DELETE", f"{API}/registered-models/delete"), ("POST", f"{API}/experiments/delete"),
                             ("POST", f"{API}/runs/delete"), ("DELETE", f"{API}/logged-models/m-0123abcd"),
                             ("DELETE", f"{ARTIFACTS}/1/models/m-0123abcd/artifacts/model.pkl"),
                             ("POST", "/ajax-api/2.0/mlflow/runs/delete")):
            assert not allowed(role, method, path), (role, method, path)
    assert allowed("admin", "DELETE", f"{API}/registered-models/delete")


def test_unknown_routes_are_the_operators_only() -> None:
    """Default-deny: a route no group names (AI gateway secrets, webhooks, traces, a route a future
    MLflow adds) is refused to every role but admin, reads included."""
    for method, path in (("GET", "/api/3.0/mlflow/gateway/secrets/list"), ("POST", f"{API}/webhooks"),
                         ("POST", "/graphql"), ("GET", f"{API}/a-route-mlflow-adds-next-year"),
                         ("POST", "/ajax-api/2.0/mlflow/upload-artifact"),
                         ("POST", f"{API}/artifacts/presigned-upload-url")):
        assert route_group(method, path) == "other", path
        assert decide("admin", method, path).allowed
        for role in ("executor", "writer", "job", "reader"):
            assert not decide(role, method, path).allowed  # type: ignore[arg-type]


def test_every_mlflow_route_has_a_group_and_reads_stay_reads() -> None:
    """Walk MLflow's own route table: a read route (GET) is never sorted into a write group, and the
    routes the Python client uses to log a model land where the roles expect them."""
    from mlflow.server import app

    groups: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(path:)?[a-z_]+>", "m-0123abcd", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            group = route_group(method, path)
            groups.setdefault(group, set()).add(f"{method} {rule.rule}")
            if method == "GET":
                assert group in ("read", "other"), (method, rule.rule, group)
    assert set(groups) == set(GROUPS), set(GROUPS) - set(groups)
    for needed in ("POST /api/2.0/mlflow/logged-models", "PATCH /api/2.0/mlflow/logged-models/<model_id>",
                   "PUT /api/2.0/mlflow-artifacts/artifacts/<path:artifact_path>"):
        assert needed in groups["model-register"] | groups["artifact-write"], needed


def test_alias_is_read_where_mlflow_reads_it() -> None:
    """MLflow reads a POST's and a DELETE's alias from the JSON body: a query-string alias cannot
    make a Job's champion move look like a challenger move, and a disagreement is refused."""
    path = f"{API}/registered-models/alias"
    body = b'{"name": "m", "alias": "champion", "version": "1"}'
    for method in ("POST", "DELETE"):
        facts = body_facts(method, body, {"alias": "challenger"})
        assert facts.aliases == {"champion", "challenger"}
        assert not decide("job", method, path, facts).allowed
        assert not decide("executor", method, path, facts).allowed  # the two readers disagree
        assert decide("job", method, path, body_facts(method, body.replace(b"champion", b"challenger"), {})).allowed
    assert not body_facts("POST", b"{", {}).body_ok
    assert not decide("job", "POST", path, body_facts("POST", b"[1]", {})).allowed
    assert not decide("job", "POST", path, body_facts("POST", b'{"alias": 7}', {})).allowed


def test_digest_tag_and_finalized_models_are_protected() -> None:
    digest = b'{"name": "m", "version": "1", "key": "scanflow.model_digest", "value": "x"}'
    for method, path in (("POST", f"{API}/model-versions/set-tag"), ("DELETE", f"{API}/model-versions/delete-tag")):
        facts = body_facts(method, digest, {})
        assert decide("executor", method, path, facts).allowed
        for role in ("writer", "job"):
            assert not decide(role, method, path, facts).allowed  # type: ignore[arg-type]
    create = b'{"name": "m", "source": "s", "tags": [{"key": "scanflow.model_digest", "value": "x"}]}'
    assert not decide("job", "POST", f"{API}/model-versions/create", body_facts("POST", create, {})).allowed
    put = f"{ARTIFACTS}/1/models/m-0123abcd/artifacts/model.pkl"
    assert logged_model_of("PUT", put) == "m-0123abcd"
    assert logged_model_of("PATCH", f"{API}/logged-models/m-0123abcd") == "m-0123abcd"
    assert logged_model_of("PUT", f"{ARTIFACTS}/1/0f3a/artifacts/model/model.pkl") is None  # a run's folder
    assert decide("job", "PUT", put).allowed
    for role in ("executor", "writer", "job"):
        assert not decide(role, "PUT", put, Facts(frozen=True)).allowed  # type: ignore[arg-type]
        assert not decide(role, "PATCH", f"{API}/logged-models/m-0123abcd", Facts(frozen=True)).allowed  # type: ignore[arg-type]


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


@pytest.mark.parametrize("text, fragment", [
    ("[", "SCANFLOW_MLFLOW_USERS is not JSON"), ("{}", "JSON list"), ('[{"name": "a"}]', r"\[0\] must have exactly"),
    ('[{"name": "a:b", "sha256": "' + "0" * 64 + '", "role": "reader"}]', "without ':'"),
    ('[{"name": "a", "sha256": "' + "0" * 63 + '", "role": "reader"}]', r"\[0\].sha256 must be 64 hex digits"),
    ('[{"name": "a", "sha256": 7, "role": "reader"}]', "64 hex digits"),
])
def test_a_bad_users_table_is_refused_naming_the_entry_never_a_digest(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as caught:
        parse_users(text)
    assert "0" * 32 not in str(caught.value)


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


def call(server: MlflowServer, login: str, method: str, path: str, body: dict | None = None,
         content: bytes | None = None, params: dict | None = None) -> httpx.Response:
    return httpx.request(method, server.url + path, json=body, content=content, params=params,
                         headers=basic(login), timeout=60)


@pytest.fixture(scope="module")
def champion(server: MlflowServer) -> dict[str, str]:
    """A registered model whose version 1 (a finalized logged model, files written by the Job) is the
    champion: the asset every attack below goes for."""
    exp = call(server, "admin", "POST", f"{API}/experiments/create", {"name": "attacks"}).json()["experiment_id"]
    run = call(server, "job", "POST", f"{API}/runs/create", {"experiment_id": exp}).json()["run"]["info"]
    made = call(server, "job", "POST", f"{API}/logged-models",
                {"experiment_id": exp, "name": "model", "source_run_id": run["run_id"]})
    assert made.status_code == 200, made.text
    model = made.json()["model"]["info"]
    model_id = model["model_id"]
    folder = f"{ARTIFACTS}/{exp}/models/{model_id}/artifacts"
    assert model["artifact_uri"].endswith(f"{exp}/models/{model_id}/artifacts"), model["artifact_uri"]
    # while pending, the Job that logs the model writes its files
    assert call(server, "job", "PUT", f"{folder}/model.pkl", content=b"the real model").status_code == 200
    done = call(server, "job", "PATCH", f"{API}/logged-models/{model_id}", {"model_id": model_id,
                                                                           "status": "LOGGED_MODEL_READY"})
    assert done.status_code == 200, done.text
    assert call(server, "admin", "POST", f"{API}/registered-models/create", {"name": "attacked"}).status_code == 200
    mv = call(server, "job", "POST", f"{API}/model-versions/create",
              {"name": "attacked", "source": f"models:/{model_id}", "model_id": model_id, "run_id": run["run_id"]})
    assert mv.status_code == 200, mv.text
    version = mv.json()["model_version"]["version"]
    assert call(server, "executor", "POST", f"{API}/registered-models/alias",
                {"name": "attacked", "alias": "champion", "version": version}).status_code == 200
    return {"exp": exp, "run_id": run["run_id"], "model_id": model_id, "folder": folder, "version": version}


def champion_version(server: MlflowServer) -> str:
    r = call(server, "replica", "GET", f"{API}/registered-models/alias", params={"name": "attacked", "alias": "champion"})
    return r.json()["model_version"]["version"]


@pytest.mark.integration
def test_query_string_alias_cannot_move_the_champion(server: MlflowServer, champion: dict[str, str]) -> None:
    """The attack: a Job's login adds `?alias=challenger` to a call whose body moves `champion`. MLflow
    acts on the body; so does the proxy now (403 both ways, the champion unmoved)."""
    made = call(server, "job", "POST", f"{API}/model-versions/create",
                {"name": "attacked", "source": f"models:/{champion['model_id']}", "model_id": champion["model_id"],
                 "run_id": champion["run_id"]})
    assert made.status_code == 200, made.text
    other = made.json()["model_version"]["version"]
    path = f"{API}/registered-models/alias"
    for login in ("job", "tracker", "checker", "planner", "replica"):
        moved = call(server, login, "POST", path, {"name": "attacked", "alias": "champion", "version": other},
                     params={"alias": "challenger"})
        assert moved.status_code == 403, (login, moved.text)
        dropped = call(server, login, "DELETE", path, {"name": "attacked", "alias": "champion"},
                       params={"alias": "challenger"})
        assert dropped.status_code == 403, (login, dropped.text)
        assert champion_version(server) == champion["version"]
    # the Job still names its own challenger; the Executor alone moves the champion
    assert call(server, "job", "POST", path, {"name": "attacked", "alias": "challenger", "version": other}).status_code == 200
    for login in ("tracker", "checker", "planner"):
        assert call(server, login, "POST", path, {"name": "attacked", "alias": "challenger",
                                                  "version": other}).status_code == 403


@pytest.mark.integration
def test_no_component_login_changes_or_deletes_what_the_champion_loads(
        server: MlflowServer, champion: dict[str, str]) -> None:
    """Artifact writes and deletes in the champion's logged model, run deletes, logged-model and
    version deletes, and the digest tag: 403 for the Job, Tracker, Checker and Planner logins (and
    the Executor's, but for the digest tag, which is its job); the files are unchanged."""
    folder, model_id = champion["folder"], champion["model_id"]
    attacks = [("PUT", f"{folder}/model.pkl", None, b"evil"), ("PUT", f"{folder}/extra.py", None, b"evil"),
               ("DELETE", f"{folder}/model.pkl", None, None),
               ("POST", f"/api/2.0/mlflow-artifacts/mpu/create/{champion['exp']}/models/{model_id}/artifacts/model.pkl",
                {"path": "model.pkl", "num_parts": 1}, None),
               ("POST", f"{API}/runs/delete", {"run_id": champion["run_id"]}, None),
               ("DELETE", f"{API}/logged-models/{model_id}", None, None),
               ("PATCH", f"{API}/logged-models/{model_id}", {"model_id": model_id, "status": "LOGGED_MODEL_PENDING"}, None),
               ("DELETE", f"{API}/model-versions/delete", {"name": "attacked", "version": champion["version"]}, None),
               ("DELETE", f"{API}/registered-models/delete", {"name": "attacked"}, None)]
    for login in ("job", "tracker", "checker", "planner", "executor", "replica"):
        for method, path, body, content in attacks:
            r = call(server, login, method, path, body, content)
            assert r.status_code == 403, (login, method, path, r.status_code, r.text)
    digest = {"name": "attacked", "version": champion["version"], "key": "scanflow.model_digest", "value": "forged"}
    for login in ("job", "tracker", "checker", "planner", "replica"):
        assert call(server, login, "POST", f"{API}/model-versions/set-tag", digest).status_code == 403
    assert call(server, "executor", "POST", f"{API}/model-versions/set-tag", {**digest, "value": "ok"}).status_code == 200
    got = call(server, "replica", "GET", f"{folder}/model.pkl")
    assert got.status_code == 200 and got.content == b"the real model"
    run = call(server, "replica", "GET", f"{API}/runs/get", params={"run_id": champion["run_id"]})
    assert run.json()["run"]["info"]["lifecycle_stage"] == "active"


# One request per route group, as a component would send it; `{run}` is a run the walk made.
GROUP_PROBES: dict[str, tuple[str, str, dict | None]] = {
    "read": ("GET", f"{API}/experiments/search?max_results=1", None),
    "experiment-write": ("POST", f"{API}/experiments/create", {"name": "walk-{login}"}),
    "run-write": ("POST", f"{API}/runs/create", {"experiment_id": "0"}),
    "artifact-write": ("PUT", ARTIFACTS + "/0/{run}/artifacts/walk-{login}.txt", None),
    "model-register": ("POST", f"{API}/registered-models/create", {"name": "walk-{login}"}),
    "model-describe": ("POST", f"{API}/registered-models/set-tag", {"name": "walked", "key": "k", "value": "v"}),
    "alias": ("POST", f"{API}/registered-models/alias", {"name": "walked", "alias": "challenger", "version": "1"}),
    "stage": ("POST", f"{API}/registered-models/rename", {"name": "walk-missing", "new_name": "walk-{login}-2"}),
    "delete": ("POST", f"{API}/runs/delete", {"run_id": "{run}"}),
    "other": ("GET", "/api/3.0/mlflow/gateway/secrets/list", None),
}


def documented_groups() -> dict[str, set[str]]:
    """docs/security.md's table of MLflow route groups: {role: groups marked allowed}."""
    text = (Path(__file__).resolve().parents[2] / "docs/security.md").read_text(encoding="utf-8")
    section = text.split("### MLflow route groups", 1)[1].split("\n#", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    header = next(ln for ln in section.splitlines() if ln.startswith("| group"))
    roles = [c.strip() for c in header.strip("|").split("|")[1:]]
    out: dict[str, set[str]] = {r: set() for r in roles}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        group = cells[0].strip("`")
        for role, cell in zip(roles, cells[1:1 + len(roles)], strict=True):
            if cell == "yes":
                out[role].add(group)
    return out


@pytest.mark.integration
def test_every_login_against_every_route_group_matches_the_docs(server: MlflowServer) -> None:
    """docs/security.md's credential table is what the proxy enforces: every login sends one request
    of each route group to the real MLflow behind the proxy; allowed groups are not refused (any
    answer but 401/403), the others are 403."""
    doc = documented_groups()
    roles = {role for _, role in USERS.values()}
    assert set(doc) == roles and {g for gs in doc.values() for g in gs} <= set(GROUPS)
    assert call(server, "admin", "POST", f"{API}/registered-models/create", {"name": "walked"}).status_code == 200
    run0 = call(server, "admin", "POST", f"{API}/runs/create", {"experiment_id": "0"}).json()["run"]["info"]
    call(server, "admin", "POST", f"{API}/model-versions/create",
         {"name": "walked", "source": run0["artifact_uri"] + "/m", "run_id": run0["run_id"]})
    seen: dict[str, set[str]] = {}
    for login, (_, role) in sorted(USERS.items(), key=lambda kv: kv[1][1] == "admin"):  # admin last: it deletes
        run = call(server, "admin", "POST", f"{API}/runs/create", {"experiment_id": "0"}).json()["run"]["info"]["run_id"]
        for group, (method, path, body) in GROUP_PROBES.items():
            fill = {"login": login, "run": run}
            url = path.format(**fill)
            payload = {k: v.format(**fill) if isinstance(v, str) else v for k, v in (body or {}).items()} or None
            r = call(server, login, method, url, payload, b"x" if method == "PUT" else None)
            assert r.status_code != 401, (login, group, r.text)
            if r.status_code != 403:
                seen.setdefault(role, set()).add(group)
    for role in roles:
        assert seen.get(role, set()) == doc[role], (role, seen.get(role), doc[role])
        assert doc[role] == set(ROLE_GROUPS[role]), role  # type: ignore[index]


@pytest.mark.integration
def test_the_knowledge_base_files_are_private(server: MlflowServer, champion: dict[str, str]) -> None:
    """After runs, models and artifacts were written: MLflow's database, artifacts and log are 0600
    in 0700 folders, so another account on the machine reads no model or label without a login."""
    assert champion  # the module's writes happened
    assert any(server.home.rglob("model.pkl")) and (server.home / "mlflow.db").exists()
    assert open_to_others(server.home) == []
