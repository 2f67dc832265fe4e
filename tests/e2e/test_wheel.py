"""The wheel a team installs: what it holds, and that Scanflow works from it outside this checkout.

Built from a copy of the sources (pip's in-tree build writes build/ beside them) without network or build
isolation (the setuptools of this environment), installed with --target into a folder of its own, and
run from a directory with no checkout in sight: the standard agents come from the installed package,
and nothing is installed under a generic top-level name such as `agents` or `workflows` (the examples
install as `scanflow.examples`). In the e2e set: building the wheel takes a while, and the last test
starts a whole stack from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from e2e_support import wait_for
from up_support import READY_S

ROOT = Path(__file__).resolve().parents[2]
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
    assert top == {"scanflow"}, top
    for needed in ("scanflow/standard/planner.py", "scanflow/standard/executor.py", "scanflow/py.typed",
                   "scanflow/scaffold/templates/workflow.py.tmpl", "scanflow/examples/digits/train.py",
                   "scanflow/examples/sensors/workflow.yaml"):
        assert needed in names


def test_every_source_module_is_in_the_wheel_under_its_installed_name(wheel: Path) -> None:
    """pyproject.toml lists the packages (find cannot map workflows/ to scanflow.examples): a package
    folder added without its line there would be missing from the wheel, and this fails."""
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = [(p, p.relative_to(ROOT).as_posix()) for p in (ROOT / "scanflow").rglob("*.py")]
    sources += [(p, "scanflow/examples/" + p.relative_to(ROOT / "workflows").as_posix())
                for p in (ROOT / "workflows").rglob("*.py")]
    missing = [installed for path, installed in sources if "__pycache__" not in path.parts and installed not in names]
    assert len(sources) > 100 and not missing, missing


class Installed:
    """The wheel installed with --target into a folder of its own, and a working directory beside it with
    no checkout in sight; `run` runs this interpreter there with only the wheel's code importable first."""

    def __init__(self, wheel: Path, root: Path) -> None:
        self.target, self.work = root / "site", root / "work"
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                        str(self.target), str(wheel)], check=True)
        self.work.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SCANFLOW_", "MLFLOW_"))}
        self.env["PYTHONPATH"] = str(self.target)
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)  # the stack's imports leave .pyc files: proof of origin

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], check=False, cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def test_init_and_validate_run_from_the_installed_wheel_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = Installed(wheel, tmp_path)
    found = site.run("-c", "import importlib.util as u; print(u.find_spec('scanflow.standard.planner').origin)")
    assert found.returncode == 0 and found.stdout.strip().startswith(str(site.target)), found
    for generic in ("agents", "workflows"):  # nothing under a generic top-level name comes with Scanflow
        assert site.run("-c", f"import {generic}").returncode != 0, generic
    example = site.run("-c", "import scanflow.examples.digits.train as t; print(t.__file__)")
    assert example.returncode == 0 and example.stdout.strip().startswith(str(site.target)), example
    made = site.run("-m", "scanflow.cli", "init", "mymodel")
    assert made.returncode == 0, made.stderr
    checked = site.run("-m", "scanflow.cli", "validate", "mymodel/workflow.py")
    assert checked.returncode == 0 and checked.stdout.startswith("ok:"), (checked.stdout, checked.stderr)


def test_up_quick_serves_from_the_installed_wheel_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """`scanflow init`, `up --quick`, traffic, `down`, all from the wheel: the stack's processes (agents,
    replicas, the bootstrap job) import the installed package, never this checkout."""
    site = Installed(wheel, tmp_path)
    assert site.run("-m", "scanflow.cli", "init", "mymodel").returncode == 0
    assert site.run("-m", "mymodel.data", "rows.npz").returncode == 0
    for cache in site.target.rglob("__pycache__"):  # what validate-like imports left: only the stack's count
        shutil.rmtree(cache)
    home = site.work / ".scanflow" / "mymodel"
    with open(tmp_path / "up.out", "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "scanflow.cli", "up", "mymodel/workflow.py", "--quick"],
                              cwd=site.work, env=site.env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    try:
        def running() -> bool:
            if up.poll() is not None:
                pytest.fail(f"`scanflow up` exited {up.returncode}:\n{(tmp_path / 'up.out').read_text()[-3000:]}")
            state = home / "stack.json"
            return state.exists() and json.loads(state.read_text()).get("state") == "running"

        wait_for(running, READY_S, 1.0, "`scanflow up --quick` from the wheel to say running")
        sent = site.run("-m", "scanflow.cli", "traffic", "rows.npz", "--seconds", "5", "--rate", "20")
        assert sent.returncode == 0, (sent.stdout[-2000:], sent.stderr[-2000:])
        summary = json.loads(sent.stdout.strip().splitlines()[-1])
        assert summary["failed"] == 0 and summary["answered"] > 0, summary
        for module in ("standard/executor", "standard/tracker", "serving/replica", "embedded/bootstrap"):
            folder, name = module.rsplit("/", 1)
            assert list((site.target / "scanflow" / folder / "__pycache__").glob(f"{name}.*.pyc")), module
        stopped = site.run("-m", "scanflow.cli", "down")
        assert stopped.returncode == 0, stopped.stderr
        assert up.wait(timeout=120) == 0
    finally:
        if up.poll() is None:
            site.run("-m", "scanflow.cli", "down", "--home", str(home))
            up.wait(timeout=60)
