"""Discovery from configuration (issue 14): peers, the Tracker and the watched services come from
SCANFLOW_* settings or the SCANFLOW_CONFIG file, the same on every platform; nothing builds loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanflow.agentkit.env import loopback_url, service_url
from scanflow.settings import Settings, parse_url_map
from scanflow.spec import Service

SVC = Service(name="digits", model_uri="models:/digits@champion", port=18080)


def test_peers_and_service_urls_parse_from_a_comma_list_or_json(monkeypatch) -> None:
    monkeypatch.setenv("SCANFLOW_PEERS", "tracker=http://tracker:8080, checker=http://checker:8080/")
    monkeypatch.setenv("SCANFLOW_SERVICE_URLS", '{"digits": "http://digits-gateway:8080"}')
    s = Settings()
    assert s.peers == {"tracker": "http://tracker:8080", "checker": "http://checker:8080"}
    assert s.service_urls == {"digits": "http://digits-gateway:8080"}
    assert s.tracker_endpoint() == "http://tracker:8080"  # replicas' Tracker defaults to the peer
    monkeypatch.setenv("SCANFLOW_TRACKER_URL", "http://tracker.scanflow.svc:8080/")
    assert Settings().tracker_endpoint() == "http://tracker.scanflow.svc:8080"


@pytest.mark.parametrize("bad", ["tracker", "tracker=tracker:8080", "=http://x:1"])
def test_a_bad_entry_fails_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="SCANFLOW_PEERS"):
        parse_url_map(bad, "SCANFLOW_PEERS")


def test_config_file_is_read_and_the_environment_wins(tmp_path: Path, monkeypatch) -> None:
    cfg = tmp_path / "scanflow.yaml"
    cfg.write_text("peers: {tracker: 'http://from-file:8080', planner: 'http://planner:8080'}\n"
                   "service_urls: {digits: 'http://digits-gateway:8080'}\nnamespace: team-a\n")
    monkeypatch.setenv("SCANFLOW_CONFIG", str(cfg))
    monkeypatch.setenv("SCANFLOW_NAMESPACE", "team-b")
    s = Settings()
    assert s.peers["planner"] == "http://planner:8080" and s.namespace == "team-b"
    assert service_url(SVC) == "http://digits-gateway:8080"
    monkeypatch.setenv("SCANFLOW_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(FileNotFoundError, match="SCANFLOW_CONFIG"):
        Settings()


def test_peer_flags_override_configuration_and_an_agent_is_not_its_own_peer(monkeypatch) -> None:
    monkeypatch.setenv("SCANFLOW_PEERS", "tracker=http://tracker:8080,checker=http://checker:8080")
    peers = Settings().peer_urls({"checker": "http://127.0.0.1:9"}, own_name="tracker")
    assert peers == {"checker": "http://127.0.0.1:9"}


def test_service_url_comes_from_configuration_never_from_a_port(monkeypatch) -> None:
    monkeypatch.delenv("SCANFLOW_SERVICE_URLS", raising=False)
    monkeypatch.delenv("SCANFLOW_CONFIG", raising=False)
    with pytest.raises(LookupError, match="SCANFLOW_SERVICE_URLS"):
        service_url(SVC)  # a port alone is no address: in a pod 127.0.0.1 is the agent itself
    monkeypatch.setenv("SCANFLOW_SERVICE_URLS", "digits=http://digits-gateway:8080")
    assert service_url(SVC) == "http://digits-gateway:8080"
    assert loopback_url(SVC) == "http://127.0.0.1:18080"  # only the embedded stack uses this


def test_embedded_stack_sets_the_same_settings_with_loopback_values(tmp_path: Path) -> None:
    from scanflow.embedded.stack import EmbeddedStack
    from scanflow.spec import load_workflow

    root = Path(__file__).resolve().parents[2]
    stack = EmbeddedStack(tmp_path, load_workflow(root / "workflows/digits/workflow.yaml"))
    env = stack._env("checker")
    peers = parse_url_map(env["SCANFLOW_PEERS"])
    assert set(peers) == {"tracker", "planner", "executor"}
    assert parse_url_map(env["SCANFLOW_SERVICE_URLS"]) == stack.service_urls
    assert env["SCANFLOW_TRACKER_URL"] == stack.agent_urls["tracker"]
    assert "--peer" not in stack._argv("checker")


def test_local_executor_serves_where_the_configuration_says() -> None:
    from scanflow.platform.adoption import at_configured_port

    urls = {"digits": "http://executor:8090"}
    assert at_configured_port(Service(name="digits", model_uri="models:/d@champion"), urls).port == 8090
    assert at_configured_port(SVC, urls).port == 18080  # a declared port wins
    other = Service(name="other", model_uri="models:/d@champion")
    assert at_configured_port(other, urls) is other
