"""scanflow.auth (token tables, scopes) and scanflow.credentials (what a child process holds): pure."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from scanflow.auth import (
    ADMIN,
    AUTH_TOKENS_ENV,
    COMPONENT_SCOPES,
    SCOPES,
    TokenTable,
    require_token,
    token_digest,
)
from scanflow.credentials import child_env


def test_table_round_trips_holds_digests_only_and_identifies_by_token() -> None:
    table = TokenTable.of({"replica": ("r-tok", {"predictions:write"}), "operator": ("o-tok", {ADMIN})})
    text = table.to_json()
    assert "r-tok" not in text and token_digest("r-tok") in text
    again = TokenTable.parse(text)
    replica = again.identify("Bearer r-tok")
    assert replica is not None and replica.name == "replica"
    assert replica.allows("predictions:write") and not replica.allows("actuate")
    assert again.identify("bearer o-tok").allows("serving:admin")  # type: ignore[union-attr]
    for header in (None, "", "Bearer", "Bearer  ", "Basic r-tok", "Bearer r-tok2", "r-tok"):
        assert again.identify(header) is None


@pytest.mark.parametrize("text, fragment", [
    ("{", "not JSON"), ("{}", "JSON list"), ('[{"name": "a"}]', "exactly"),
    ('[{"name": "a", "sha256": "zz", "scopes": []}]', "64 hex"),
    ('[{"name": "a", "sha256": "' + "0" * 64 + '", "scopes": ["root"]}]', "scopes must be"),
])
def test_a_bad_table_is_refused_with_a_message_that_names_no_token(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        TokenTable.parse(text)


def test_env_table_wins_over_the_legacy_token_which_is_admin_alone() -> None:
    table = TokenTable.of({"replica": ("r", {"predictions:write"})})
    assert TokenTable.from_env("legacy", {AUTH_TOKENS_ENV: table.to_json()}).identify("Bearer legacy") is None
    admin = TokenTable.from_env("legacy", {})
    assert admin.identify("Bearer legacy").allows("strategies")  # type: ignore[union-attr]
    assert not TokenTable.from_env(None, {}) and not TokenTable.from_env("", {})


def test_require_token_statuses() -> None:
    check = require_token(TokenTable.of({"replica": ("r", {"predictions:write"})}), scope="serving:admin")
    for header, code in ((None, 401), ("Bearer x", 401), ("Bearer r", 403)):
        with pytest.raises(HTTPException) as exc:
            check(header)
        assert exc.value.status_code == code and "Bearer r" not in str(exc.value.detail)
    require_token(TokenTable.of({"replica": ("r", {"predictions:write"})}), scope="predictions:write")("Bearer r")
    with pytest.raises(HTTPException) as exc:
        require_token(TokenTable())("Bearer r")
    assert exc.value.status_code == 403
    require_token(TokenTable(), allow_anonymous=True)(None)
    with pytest.raises(ValueError):
        require_token("t", scope="everything")


def test_component_scopes_are_known_and_a_replica_can_only_write_records() -> None:
    assert all(s <= set(SCOPES) for s in COMPONENT_SCOPES.values())
    assert COMPONENT_SCOPES["replica"] == {"predictions:write"}
    assert "serving:admin" not in COMPONENT_SCOPES["planner"] and "strategies" not in COMPONENT_SCOPES["executor"]


def test_a_child_gets_its_own_credentials_never_its_parents() -> None:
    parent = {
        "PATH": "/bin", "SCANFLOW_TOKEN": "exec-tok", AUTH_TOKENS_ENV: "[]",
        "SCANFLOW_REPLICA_TOKEN": "rep-tok", "SCANFLOW_JOB_TOKEN": "job-tok",
        "MLFLOW_TRACKING_USERNAME": "executor", "MLFLOW_TRACKING_PASSWORD": "exec-pw",
        "SCANFLOW_REPLICA_MLFLOW_USERNAME": "replica", "SCANFLOW_REPLICA_MLFLOW_PASSWORD": "rep-pw",
    }
    rep = child_env(parent, "replica")
    assert rep["SCANFLOW_TOKEN"] == "rep-tok" and rep["MLFLOW_TRACKING_USERNAME"] == "replica"
    assert rep["MLFLOW_TRACKING_PASSWORD"] == "rep-pw" and rep["PATH"] == "/bin" and rep[AUTH_TOKENS_ENV] == "[]"
    assert not {"exec-tok", "exec-pw", "job-tok"} & set(rep.values())
    gw = child_env(parent, "gateway")  # scoped mode, no gateway token: none at all
    assert "SCANFLOW_TOKEN" not in gw and "SCANFLOW_REPLICA_TOKEN" not in gw
    assert "MLFLOW_TRACKING_USERNAME" not in gw and "MLFLOW_TRACKING_PASSWORD" not in gw
    legacy = child_env({"SCANFLOW_TOKEN": "one", "MLFLOW_TRACKING_USERNAME": "u"}, "gateway")
    assert legacy["SCANFLOW_TOKEN"] == "one" and legacy["MLFLOW_TRACKING_USERNAME"] == "u"  # one-token setups
