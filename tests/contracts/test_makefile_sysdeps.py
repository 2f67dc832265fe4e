"""`make sysdeps` run for real against stand-in `apt-get` and `id` programs on an otherwise empty PATH:
a failed install is retried once after `apt-get update` (a fresh container has no package lists), and
each tool it cannot provide leaves a note naming the tests that will skip."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# installs fail until `apt-get update` ran once, as on a fresh Debian image
APT_GET = """#!/bin/sh
echo "$*" >> "$APT_LOG"
case "$1" in
  update) : > "$APT_UPDATED" ;;
  install) [ -e "$APT_UPDATED" ] || exit 100 ;;
esac
"""


def _tool(bindir: Path, name: str, text: str) -> None:
    path = bindir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _sysdeps(tmp_path: Path, tools: dict[str, str]) -> tuple[str, list[str]]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in tools.items():
        _tool(bindir, name, text)
    env = {"PATH": str(bindir), "APT_LOG": str(tmp_path / "apt.log"), "APT_UPDATED": str(tmp_path / "updated"),
           "HOME": str(tmp_path)}
    # PG_BINDIRS: this machine's own PostgreSQL must not count as installed
    out = subprocess.run([make, "-s", "-C", str(ROOT), "sysdeps", f"PG_BINDIRS={tmp_path}/none"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    log = tmp_path / "apt.log"
    return out.stdout + out.stderr, log.read_text().splitlines() if log.exists() else []


def test_postgresql_install_is_retried_after_apt_get_update(tmp_path: Path) -> None:
    output, apt = _sysdeps(tmp_path, {"apt-get": APT_GET, "id": "#!/bin/sh\necho 0\n",
                                      "docker-compose": "#!/bin/sh\n"})
    assert apt == ["install -y -qq postgresql", "update -qq", "install -y -qq postgresql"]
    assert "note: postgresql" not in output and "note: docker-compose" not in output
    assert "note: kubectl not installed" in output


def test_every_missing_tool_leaves_a_note(tmp_path: Path) -> None:
    output, apt = _sysdeps(tmp_path, {"id": "#!/bin/sh\necho 1000\n"})  # no apt-get, not root
    assert apt == []
    for tool in ("docker-compose", "postgresql", "kubectl"):
        assert f"note: {tool} not installed" in output, output
