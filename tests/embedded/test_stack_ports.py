"""EmbeddedStack ports: reserved when the stack is made, handed to each agent and gateway when it starts
(scanflow/embedded/stack.py, scanflow.handoff).

Why: the stack picks the agents' and gateways' ports before MLflow and the bootstrap start; when each
process bound its own port later, a CI run lost the Checker (another stack's server took its port in
between and kept it through three restarts). Tested here: without starting anything, that a made stack
holds every port against any other binder and lets go of them when stopped, and that a fixed port
already taken is a clear error; on one real stack (MLflow, bootstrap, the four agents as processes),
that the agents serve on their reservations and that a restart whose port someone took fails clearly.
The whole-stack test is in the `e2e` set (tests/conftest.py E2E_TESTS).
"""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from scanflow.embedded.stack import EmbeddedStack, StackError, health_agent


def _bind_fails(port: int) -> bool:
    """Whether another process's server (uvicorn sets SO_REUSEADDR) could not bind `port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
        return False


def test_a_made_stack_holds_its_ports_until_it_stops(tmp_path: Path) -> None:
    from scanflow.examples.digits.workflow import workflow

    stack = EmbeddedStack(tmp_path / "stack", workflow, quick=True)
    ports = [*stack.ports.values(), *(s.port for s in stack.workflow.services)]
    assert len(set(ports)) == len(ports) == 4 + len(workflow.services)
    try:
        assert [p for p in ports if not _bind_fails(p)] == []  # nobody takes one before its server starts
    finally:
        stack.stop()  # never started: the reservations are let go
    assert [p for p in ports if _bind_fails(p)] == []


def test_a_fixed_agent_port_someone_holds_is_refused_when_the_stack_is_made(tmp_path: Path) -> None:
    from scanflow.examples.digits.workflow import workflow

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        agents = [a.model_copy(update={"port": port}) if a.role == "checker" else a for a in workflow.agents]
        with pytest.raises(StackError, match=rf"agent checker: port {port} on 127.0.0.1 is in use"):
            EmbeddedStack(tmp_path / "stack", workflow.model_copy(update={"agents": agents}), quick=True)
        # what it had reserved before the clash is let go: the tracker's port, say, is free again
        spare = EmbeddedStack(tmp_path / "again", workflow, quick=True)
        spare.stop()


@pytest.mark.parametrize(("status", "body", "name"), [
    (200, {"status": "ok", "agent": "checker"}, "checker"),
    (200, {"status": "ok"}, None),  # a healthy answer, but from no agent
    (200, {"agent": 7}, None),
    (200, ["checker"], None),  # JSON, but not an object
    (200, "ok", None),
    (503, {"status": "starting", "agent": "checker"}, None),
])
def test_health_agent_names_only_an_agents_healthy_answer(status: int, body: object, name: str | None) -> None:
    assert health_agent(status, body) == name


# -- one real stack ------------------------------------------------------------------------------------
@contextmanager
def foreign_health_server(port: int, agent: str) -> Iterator[None]:
    """An HTTP server on `port` whose /health answers 200 as agent `agent` (another stack's, say)."""
    body = json.dumps({"status": "ok", "agent": agent}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # SO_REUSEADDR: the killed agent's TIME_WAITs
    t = threading.Thread(target=server.serve_forever, name="foreign-health", daemon=True)
    t.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_whole_stack_serves_on_its_reservations_and_a_taken_port_fails_a_restart_clearly(tmp_path: Path) -> None:
    from scanflow.examples.digits.workflow import workflow

    stack = EmbeddedStack(tmp_path / "stack", workflow, quick=True, ready_timeout_s=240.0)
    names = {a.role: a.name for a in stack.workflow.agents}
    assert _bind_fails(stack.ports["checker"])  # held from the start, through MLflow and the bootstrap
    with stack:
        for role, url in stack.agent_urls.items():
            assert httpx.get(url + "/health", timeout=10.0).json()["agent"] == names[role]
        assert httpx.get(stack.service_url + "/health", timeout=10.0).status_code == 200

        # the Planner dies and another server takes its port: the restart says so, naming both
        stack.kill_agent("planner")
        port = stack.ports["planner"]
        with (foreign_health_server(port, agent="someone-else"),
              pytest.raises(StackError, match=rf"agent planner: port {port} on 127.0.0.1 is in use")):
            stack.restart_agent("planner")
        stack.restart_agent("planner")  # once it is free again, the Planner comes back on it
        assert httpx.get(stack.agent_urls["planner"] + "/health", timeout=10.0).json()["agent"] == names["planner"]
