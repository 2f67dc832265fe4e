"""What the core install leaves to extras fails with the extra's name, not a bare ModuleNotFoundError.

Each case runs in a fresh interpreter where the optional package cannot be imported (sys.modules holds
None for it, as Python's import system then refuses it), the way an install without the extra behaves.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("hidden", "module", "extra"), [
    ("kubernetes", "scanflow.platform.kubernetes", "k8s"),
    ("kubernetes", "scanflow.platform.k8s_api", "k8s"),
    ("matplotlib", "scanflow.plots", "demo"),
])
def test_a_missing_extra_is_named(hidden: str, module: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{hidden!r}] = None\n"
            "try:\n"
            f"    import {module}\n"
            "except ModuleNotFoundError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"pip install 'scanflow[{extra}]'" in done.stdout and repr(hidden) in done.stdout, done.stdout


def test_the_core_install_needs_neither() -> None:
    """The embedded default (agents, serving, the stack) imports without kubernetes or matplotlib."""
    code = ("import sys; sys.modules['kubernetes'] = None; sys.modules['matplotlib'] = None\n"
            "import scanflow.cli, scanflow.standard.executor, scanflow.standard.checker, scanflow.embedded.stack\n"
            "import scanflow.serving.replica_server, scanflow.serving.gateway_server, scanflow.platform.local\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
