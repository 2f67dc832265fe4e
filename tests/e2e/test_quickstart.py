"""docs/quickstart.md, run as written: every command of its ```bash blocks, in order, in an empty directory.

The install block is skipped (marked in the page; this suite runs installed). `scanflow up` runs in the
background, as the page's own terminal; the next command starts once `scanflow status` says everything is
up. The page's drifted traffic ends with `--until-new-version`, which exits 1 unless a new model version
came to answer every request: the test then requires that version in the command's JSON summary, and a
promotion among the Executor's decisions.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import wait_for
from up_support import READY_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs/quickstart.md"
SKIP = "<!-- quickstart-test: skip"


def page_commands(text: str) -> list[str]:
    """Pure: the commands of the page's ```bash blocks, in order, except a block right after the skip mark."""
    commands, skip = [], False
    for block in re.finditer(r"(<!-- [^\n]*-->\n)?```bash\n(.*?)```", text, re.DOTALL):
        skip = bool(block.group(1)) and block.group(1).startswith(SKIP)
        if not skip:
            commands += [line.strip() for line in block.group(2).splitlines()
                         if line.strip() and not line.strip().startswith("#")]
    return commands


def test_page_commands_skips_only_the_marked_block() -> None:
    text = f"```bash\na\n```\n{SKIP} x -->\n```bash\nb\n```\n```bash\n# note\nc\n```\n"
    assert page_commands(text) == ["a", "c"]
    assert "scanflow up shop/workflow.py --quick" in page_commands(PAGE.read_text())


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCANFLOW_", "MLFLOW_"))}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])  # `scanflow` and `python` of this suite
    return env


def _wait_running(up: subprocess.Popen[bytes], command: str, cwd: Path) -> None:
    """Until the stack `up` runs says it is running (its stack.json); fail at once if `up` exits."""
    def running() -> bool:
        if up.poll() is not None:
            pytest.fail(f"`{command}` exited {up.returncode}:\n{(cwd / 'up.out').read_text()}")
        state = cwd / ".scanflow" / "shop" / "stack.json"
        return state.exists() and json.loads(state.read_text()).get("state") == "running"

    wait_for(running, READY_S, 1.0, f"`{command}` to say running")


def test_the_quickstart_as_written(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "scanflow").exists():
        pytest.skip(f"no `scanflow` command beside {sys.executable} (the suite runs from the project's venv)")
    env = _env(bin_dir)
    up: subprocess.Popen[bytes] | None = None
    outputs: dict[str, str] = {}
    try:
        for command in page_commands(PAGE.read_text()):
            argv = shlex.split(command)
            argv[0] = str(bin_dir / argv[0]) if argv[0] in ("scanflow", "python") else argv[0]
            if argv[1:2] == ["up"]:
                with open(tmp_path / "up.out", "wb") as out:
                    up = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
                _wait_running(up, command, tmp_path)
                continue
            seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 0.0
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=seconds + 300, check=False)
            assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            outputs[command] = done.stdout
        drifted = next(c for c in outputs if "drifted.npz" in c and "--until-new-version" in c)
        summary = json.loads(outputs[drifted].strip().splitlines()[-1])
        assert summary["failed"] == 0 and summary["new_version_after_s"] is not None, summary
        assert set(summary["versions"]) - {"1"}, summary  # a version other than the bootstrap's answered
        executor = next(c for c in outputs if c.startswith("scanflow decisions --agent executor"))
        assert "execute-retrain" in outputs[executor] and "fired" in outputs[executor], outputs[executor]
        assert up is not None and up.wait(timeout=60) == 0  # `scanflow down`, the page's last command, stopped it
    finally:
        if up is not None and up.poll() is None:
            subprocess.run([str(bin_dir / "scanflow"), "down", "--home", str(tmp_path / ".scanflow" / "shop")],
                           cwd=tmp_path, env=env, capture_output=True, timeout=120, check=False)
            up.wait(timeout=60)
