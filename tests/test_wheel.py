"""The wheel a team installs: what it holds, and that Scanflow works from it outside this checkout.

Built from a copy of the sources (pip's in-tree build writes build/ beside them) without network or build
isolation (the setuptools of this environment), installed with --target into a folder of its own, and
run from a directory with no checkout in sight: the standard agents come from the installed package,
and nothing is installed under a generic top-level name such as `agents`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("scanflow", "workflows"):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(src)], check=True, cwd=src)
    (found,) = out.glob("scanflow-*.whl")
    return found


def test_the_wheel_installs_no_generic_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"scanflow", "workflows"}, top  # the examples still ship as `workflows` (#27 item 1)
    for needed in ("scanflow/standard/planner.py", "scanflow/standard/executor.py", "scanflow/py.typed",
                   "scanflow/scaffold/templates/workflow.py.tmpl"):
        assert needed in names


def test_init_and_validate_run_from_the_installed_wheel_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target),
                    str(wheel)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("SCANFLOW_WORKFLOW", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], check=False, cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)

    found = run("-c", "import importlib.util as u; print(u.find_spec('scanflow.standard.planner').origin)")
    assert found.returncode == 0 and found.stdout.strip().startswith(str(target)), found
    assert run("-c", "import agents").returncode != 0  # no top-level `agents` comes with Scanflow
    made = run("-m", "scanflow.cli", "init", "mymodel")
    assert made.returncode == 0, made.stderr
    checked = run("-m", "scanflow.cli", "validate", "mymodel/workflow.py")
    assert checked.returncode == 0 and checked.stdout.startswith("ok:"), (checked.stdout, checked.stderr)
