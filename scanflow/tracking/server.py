"""The embedded MLflow tracking server: Scanflow's knowledge base on one machine.

Who calls it: `scanflow mlflow up` (scanflow/tracking/cli.py), `ensure_tracking()` when no
`SCANFLOW_TRACKING_URI` is configured, the embedded stack, the demo, and the test suite's
session-scoped `mlflow_server` fixture. Agents, replicas and jobs in other processes only ever see its
URL (and their login). Every entry point for users runs it with `users` (logins); without them it
binds only a loopback address.

Why a subprocess rather than an in-process Flask app: MLflow's server owns its own event loop and
workers, and a separate process group can be stopped cleanly (SIGTERM, then SIGKILL) without leaving
orphans. Why these flags:
- SQLite backend in `home` (durable, no extra service), artifacts proxied by the server
  (`--serve-artifacts --artifacts-destination`), so a client in another process or container uploads and
  downloads over HTTP and never needs the server's filesystem.
- `MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`: ~490 MB instead of ~2.2 GB resident (measured here).
- `--allowed-hosts`: the security middleware answers 403 to a Host header it does not know; we list
  loopback, private ranges, the bind host and any extra names (compose service names, Kubernetes DNS).
- `--workers 1`: one machine, two cores; SQLite prefers one writer.
- With `users` (the embedded stack): MLflow listens only on a Unix socket in a private 0700 directory
  and an authenticating proxy (scanflow.tracking.mlflow_proxy) serves the TCP port: no call without a
  login, each login held to its role. The logins reach the proxy as digests in its environment, never
  in argv or logs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from scanflow.private_files import PRIVATE_UMASK, open_private_log, private_dir

log = logging.getLogger(__name__)

LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
PRIVATE_HOST_PATTERNS: tuple[str, ...] = (
    "10.*",
    "192.168.*",
    *(f"172.{i}.*" for i in range(16, 32)),
)


class MlflowServerError(RuntimeError):
    """The server did not come up (the message quotes the tail of its log)."""


def is_loopback(host: str) -> bool:
    """Pure: whether `host` is a loopback address or name (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _free_port(host: str) -> int:
    """Outside the ephemeral range, like every port the platform picks (see processes.free_port)."""
    from scanflow.platform.processes import free_port

    return free_port(host if host not in ("0.0.0.0", "") else "127.0.0.1")


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> list[str]:
    """Host-header patterns the server accepts: loopback, private IPs, the bind host, extra names.

    Each name is allowed bare and with any port (`name:*`), since clients send `Host: name:port`.
    Pure, so the rule is testable and the same list can be written into compose / Kubernetes manifests.
    """
    names: list[str] = list(LOOPBACK_HOSTS)
    if host not in ("0.0.0.0", "", "::"):
        names.append(host)
    else:
        names.append(socket.gethostname())
    names.extend(e.strip() for e in extra if e.strip())
    patterns: list[str] = []
    for name in names:
        for pattern in (name, f"{name}:*"):
            if pattern not in patterns:
                patterns.append(pattern)
    patterns.extend(PRIVATE_HOST_PATTERNS)
    return patterns


def _mlflow_executable() -> list[str]:
    """The `mlflow` CLI of this interpreter's environment (not whatever is first on PATH)."""
    candidate = Path(sys.executable).with_name("mlflow")
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which("mlflow")
    if found:
        return [found]
    return [sys.executable, "-m", "mlflow"]


class MlflowServer:
    """`mlflow server` as a child process with its state in `home`.

    Use as a context manager (`with MlflowServer(home) as srv: srv.url`) or call start()/stop().
    `home` holds mlflow.db (SQLite), artifacts/ and mlflow.log.
    """

    def __init__(
        self,
        home: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        extra_allowed_hosts: Sequence[str] = (),
        startup_timeout_s: float = 60.0,
        users: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """`users`: {name: (password, role)} (roles: scanflow.tracking.mlflow_proxy); with them MLflow
        sits behind the authenticating proxy on `port`. Without them MLflow answers anyone who reaches
        the port, so only a loopback `host` is accepted (ValueError otherwise)."""
        if not users and not is_loopback(host):
            raise ValueError(
                f"refusing to serve MLflow without logins on {host!r}: anyone reaching that address could "
                "delete runs and move the champion alias; bind 127.0.0.1, or pass users= (`scanflow mlflow "
                "up` and ensure_tracking generate them: scanflow.tracking.logins)"
            )
        self.home = Path(home).resolve()
        self.host = host
        # behind the proxy, the port is reserved now and handed to the proxy (scanflow.handoff): no one
        # takes it in between. MLflow alone binds it itself, so it is only picked free.
        self._listener: socket.socket | None = None
        if port is None and users:
            from scanflow.platform.processes import reserve_port

            self._listener = reserve_port(host)
            port = int(self._listener.getsockname()[1])
        self.port = port if port is not None else _free_port(host)
        self.extra_allowed_hosts = tuple(extra_allowed_hosts)
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._proxy: subprocess.Popen[bytes] | None = None
        self.users = dict(users) if users else None
        self._sock_dir: str | None = None

    @property
    def socket_path(self) -> str | None:
        """MLflow's Unix socket when it runs behind the proxy (a short path: sockets allow ~100 bytes)."""
        if self.users is None:
            return None
        if self._sock_dir is None:
            self._sock_dir = tempfile.mkdtemp(prefix="sf-mlflow-")  # mode 0700: only this user connects
        return os.path.join(self._sock_dir, "mlflow.sock")

    @property
    def url(self) -> str:
        """The URL clients use (loopback when bound to all interfaces)."""
        h = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{h}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "mlflow.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        """The exact command line (no secrets in it); exposed for docs and tests."""
        db = self.home / "mlflow.db"
        return [
            *_mlflow_executable(),
            "server",
            "--host", self.host,
            "--port", str(self.port),
            "--workers", "1",
            "--backend-store-uri", f"sqlite:///{db}",
            "--serve-artifacts",
            "--artifacts-destination", str(self.home / "artifacts"),
            "--allowed-hosts", ",".join(allowed_hosts(self.host, self.extra_allowed_hosts)),
            *(["--uvicorn-opts", f"--uds {self.socket_path}"] if self.users is not None else []),
        ]  # fmt: skip

    def proxy_command(self) -> list[str]:
        """The proxy's command line (no secrets: the logins are in its environment)."""
        return [sys.executable, "-m", "scanflow.tracking.mlflow_proxy", "--host", self.host,
                "--port", str(self.port), "--upstream-uds", str(self.socket_path)]

    def alive(self) -> bool:
        """Whether every process of this server still runs (a stack restarts it when not)."""
        procs = [self._proc] + ([self._proxy] if self.users is not None else [])
        return all(p is not None and p.poll() is None for p in procs)

    def start(self) -> str:
        """Start the server and wait until /health answers; return the URL. Idempotent."""
        if self._proc is not None and self.alive():
            return self.url
        self.stop()  # a half-dead pair (MLflow or its proxy gone): start both again
        private_dir(self.home)  # the database and the models: this user's alone
        private_dir(self.home / "artifacts")
        env = dict(os.environ)
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        env.pop("MLFLOW_TRACKING_URI", None)  # the server must not point at another server
        with open_private_log(self.log_path) as logf:
            self._proc = subprocess.Popen(
                self.command(),
                cwd=self.home,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() kills the uvicorn worker too
                umask=PRIVATE_UMASK,  # the knowledge base (database, artifacts) is its user's alone
            )
            if self.users is not None:
                from scanflow.tracking.mlflow_proxy import USERS_ENV, users_json

                penv = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
                penv[USERS_ENV] = users_json(self.users)  # type: ignore[arg-type]
                penv["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                  os.environ.get("PYTHONPATH")]))
                from scanflow.platform.processes import spawn

                self._proxy = spawn(self.proxy_command(), self.log_path, penv, listener=self._take_listener(),
                                    cwd=self.home)
        log.info("mlflow server pid %s starting at %s (log %s)", self._proc.pid, self.url, self.log_path)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _take_listener(self) -> socket.socket:
        """The proxy's socket: the reservation made at construction, else (a restart) the port again."""
        from scanflow.platform.processes import PortInUse, reserve_port

        sock, self._listener = self._listener, None
        if sock is not None:
            return sock
        try:
            return reserve_port(self.host, self.port)
        except PortInUse as exc:
            raise MlflowServerError(f"the MLflow proxy's {exc.strerror}") from None

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        with httpx.Client(timeout=2.0) as client:
            while True:
                assert self._proc is not None
                if not self.alive():
                    raise MlflowServerError(
                        f"mlflow server (or its proxy) exited:\n{self._log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise MlflowServerError(
                        f"mlflow server not healthy after {self.startup_timeout_s:.0f}s:\n{self._log_tail()}"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)

    def _log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the whole process group (and the proxy's): SIGTERM, then SIGKILL after `timeout_s`."""
        if self._listener is not None:  # never handed to a proxy: the port is free again
            self._listener.close()
            self._listener = None
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            _stop_group(proxy, timeout_s)
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_group(proc, timeout_s)
        if self._sock_dir is not None:  # the next start makes a fresh private directory
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process group, wait, then SIGKILL it (a worker may outlive its parent)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("mlflow server pid %s did not exit", proc.pid)


def is_healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True when an MLflow server answers /health at `url`."""
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


# --- one shared local server per Scanflow home ------------------------------------------------

_owned: dict[Path, MlflowServer] = {}


def _state_file(home: Path) -> Path:
    return home / "server.json"


def _read_state(home: Path) -> str | None:
    import json

    try:
        data = json.loads(_state_file(home).read_text())
        url = data.get("url")
        return str(url) if url else None
    except (OSError, ValueError):
        return None


def _write_state(home: Path, server: MlflowServer) -> None:
    import json

    tmp = _state_file(home).with_suffix(".tmp")
    proxy = server._proxy.pid if server._proxy is not None else None
    tmp.write_text(json.dumps({"url": server.url, "pid": server.pid, "proxy_pid": proxy}))
    tmp.replace(_state_file(home))


def ensure_tracking(settings: object) -> str:
    """The tracking URI to use: `settings.tracking_uri` if set, else a local server in `home/mlflow`.

    Who calls it: `scanflow deploy --platform local` at startup. A server already running for this home
    (started by `scanflow mlflow up` or another process; found through home/mlflow/server.json and a
    /health probe) is reused. Otherwise one is started, owned by this process and stopped at exit.
    A file lock makes concurrent callers start at most one server. The local server runs behind logins
    (scanflow.tracking.logins, `home/mlflow/logins.json`, mode 0600): this process's environment gets
    the operator's (MLFLOW_TRACKING_USERNAME / _PASSWORD) and the logins the platform hands its replicas
    and Jobs (SCANFLOW_REPLICA_MLFLOW_* / SCANFLOW_JOB_MLFLOW_*).
    """
    import atexit
    import fcntl

    from scanflow.tracking.logins import client_env, load_or_create

    uri = getattr(settings, "tracking_uri", None)
    if uri:
        return str(uri)
    home = (Path(getattr(settings, "home", Path(".scanflow"))) / "mlflow").resolve()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            logins = load_or_create(home)
            # this process works as the operator; the platform hands its children their own logins
            os.environ.update(client_env(logins))
            known = _read_state(home)
            if known and is_healthy(known):
                return known
            server = _owned.get(home)
            if server is None or server.pid is None:
                server = MlflowServer(home, users=logins)
                server.start()
                _owned[home] = server
                atexit.register(server.stop)
            _write_state(home, server)
            return server.url
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
