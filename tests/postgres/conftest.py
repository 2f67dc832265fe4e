"""A throwaway PostgreSQL cluster in a temporary directory (Debian's postgresql package), for the tests
of the agents' durable store on the database the prod overlay and docker-compose.yml use.

Skips with a reason when the server binaries or the psycopg2 driver (the `postgres` extra) are absent.
As root, the server runs as the `postgres` user (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scanflow.platform.processes import free_port


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs else None


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """A running cluster (trust auth on 127.0.0.1, superuser `scanflow`); yields its base URL."""
    pytest.importorskip("psycopg2", reason="psycopg2 not installed: pip install '.[postgres]'")
    bindir = _bindir()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("PostgreSQL server binaries not installed (Debian: apt-get install postgresql)")
    # directly under the temp dir: the server's user must reach it (pytest's root-owned tree is 0700)
    root = Path(tempfile.mkdtemp(prefix="scanflow-pg-"))
    runas: list[str] = []
    if os.geteuid() == 0:
        uid = _uid("postgres")
        if shutil.which("runuser") is None or uid is None:
            pytest.skip("running as root without runuser or a postgres user: initdb refuses root")
        os.chown(root, uid, -1)
        runas = ["runuser", "-u", "postgres", "--"]
    data = root / "data"
    init = subprocess.run([*runas, str(bindir / "initdb"), "-D", str(data), "-U", "scanflow", "--auth=trust",
                           "-E", "UTF8"], capture_output=True, timeout=120, check=False)
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace')[-2000:]}")
    port = free_port()
    start = subprocess.run(
        [*runas, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "120",
         "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
        capture_output=True, timeout=180, check=False)
    if start.returncode != 0:
        log = (root / "server.log").read_text(errors="replace") if (root / "server.log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {start.stderr.decode()}\n{log[-2000:]}")
    try:
        yield f"postgresql+psycopg2://scanflow@127.0.0.1:{port}"
    finally:
        subprocess.run([*runas, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _uid(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


@pytest.fixture
def pg_database(pg_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh database per test (as the postgres init script gives each agent its own)."""
    import sqlalchemy as sa

    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
    engine = sa.create_engine(f"{pg_server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return f"{pg_server}/{name}"
