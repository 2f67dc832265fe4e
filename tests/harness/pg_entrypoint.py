"""The `postgres` image's entrypoint, played with Debian's PostgreSQL binaries (the emulated cluster's
kubelet runs this for a container whose image is postgres:*): on an empty PGDATA, initdb with
POSTGRES_USER/POSTGRES_PASSWORD, create POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sql; then run
the server on all addresses with password authentication, as the image does."""

from __future__ import annotations

import glob
import os
import pwd
import subprocess
import sys


def bindir() -> str:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not dirs:
        sys.exit("PostgreSQL server binaries not installed")
    return dirs[-1]


def main() -> None:
    b = bindir()
    data = os.environ.get("PGDATA", "/var/lib/postgresql/data")
    user = os.environ.get("POSTGRES_USER", "postgres")
    db = os.environ.get("POSTGRES_DB", user)
    password = os.environ["POSTGRES_PASSWORD"]
    pg = pwd.getpwnam("postgres")
    for d in (data, "/var/run/postgresql"):
        os.makedirs(d, exist_ok=True)
        os.chown(d, pg.pw_uid, pg.pw_gid)
        os.chmod(d, 0o700 if d == data else 0o2775)
    as_pg = ["runuser", "-u", "postgres", "--"]
    if not os.path.exists(os.path.join(data, "PG_VERSION")):
        pwfile = "/tmp/.pgpw"
        with open(pwfile, "w") as f:
            f.write(password)
        os.chown(pwfile, pg.pw_uid, pg.pw_gid)
        subprocess.run([*as_pg, f"{b}/initdb", "-D", data, "-U", user, f"--pwfile={pwfile}", "-E", "UTF8",
                        "--auth-local=trust", "--auth-host=scram-sha-256"], check=True)
        os.unlink(pwfile)
        with open(os.path.join(data, "pg_hba.conf"), "a") as f:
            f.write("host all all all scram-sha-256\n")
        sock = "/var/run/postgresql"
        subprocess.run([*as_pg, f"{b}/pg_ctl", "-D", data, "-w", "-o", f"-c listen_addresses='' -k {sock}",
                        "start"], check=True)
        psql = [*as_pg, f"{b}/psql", "-v", "ON_ERROR_STOP=1", "-h", sock, "-U", user]
        if db != "postgres":
            subprocess.run([*psql, "-d", "postgres", "-c", f'CREATE DATABASE "{db}"'], check=True)
        for script in sorted(glob.glob("/docker-entrypoint-initdb.d/*.sql")):
            subprocess.run([*psql, "-d", db, "-f", script], check=True)
        subprocess.run([*as_pg, f"{b}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"], check=True)
    os.execvp("runuser", [*as_pg, f"{b}/postgres", "-D", data, "-c", "listen_addresses=*",
                          "-k", "/var/run/postgresql", "-c", "fsync=off"])


if __name__ == "__main__":
    main()
