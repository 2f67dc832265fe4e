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


def test_readme_example_runs_as_printed_with_its_token(tmp_path: Path) -> None:
    """The example served as a process (on a free port instead of 8081) with SCANFLOW_TOKEN set as the
    README says: the printed request with the token is served, the same request without it is refused."""
    import os
    import socket
    import subprocess
    import sys

    import httpx

    from scanflow.platform.processes import is_ready, wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)[0]
    assert "port=8081" in code and "localhost:8081" in README.read_text()
    example = tmp_path / "checker.py"
    example.write_text(code.replace("port=8081", f"port={port}"))
    token = "readme-test-token"
    env = {**os.environ, "SCANFLOW_TOKEN": token, "SCANFLOW_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, str(example)], env=env, cwd=tmp_path)
    try:
        health = f"http://127.0.0.1:{port}/health"
        assert wait_until(lambda: proc.poll() is not None or is_ready(health), 120.0), "the example never answered"
        assert proc.poll() is None, "the example exited"
        url = f"http://127.0.0.1:{port}/actuators/check_drift"
        body = {"args": {"drift_rate": 0.2}}
        ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
        assert ok.status_code == 200, ok.text
        assert ok.json()["result"] == {"drift_rate": 0.2}
        assert httpx.post(url, json=body, timeout=30.0).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)
