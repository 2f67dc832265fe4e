"""Which processes a restarted Executor kills: only our serving/job modules started for its home."""

from __future__ import annotations

from scanflow.embedded.leftovers import MODULES
from scanflow.platform.processes import runs_module_with


def matches(argv: list[str], env: dict[str, str], home: str) -> bool:
    """The test `find_leftovers` applies to one process (through `find_processes`)."""
    return runs_module_with(argv, env, "SCANFLOW_HOME", home, MODULES)


def test_ours_for_this_home_only() -> None:
    replica = ["/venv/bin/python", "-m", "scanflow.serving.replica", "--port", "1234"]
    job = ["/venv/bin/python", "-m", "scanflow.platform.jobrunner", "scanflow.examples.digits.train:train"]
    env = {"PATH": "/usr/bin", "SCANFLOW_HOME": "/s/agents/executor"}
    assert matches(replica, env, "/s/agents/executor")
    assert matches(job, env, "/s/agents/executor")
    # another stack's home, a prefix of the home, or no home at all: never
    assert not matches(replica, env, "/other/agents/executor")
    assert not matches(replica, env, "/s/agents")
    assert not matches(replica, {"PATH": "/usr/bin"}, "/s/agents/executor")
    # an agent process (same home variable) is not a leftover: it is not a serving or job module
    agent = ["/venv/bin/python", "-m", "scanflow.cli", "agent", "run", "scanflow/standard/executor.py"]
    assert not matches(agent, env, "/s/agents/executor")
    # the module name must be an argument of its own, not part of another one
    assert not matches(["python", "-c", "import scanflow.serving.replica"], env, "/s/agents/executor")
