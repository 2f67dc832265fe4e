"""schemathesis over the OpenAPI of the four reference agents (the apps built from scanflow/standard/*.py), a
replica and a gateway (behind its fast front, as served by default), in both generation modes (positive: valid data; negative: data the schema
forbids): no generated request may get a 5xx (issue #15). Every other check of `--checks all`
(undocumented status, response schema, content type, negative data accepted, ...) runs too; a finding
that is not in docs/security.md's table of by-design findings fails the test (fix it, or document why).

Real servers (uvicorn in threads, real HTTP on loopback); the replica serves a stand-in model, so no
MLflow is needed. Requests carry the admin token, so the mutating routes are exercised past auth.
Runtime (2 busy cores): ~45 s for the Tracker, replica and gateway; the other three agents (~25 s) are
e2e by path in tests/conftest.py. Skipped where schemathesis is not installed (dev extra).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (dev extra: schemathesis==4.32.5)")
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())  # `--checks all`

pytestmark = pytest.mark.integration
TOKEN = "schemathesis-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFORMANCE: dict[str, set[tuple[str, str, str]]] = {}  # server -> (method, path, finding)
# A drained replica answers 503 to everything until undrained, by design (and so would a gateway whose
# replicas were drained, or were re-pointed at junk URLs by PUT /admin/replicas): fuzzed with invalid data
# only, which must be refused (4xx) without changing anything (the server stays ready afterwards).
NOT_FUZZED = frozenset({"/admin/drain", "/admin/replicas", "/admin/route", "/admin/backup", "/admin/challenger"})
FAST_ANSWERS: list[int] = []  # one entry per answer the gateway's fast front gave (POST /predict)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(app: Any, http: Any = "auto") -> Iterator[str]:
    """Serve `app` with uvicorn in a thread on a free loopback port (with `http`, the protocol class a
    production server runs); yields its base URL."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           http=http))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
    logits = np.stack([x.sum(axis=1), -x.sum(axis=1)], axis=1)
    return [int(v) for v in logits.argmax(axis=1)], logits


ROLES = ("tracker", "checker", "planner", "executor")
ROOT = Path(__file__).resolve().parents[2]
AGENTS_DIR = ROOT / "scanflow" / "standard"
DIGITS_YAML = ROOT / "workflows" / "digits" / "workflow.yaml"
SECURITY_MD = ROOT / "docs/security.md"


@pytest.fixture(scope="module")
def agent_urls(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The reference agents, each loaded from scanflow/standard/<role>.py and bound to the digits workflow as
    `scanflow agent run` does, and served by its own uvicorn. What needs the
    rest of a stack is left out, never an HTTP route: the sensors (they poll MLflow and the services), the
    Checker's and Planner's startup (monitoring runs in MLflow) and the Executor's (it deploys the
    workflow's services; it gets an empty local platform instead). The Tracker keeps its startup and
    shutdown (its prediction and feedback logs, SQLite in its home)."""
    from contextlib import ExitStack

    from scanflow.agent import Store, create_app
    from scanflow.platform.local import LocalPlatform
    from scanflow.settings import Settings
    from scanflow.spec import load_python_file, load_workflow

    home = tmp_path_factory.mktemp("agents")
    monkeypatch_module.setenv("SCANFLOW_TOKEN", TOKEN)
    monkeypatch_module.delenv("SCANFLOW_AUTH_TOKENS", raising=False)
    monkeypatch_module.setenv("SCANFLOW_HOME", str(home))
    with ExitStack() as stack:
        urls: dict[str, str] = {}
        for role in ROLES:
            module = load_python_file(AGENTS_DIR / f"{role}.py")
            agent = module.agent.bound(load_workflow(DIGITS_YAML))
            agent.sensors.clear()
            if role != "tracker":
                agent.startup_hooks.clear()
                agent.shutdown_hooks.clear()
            if role == "executor":
                plat = LocalPlatform(home / "platform", "http://127.0.0.1:9", token=TOKEN)
                stack.callback(plat.close)
                agent.on_startup(lambda ctx, plat=plat: ctx.resources.update(platform=plat))
            own = home / role
            own.mkdir()
            store = Store(f"sqlite:///{own / 'agent.db'}")
            stack.callback(store.close)
            app = create_app(agent, Settings(token=TOKEN, home=own), store=store)
            urls[role] = stack.enter_context(contextmanager(_serve)(app))
        yield urls


def _replica(mp: pytest.MonkeyPatch) -> Iterator[str]:
    from pydantic import SecretStr

    from scanflow.serving import replica_server as replica_mod
    from scanflow.serving.model import LoadedModel

    mp.setattr(replica_mod, "load_model", lambda uri: LoadedModel("m", uri, "1", 4, _predict))
    app = replica_mod.create_app(replica_mod.ReplicaConfig(model_uri="models:/m/1", token=SecretStr(TOKEN)))
    yield from _serve(app)


@pytest.fixture(scope="module")
def replica_url(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _replica(monkeypatch_module)


@pytest.fixture(scope="module")
def gateway_url(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    """A gateway in front of a replica of its own (the replica fuzz swaps and re-threads its replica), behind
    the fast front, as `scanflow serve gateway` runs it by default: POST /predict is answered from the HTTP
    protocol without the ASGI cycle (scanflow/serving/fastfront.py), so that path is fuzzed too."""
    from pydantic import SecretStr

    from scanflow.httpdeadline import with_head_timeout
    from scanflow.serving.fastfront import protocol_for
    from scanflow.serving.gateway_server import GatewayConfig, create_app

    for upstream in _replica(monkeypatch_module):
        # /ready checks get 5 s: the replica runs in this process and the fuzz can hold it for over the default
        # 0.5 s on a busy machine; a gateway that then calls it unhealthy answers 503, by design, not a fault
        app = create_app(GatewayConfig(service="m", replicas=(upstream,), token=SecretStr(TOKEN), health_interval_s=5.0))
        front = with_head_timeout(protocol_for(app.gateway), 10.0)

        class Counted(front):  # type: ignore[misc,valid-type]
            """The production protocol, counting the answers its fast path gives (the test checks the fuzz
            reached it)."""

            def _answer(self, *args: Any, **kwargs: Any) -> None:
                FAST_ANSWERS.append(1)
                super()._answer(*args, **kwargs)

        yield from _serve(app, http=Counted)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _check(case: Any, where: str) -> None:
    response = case.call(headers=AUTH, timeout=30)
    assert response.status_code < 500, f"{where}: {case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    try:
        case.validate_response(response, checks=ALL_CHECKS, headers=AUTH)
    except BaseExceptionGroup as exc:  # conformance (not a server error): collected, judged by _fuzz
        for e in exc.exceptions:
            CONFORMANCE.setdefault(where, set()).add((case.method, case.operation.path, type(e).__name__))
    except AssertionError as exc:  # a single failed check
        CONFORMANCE.setdefault(where, set()).add((case.method, case.operation.path, type(exc).__name__))


@schemathesis.serializer("application/x-scanflow-batch")
def _batch_bytes(ctx: Any, value: Any) -> bytes:
    """POST /predict_batch's frames as generated (arbitrary bytes: the replica must refuse bad frames)."""
    return value if isinstance(value, bytes) else str(value).encode()


# examples per operation: schema-valid data reaches deeper (past parsing) than invalid data, which every
# route refuses early, so the negative mode gets fewer (the runtime stays near a minute on 2 busy cores).
# Derandomized: the same examples for the same schemas on every run, so CI cannot fail on a draw no change
# caused; SCANFLOW_FUZZ_EXPLORE=1 draws fresh examples (and more of them) to look for new findings.
EXPLORE = os.environ.get("SCANFLOW_FUZZ_EXPLORE") == "1"
FUZZ = {mode: settings(max_examples=n * (10 if EXPLORE else 1), deadline=None, database=None,
                       suppress_health_check=list(HealthCheck), derandomize=not EXPLORE)
        for mode, n in ((GenerationMode.POSITIVE, 30), (GenerationMode.NEGATIVE, 15))}


def _fuzz(url: str, where: str) -> int:
    """Every operation of the server's OpenAPI, FUZZ[mode] examples each in both generation modes (positive:
    valid data; negative: data the schema forbids); the number of operations fuzzed."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        modes = (GenerationMode.NEGATIVE,) if op.path in NOT_FUZZED else (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for mode in modes:

            @given(case=op.as_strategy(generation_mode=mode))
            @FUZZ[mode]
            def run(case: Any) -> None:
                _check(case, where)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body): the positive run covers it
                assert mode is GenerationMode.NEGATIVE, f"{where}: {op.method.upper()} {op.path}"
        ops += 1
    if where in ("replica", "gateway"):  # no invalid admin request drained or re-pointed anything
        import httpx

        ready = httpx.get(url + "/ready", timeout=30)
        assert ready.status_code == 200, f"{where} not ready after the fuzz: {ready.status_code} {ready.text[:200]}"
    found = {(where, m, p, kind) for m, p, kind in CONFORMANCE.get(where, set())}
    undocumented = found - documented_findings(SECURITY_MD.read_text())
    assert not undocumented, f"conformance findings not in docs/security.md's table (fix, or document): {sorted(undocumented)}"
    return ops


@pytest.mark.parametrize("role", ["tracker"])
def test_reference_agent_openapi_no_5xx(agent_urls: dict[str, str], role: str) -> None:
    """The Tracker: the agent API every agent serves, plus its record and feedback routes."""
    assert _fuzz(agent_urls[role], role) >= 10


@pytest.mark.parametrize("role", ["checker", "planner", "executor"])
def test_other_reference_agents_openapi_no_5xx(agent_urls: dict[str, str], role: str) -> None:
    """The other agents: the same agent API with their own actuators, strategies and routes
    (e2e by path in tests/conftest.py: ~25 s more)."""
    assert _fuzz(agent_urls[role], role) >= 10


def test_replica_openapi_no_5xx(replica_url: str) -> None:
    assert _fuzz(replica_url, "replica") >= 5


def test_gateway_openapi_no_5xx(gateway_url: str) -> None:
    assert _fuzz(gateway_url, "gateway") >= 5
    assert FAST_ANSWERS, "no fuzzed request took the fast front's POST /predict path"


def documented_findings(text: str) -> set[tuple[str, str, str, str]]:
    """Pure: (server, method, path, finding) of each row of the table under "What schemathesis still
    reports" in docs/security.md; a server cell `agents` stands for every reference agent."""
    section = text.split("### What schemathesis still reports", 1)[1].split("\n## ", 1)[0]
    out: set[tuple[str, str, str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or cells[0] in ("server", "") or set(cells[0]) <= {"-", " "}:
            continue
        servers = ROLES if cells[0] == "agents" else (cells[0],)
        method, _, path = cells[1].partition(" ")
        for server in servers:
            for finding in cells[2].split(","):
                out.add((server, method, path, finding.strip().strip("`")))
    return out


def test_the_documented_findings_table_parses() -> None:
    text = "### What schemathesis still reports\n\n| server | operation | finding | why |\n| --- | --- | --- | --- |\n" \
           "| agents | `POST /strategies` | `RejectedPositiveData` | a constraint |\n" \
           "| replica | `POST /predict` | `RejectedPositiveData`, `AcceptedNegativeData` | width |\n\n## Next\n| x | y | z | w |\n"
    found = documented_findings(text)
    assert ("planner", "POST", "/strategies", "RejectedPositiveData") in found
    assert ("replica", "POST", "/predict", "AcceptedNegativeData") in found and len(found) == 6
    assert ("tracker", "POST", "/predictions", "RejectedPositiveData") in documented_findings(SECURITY_MD.read_text())


def test_zz_conformance_report(capsys: pytest.CaptureFixture[str]) -> None:
    """Not a gate (each fuzz test judges its own server): what `--checks all` found besides server errors."""
    with capsys.disabled():
        for where, rows in sorted(CONFORMANCE.items()):
            print(f"\nconformance {where}: {len(rows)} documented findings")
            for row in sorted(rows):
                print("  ", *row)
