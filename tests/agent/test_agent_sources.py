"""`scanflow agent run` takes a file or a module reference (scanflow.agent.sources): in a container the
standard agents live in site-packages, where a manifest can name the module but not a path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanflow.agent.agent import AgentDefinitionError
from scanflow.agent.serve import load_agents
from scanflow.agent.sources import AgentModuleError, is_module_ref

SOURCE = '''
from scanflow.agent import Agent

first = Agent("first", role="planner")
second = Agent("second", role="executor")
not_an_agent = 3
'''


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    pkg = tmp_path / "sourcespkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pair.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield pkg
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("sourcespkg")]:
            del sys.modules[name]


@pytest.mark.parametrize(("source", "expected"), [
    ("scanflow.standard.planner:agent", True), ("pkg.mod", True), ("scanflow/standard/planner.py", False),
    ("planner.py", False), ("./x", False), ("a b:c", False), ("pkg.mod:1x", False),
])
def test_what_reads_as_a_module_reference(source: str, expected: bool) -> None:
    assert is_module_ref(source) is expected


def test_a_module_reference_loads_the_agents_of_that_module(package: Path) -> None:
    assert sorted(load_agents("sourcespkg.pair")) == ["first", "second"]
    assert sorted(load_agents("sourcespkg.pair:second")) == ["second"]
    assert sorted(load_agents(package / "pair.py")) == ["first", "second"]  # the file, as before


def test_a_wrong_reference_says_what_is_wrong(package: Path) -> None:
    with pytest.raises(AgentDefinitionError, match="'not_an_agent' is not a scanflow.agent.Agent"):
        load_agents("sourcespkg.pair:not_an_agent")
    with pytest.raises(AgentModuleError, match="cannot be found"):
        load_agents("sourcespkg.missing:agent")
    with pytest.raises(AgentDefinitionError, match="does not exist"):
        load_agents("sourcespkg/pair.py")


def test_a_workflow_naming_the_old_agents_package_is_told_the_new_name() -> None:
    with pytest.raises(AgentModuleError, match="write 'scanflow.standard.planner:agent'"):
        load_agents("agents.planner:agent")
