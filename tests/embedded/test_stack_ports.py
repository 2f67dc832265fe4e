"""EmbeddedStack start-up when an agent's port is not its own (scanflow/embedded/stack.py).

Why: the stack picks the agents' ports (free right then) before the bootstrap, and each agent binds its
port only later. A clean-clone CI run lost the Checker that way (its port was taken in between) while
the stack carried on without it. Two defences are tested here: the decision "start it again or fail"
(pure, unit tests), and, on one real stack (MLflow, bootstrap, the four agents as processes), that a
busy port is survived and that a foreign server answering /health on an agent's port is not taken for
the agent. The whole-stack test is in the `e2e` set (tests/conftest.py E2E_TESTS).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from scanflow.embedded.stack import (
    ADDR_IN_USE,
    BIND_RETRIES,
    EmbeddedStack,
    StackError,
    bind_failure_action,
    health_agent,
)

# the line uvicorn logs when its bind fails (it then exits with status 3)
UVICORN_BIND_FAILURE = ("INFO:     Started server process [13674]\n"
                        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 38525): "
                        "address already in use\nINFO:     Application shutdown complete.\n")


# -- the decision (pure) -------------------------------------------------------------------------------
@pytest.mark.parametrize("respawns", range(BIND_RETRIES))
def test_a_failed_bind_is_retried_while_retries_remain(respawns: int) -> None:
    assert bind_failure_action(UVICORN_BIND_FAILURE, 3, respawns) == "respawn"


def test_a_failed_bind_fails_once_the_retries_are_spent() -> None:
    assert bind_failure_action(UVICORN_BIND_FAILURE, 3, BIND_RETRIES) == "fail"
    assert bind_failure_action(UVICORN_BIND_FAILURE, 1, 0, retries=0) == "fail"


def test_the_bind_failure_is_recognised_whatever_its_case() -> None:
    assert bind_failure_action("OSError: [Errno 98] Address already in use", 1, 0) == "respawn"


@pytest.mark.parametrize(("output", "returncode"), [
    ("Traceback ...\nModuleNotFoundError: No module named 'torch'\n", 1),  # a crash: trying again cures nothing
    ("", 1),  # no output at all
    (UVICORN_BIND_FAILURE, 0),  # a clean exit is not a port clash
    (UVICORN_BIND_FAILURE, -9),  # killed by a signal (SIGKILL), whatever it logged before
])
def test_anything_but_a_failed_bind_fails(output: str, returncode: int) -> None:
    assert bind_failure_action(output, returncode, 0) == "fail"


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
def port_held_until_logged(port: int, log: Path, needle: str, timeout_s: float) -> Iterator[threading.Event]:
    """Bind `port` (no listen; no SO_REUSEADDR, so a uvicorn bind on it fails) and close it as soon as
    `log` shows `needle`. Yields an event set at that moment (stays unset if the deadline passed)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", port))
    seen, done = threading.Event(), threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while not done.is_set() and time.monotonic() < deadline:
                if log.exists() and needle in log.read_text(errors="replace").lower():
                    seen.set()
                    return
                done.wait(0.05)  # poll interval of the log, not a synchronisation
        finally:
            holder.close()

    t = threading.Thread(target=watch, name="port-holder", daemon=True)
    t.start()
    try:
        yield seen
    finally:
        done.set()
        t.join(timeout=10)
        holder.close()


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
def test_whole_stack_survives_a_busy_port_and_refuses_a_foreign_agent(tmp_path: Path) -> None:
    from workflows.digits.workflow import workflow

    stack = EmbeddedStack(tmp_path / "stack", workflow, quick=True, ready_timeout_s=240.0)
    names = {a.role: a.name for a in stack.workflow.agents}
    checker_log = stack.log_path("checker")
    with (port_held_until_logged(stack.ports["checker"], checker_log, ADDR_IN_USE, timeout_s=240.0) as released,
          stack):
        # the Checker's first start could not bind; the stack waited and started it again
        assert released.is_set(), f"the checker never logged a failed bind:\n{checker_log.read_text()}"
        log_text = checker_log.read_text(errors="replace")
        assert ADDR_IN_USE in log_text.lower()
        assert log_text.count("Started server process") >= 2, log_text
        assert stack.alive("checker")
        health = httpx.get(stack.agent_urls["checker"] + "/health", timeout=10.0).json()
        assert health["agent"] == names["checker"]

        # another server answering /health on the Planner's port, as someone else: not the Planner
        stack.kill_agent("planner")
        with foreign_health_server(stack.ports["planner"], agent="someone-else"):
            stack.ready_timeout_s = 10.0
            with pytest.raises(StackError, match=r"agent planner ") as err:
                stack.restart_agent("planner")
        assert "'someone-else'" in str(err.value) and repr(names["planner"]) in str(err.value)
