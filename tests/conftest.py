"""Shared fixtures. Each area keeps its own fixtures in tests/<area>/conftest.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from scanflow.platform.processes import free_port

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in test output


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def serve_app() -> Iterator[Callable[[Any], str]]:
    """`url = serve_app(app)` (or `serve_app(app, host, port)`): the ASGI app served by a real uvicorn on a
    loopback address, in a thread of this process (so a test can also look at the objects behind it).
    Every server is stopped after."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any, host: str = "127.0.0.1", port: int | None = None) -> str:
        port = port or free_port()
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="error"))
        thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:  # uvicorn sets it once the socket listens
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return f"http://{host}:{port}"

    try:
        yield start
    finally:
        for server, thread in running:
            server.should_exit = True
        for server, thread in running:
            thread.join(timeout=10)


# --- parallel runs (opt-in: `make test PYTEST_ARGS="-n 2 --dist loadgroup"` with pytest-xdist) ------

# Tests that run a whole embedded stack (MLflow, bootstrap training, four agents, replicas): two of them
# at once on 2 cores would fight over the CPU their deadlines assume. They form one work unit that a
# single worker runs one after another, while the other worker takes the rest of the suite.
STACK_GROUP = "embedded-stack"
STACK_TESTS = ("tests/e2e/", "tests/demo/test_demo_cli.py", "tests/notebooks/test_notebooks.py::test_0",
               "tests/embedded/test_stack_ports.py::test_whole_stack", "tests/harness/test_emulated_")


# Whole-stack scenario tests (each starts MLflow, trains a bootstrap model, runs four agents and replica
# processes; minutes each on 2 cores). `make test` leaves them out so the suite stays under ~10 minutes;
# `make test-e2e` runs them, and CI runs both (.ci/run). Marked by path so a new scenario test under
# tests/e2e/ cannot be forgotten. Also here: the longer half of the OpenAPI fuzz (three more agents).
E2E_TESTS = ("tests/e2e/", "tests/demo/test_demo_cli.py", "tests/notebooks/test_notebooks.py::test_0",
             "tests/embedded/test_stack_ports.py::test_whole_stack", "tests/harness/test_emulated_",
             "tests/contracts/test_schemathesis.py::test_other_reference_agents")


def is_e2e(nodeid: str) -> bool:
    """Whether a test belongs to the whole-stack `e2e` set, by node id (pure)."""
    return nodeid.startswith(E2E_TESTS)


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` deselection reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the whole-stack tests `e2e` (see E2E_TESTS) before `-m` selects."""
    for item in items:
        if is_e2e(item.nodeid):
            item.add_marker(pytest.mark.e2e)


def stack_group_of(nodeid: str) -> str | None:
    """The work unit of a test that must not overlap another one like it, by node id (pure)."""
    return STACK_GROUP if nodeid.startswith(STACK_TESTS) else None


@pytest.hookimpl(optionalhook=True)  # an xdist hook: ignored where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` with the whole-stack tests as one group, by node id.

    Why not `@pytest.mark.xdist_group`: xdist 3.8 groups by rewriting `item._nodeid`, which pytest 9
    no longer reads (nodeids come from `item._id`), so its marks are silently ignored and two stacks
    ran at once. The scope rule is applied here, on the controller, instead. LoadScope's reordering
    (on by default) queues the largest unit first, so the longest serial chain starts at once.
    """
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class StackGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return stack_group_of(nodeid) or nodeid

    return StackGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _restore_mlflow_tracking_uri():  # type: ignore[no-untyped-def]
    """Undo a test's `mlflow.set_tracking_uri(...)` (process-wide, and it also sets the env var).

    Without this a test that points MLflow at its own short-lived server (an e2e stack, a SQLite store)
    leaves every later test of the session talking to a dead URL, retrying for minutes.
    """
    import os
    import sys

    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(before)  # type: ignore[arg-type]  # None resets to the default
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


# --- tracking (knowledge base): one real MLflow server for the whole session ------------------


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """URL of a real `mlflow server` on loopback (SQLite + proxied artifacts), shared by all tests.

    Sets MLFLOW_TRACKING_URI for the session (restored afterwards) so MLflow clients in this process and
    in child processes find it. Tests isolate themselves by unique experiment / model names.
    """
    import os

    import mlflow as mlflow_tracking

    from scanflow.tracking.server import MlflowServer

    home = tmp_path_factory.mktemp("mlflow")
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    with MlflowServer(home, startup_timeout_s=180) as server:  # 2 shared cores can be very busy
        mlflow_tracking.set_tracking_uri(server.url)  # also sets MLFLOW_TRACKING_URI for children
        try:
            yield server.url
        finally:
            mlflow_tracking.set_tracking_uri(previous)  # type: ignore[arg-type]  # None unsets
            if previous is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous


# --- one digits MLP for the whole session: the model the serving / platform / tracking tests share ----

DIGITS_MLP_NAME = "serving-digits"  # tests/serving asserts "models:/serving-digits/1" in replica metrics


@pytest.fixture(scope="session")
def digits():  # type: ignore[no-untyped-def]
    """sklearn's bundled digits as (x float32 scaled to [0, 1], y int64): what every test model eats."""
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def make_digits_mlp(seed: int = 0):  # type: ignore[no-untyped-def]
    """The test suite's one model shape: 64 -> 32 -> ReLU -> 10, weights seeded."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


@pytest.fixture(name="make_mlp", scope="session")
def make_mlp_fixture():  # type: ignore[no-untyped-def]
    """The factory `make_mlp(seed)`, for tests that need their own (distinct) models."""
    return make_digits_mlp


@pytest.fixture(scope="session")
def digits_mlp(mlflow_server: str, digits) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """A digits MLP registered twice in the session's MLflow server, trained once per version.

    {"name": DIGITS_MLP_NAME, "v1": "models:/<name>/1", "v2": "models:/<name>/2", "tracking": url}.
    v1 (30 epochs) and v2 (another seed, 5 epochs) give different outputs, so a hot swap or a failover
    shows in the answers, not only in the version number. Logged in pickle format (faster to load, docs/tracking.md) with
    pinned pip requirements (skips MLflow's slow requirement inference). Tests may serve, load and
    alias-read these versions but must not register more versions under this name (the numbers are
    part of what tests assert): register your own unique name for that.
    """
    import mlflow
    import mlflow.pytorch
    import torch

    x, y = digits
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    mlflow.set_experiment("shared-test-models")
    uris: dict[str, str] = {"name": DIGITS_MLP_NAME, "tracking": mlflow_server}
    for key, seed, epochs in (("v1", 0, 30), ("v2", 1, 5)):
        model = make_digits_mlp(seed)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(epochs):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt), yt).backward()
            opt.step()
        with mlflow.start_run(run_name=f"digits-mlp-{key}"):
            info = mlflow.pytorch.log_model(
                model, name="model", serialization_format="pickle", input_example=x[:2],
                registered_model_name=DIGITS_MLP_NAME, pip_requirements=["torch==2.13.0"],
            )
        uris[key] = f"models:/{DIGITS_MLP_NAME}/{info.registered_model_version}"
    return uris
