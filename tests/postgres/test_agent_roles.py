"""The agents' database roles, made by deploy/base/postgres-init.sql (the script the postgres image runs on
a fresh volume, Kubernetes and compose alike), on a throwaway PostgreSQL cluster: each agent's role owns
its own store and nothing else, and the script refuses to run without a password for each.

The cluster trusts 127.0.0.1 (no passwords checked): what is tested is what each role may reach.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from scanflow.deploy_secrets import STORE_AGENTS, env_name, store_password_key

pytestmark = pytest.mark.integration
INIT = Path(__file__).resolve().parents[2] / "deploy" / "base" / "postgres-init.sql"


def run_init(server: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """psql -f the init script as the superuser on the `mlflow` database, as the image's entrypoint does."""
    from tests.postgres.conftest import _bindir

    url = sa.engine.make_url(server)
    bindir = _bindir()
    assert bindir is not None
    return subprocess.run([str(bindir / "psql"), "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "-h", str(url.host),
                           "-p", str(url.port), "-U", str(url.username), "-d", "mlflow", "-f", str(INIT)],
                          env={k: v for k, v in os.environ.items() if not k.endswith("_STORE_PASSWORD")} | env,
                          capture_output=True, text=True, timeout=120, check=False)


def roles(server: str) -> dict[str, tuple[bool, bool, bool]]:
    engine = sa.create_engine(f"{server}/postgres")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT rolname, rolsuper, rolcreatedb, rolcreaterole FROM pg_roles "
                                    "WHERE rolname LIKE 'agent\\_%'")).all()
    engine.dispose()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_each_agent_role_reaches_its_own_store_only(pg_server: str) -> None:
    from scanflow.agent import Store

    admin = sa.create_engine(f"{pg_server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE DATABASE mlflow"))
    admin.dispose()
    passwords = {env_name(store_password_key(a)): f"pw-{a}" for a in STORE_AGENTS}

    # a password missing: the script stops at once and makes nothing (no role without a password)
    missing = run_init(pg_server, {k: v for k, v in passwords.items() if not k.startswith("TRACKER")})
    assert missing.returncode != 0, missing.stdout
    assert roles(pg_server) == {}

    done = run_init(pg_server, passwords)
    assert done.returncode == 0, done.stderr
    assert roles(pg_server) == {f"agent_{a}": (False, False, False) for a in STORE_AGENTS}

    base = sa.engine.make_url(pg_server)
    for agent in STORE_AGENTS:
        as_agent = base.set(username=f"agent_{agent}")
        # its own store: the agent's Store creates its schema and writes
        store = Store(as_agent.set(database=f"agents_{agent}").render_as_string(hide_password=False))
        try:
            store.put("probe", {"agent": agent})
            assert store.get("probe") == {"agent": agent}
        finally:
            store.close()
        # MLflow's database and every other agent's: refused at connect
        for other in ["mlflow", *(f"agents_{o}" for o in STORE_AGENTS if o != agent)]:
            engine = sa.create_engine(as_agent.set(database=other))
            with pytest.raises(sa.exc.OperationalError, match="permission denied for database"):
                engine.connect().close()
            engine.dispose()
