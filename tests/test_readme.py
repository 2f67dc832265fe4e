"""The README's SDK example is real code: it imports, registers, and its agent passes its own checks."""

from __future__ import annotations

import re
from pathlib import Path

from scanflow.spec import load_python_file

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_example_registers_a_valid_agent(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "README has no python example"
    example = tmp_path / "readme_example.py"
    example.write_text(blocks[0])
    assert len(blocks[0].strip().splitlines()) <= 25
    module = load_python_file(example)  # __name__ != "__main__": nothing is served
    agent = module.checker
    agent.check()
    assert set(agent.actuators) == {"check_drift", "notify_planner"}
    assert "drift-to-planner" in agent.strategies
