"""`EmbeddedStack`: the whole autonomic loop on one machine, as real processes, in one `with` block.

    from scanflow.spec import load_workflow
    from scanflow.stack import EmbeddedStack

    with EmbeddedStack(".scanflow/s1", load_workflow("myteam/workflow.py"), quick=True) as stack:
        print(stack.service_url)                 # the inference endpoint (gateway of the primary)
        stack.get("executor", "/services")       # what the Executor's platform runs
        stack.decisions("planner")               # the Planner's audit log
        stack.kill_agent("checker"); stack.restart_agent("checker")

On enter: a local MLflow server (knowledge base) in `home/mlflow`; the bootstrap (first champion,
drift detector) as its own process; then the four agents as OS processes
(`python -m scanflow.cli agent run TARGET --port P`, peers in SCANFLOW_PEERS, the workflow in SCANFLOW_WORKFLOW,
TARGET being the AgentSpec's `module`, else `scanflow/standard/<role>.py`; P its `port`, else a free one), each with its own
SCANFLOW_HOME (its durable store), its own token (scopes: scanflow.auth.COMPONENT_SCOPES; `token`
is the operator's, an all-scopes admin), the accepted tokens' digests (SCANFLOW_AUTH_TOKENS), its own
MLflow login and MLFLOW_TRACKING_URI; the Executor also gets the replicas' and Jobs' credentials
(scanflow.credentials). MLflow runs behind an authenticating proxy (scanflow.tracking.mlflow_proxy) and
is restarted on its port when it dies; this process works as the operator (MLFLOW_TRACKING_USERNAME /
_PASSWORD set until stop). The Executor deploys the
services at startup; the stack returns once every agent answers /health (the Executor's only after its
services are ready). Service gateway ports are fixed here, so a restarted Executor serves on the same
endpoint. On exit (or error): agents get SIGTERM (the Executor stops its services), then SIGKILL, a
sweep kills anything a SIGKILLed Executor left behind, and MLflow stops. `on_progress` hears one line
per phase as it begins and ends (the library itself prints nothing).
Who calls: `scanflow up` (scanflow/embedded/up.py), tests/e2e, benchmarks/s1.py, `scanflow demo`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import httpx

from scanflow.agent.client import AgentClient
from scanflow.agent.sources import AgentModuleError
from scanflow.agentkit.env import QUICK_ENV, WORKFLOW_ENV, loopback_url, primary_service
from scanflow.auth import AUTH_TOKENS_ENV, COMPONENT_SCOPES, TokenTable, new_token
from scanflow.credentials import kind_vars
from scanflow.embedded.agentfiles import agent_target
from scanflow.embedded.leftovers import kill_leftovers
from scanflow.handoff import listen_host
from scanflow.platform.processes import PortInUse, reserve_port, signal_group, spawn
from scanflow.private_files import PRIVATE_UMASK, open_private_log, private_dir, write_private
from scanflow.spec import AgentSpec, Workflow
from scanflow.tracking.record_ids import RECORD_KEY_ENV, new_record_key

log = logging.getLogger(__name__)

ROLES = ("tracker", "checker", "planner", "executor")
# MLflow role of each login (scanflow.tracking.mlflow_proxy): the bootstrap and the operator administer,
# agents write, the Executor alone moves aliases, a Job may not move the champion, replicas only read.
MLFLOW_ROLES = {"bootstrap": "admin", "operator": "admin", "tracker": "writer", "checker": "writer",
                "planner": "writer", "executor": "executor", "job": "job", "replica": "reader"}
_OPERATOR_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
RECORD_KEY_FILE = "record.key"  # the stack's record key (0600), reused by its next start
MLFLOW_WATCH_S = 1.0  # how often the stack checks that MLflow (and its proxy) still run
REPO_ROOT = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    """The stack could not start (the message names the part and its log file)."""


def health_agent(status_code: int, body: object) -> str | None:
    """The agent name a /health answer gives, or None when it is no agent's healthy answer (pure).

    Why the name matters: something else can answer on the port the stack picked for an agent (another
    stack's agent, any HTTP server); a bare 200 would let the stack carry on without its own agent.
    """
    if status_code != 200 or not isinstance(body, dict):
        return None
    name = body.get("agent")
    return name if isinstance(name, str) else None


class EmbeddedStack:
    """MLflow + bootstrap + the four reference agents (+ the services the Executor deploys)."""

    def __init__(
        self,
        home: str | Path,
        workflow: Workflow,
        *,
        token: str | None = None,
        quick: bool = False,
        agents_dir: str | Path | None = None,
        python: str = sys.executable,
        ready_timeout_s: float = 300.0,
        extra_env: dict[str, str] | None = None,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self.home = Path(home).resolve()
        self.token = token or secrets.token_urlsafe(24)
        self.quick = quick
        self.agents_dir = Path(agents_dir or Path(__file__).resolve().parents[1] / "standard").resolve()
        self.python = python
        self.ready_timeout_s = ready_timeout_s
        self.extra_env = dict(extra_env or {})
        self.on_progress = on_progress
        self.workflow = workflow
        specs = {role: self.agent_spec(role) for role in ROLES}
        try:  # a wrong module fails here, before MLflow starts and the bootstrap trains
            self.targets = {role: agent_target(role, spec, self.agents_dir) for role, spec in specs.items()}
        except AgentModuleError as exc:
            raise StackError(str(exc)) from None
        # Every port is reserved now (a listening socket) and handed to its server when that starts
        # (scanflow.handoff): picked free and bound later, a port was taken in between in CI. Every
        # service gets a fixed gateway port, so a restarted Executor serves on the same endpoint; its
        # reservation goes to the Executor, which hands it to the gateway.
        self._host = listen_host(os.environ | self.extra_env)
        self._reserved: dict[str, socket.socket] = {}  # agent role -> its port, until the agent starts
        self._service_ports: list[socket.socket] = []  # until the Executor starts
        try:
            services = []
            for svc in workflow.services:
                self._service_ports.append(self._reserve(f"service {svc.name}", svc.port))
                services.append(svc.model_copy(update={"port": self._service_ports[-1].getsockname()[1]}))
            self.workflow = workflow.model_copy(update={"services": services})
            for role, spec in specs.items():
                self._reserved[role] = self._reserve(f"agent {role}", spec.port if spec else None)
        except StackError:
            self._release_ports()
            raise
        self.ports = {role: int(s.getsockname()[1]) for role, s in self._reserved.items()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.mlflow: Any = None
        self.tracking_uri = ""
        self.bootstrap_result: dict[str, Any] = {}
        # one token per component (scopes: scanflow.auth.COMPONENT_SCOPES); `token` is the operator's
        self.tokens = {name: (self.token if name == "operator" else new_token()) for name in COMPONENT_SCOPES}
        self.token_table = TokenTable.of({n: (t, COMPONENT_SCOPES[n]) for n, t in self.tokens.items()})
        # one MLflow login per component; the operator's password is its token (the token file)
        self.mlflow_logins = {name: (self.token if name == "operator" else new_token(), role)
                              for name, role in MLFLOW_ROLES.items()}
        # binds prediction ids to their service (scanflow.tracking.record_ids): the Tracker checks,
        # the Executor derives each service's key for its replicas. Kept in the home (start()): records a
        # replica spooled before a restart of the stack carry ids tagged with it
        self.record_key = new_record_key()
        self.mlflow_restarts = 0
        self._saved_env: dict[str, str | None] = {}
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- addresses -------------------------------------------------------------------------------
    @property
    def agent_urls(self) -> dict[str, str]:
        return {r: f"http://127.0.0.1:{p}" for r, p in self.ports.items()}

    @property
    def service_urls(self) -> dict[str, str]:
        return {s.name: loopback_url(s) for s in self.workflow.services}

    @property
    def service_url(self) -> str:
        """The endpoint clients use: the gateway of the primary service."""
        return loopback_url(primary_service(self.workflow))

    def agent_spec(self, role: str) -> AgentSpec | None:
        """The workflow's AgentSpec for `role` (None: the agent runs with the reference file's defaults)."""
        return next((a for a in self.workflow.agents if a.role == role), None)

    def pids(self) -> dict[str, int]:
        """Pids of what this stack started and still runs: "mlflow" and each live agent (by role)."""
        out = {role: p.pid for role, p in self.procs.items() if p.poll() is None}
        if self.mlflow is not None and self.mlflow.pid is not None:
            out["mlflow"] = self.mlflow.pid
        return out

    def agent_home(self, role: str) -> Path:
        return self.home / "agents" / role

    def log_path(self, role: str) -> Path:
        return self.home / "logs" / f"{role}.log"

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        from scanflow.tracking.server import MlflowServer

        private_dir(self.home)
        private_dir(self.home / "logs")
        key_file = self.home / RECORD_KEY_FILE
        if key_file.exists():
            self.record_key = key_file.read_text(encoding="utf-8").strip()
        else:
            write_private(key_file, self.record_key)
        write_private(self.home / "workflow.yaml", self.workflow.to_yaml())
        self._say("mlflow: starting (behind its authenticating proxy)")
        self.mlflow = MlflowServer(self.home / "mlflow", users=self.mlflow_logins,
                                   startup_timeout_s=self.ready_timeout_s)
        self.tracking_uri = self.mlflow.start()
        self._watch_stop.clear()
        self._watcher = threading.Thread(target=self._watch_mlflow, name="mlflow-watch", daemon=True)
        self._watcher.start()
        # this process (tests, the demo, notebooks reading MLflow) works as the operator until stop()
        self._saved_env = {k: os.environ.get(k) for k in _OPERATOR_ENV}
        os.environ.update({"MLFLOW_TRACKING_USERNAME": "operator", "MLFLOW_TRACKING_PASSWORD": self.token})
        self._say(f"mlflow: up at {self.tracking_uri} (login: user 'operator', password: the stack's token)")
        self._say("bootstrap: training the first champion and fitting the drift detector (this takes a while)")
        self._bootstrap()
        self._say(f"bootstrap: done (champion version {self.bootstrap_result.get('champion', '?')})")
        for role in ROLES:  # the Executor last: its replicas post to the Tracker
            self._spawn(role)
        self._say(f"agents: started {', '.join(ROLES)}; waiting for each to answer /health")
        for role in ROLES:
            if role == "executor":
                self._say("executor: deploying the services")
            self._wait_healthy(role)
            self._say(f"agent {role}: healthy at {self.agent_urls[role]}")
        self._say(f"services: ready ({', '.join(s.name for s in self.workflow.services)})")
        return self

    def _reserve(self, what: str, port: int | None) -> socket.socket:
        try:
            return reserve_port(self._host, port)
        except PortInUse as exc:
            raise StackError(f"{what}: {exc.strerror}") from None

    def _release_ports(self) -> None:
        """Close the reservations no process took (a stack that stops before, or never, started)."""
        for sock in [*self._reserved.values(), *self._service_ports]:
            sock.close()
        self._reserved.clear()
        self._service_ports.clear()

    def _say(self, line: str) -> None:
        if self.on_progress is not None:
            self.on_progress(line)

    def _watch_mlflow(self) -> None:
        """Restart MLflow (and its proxy) on the same port when either dies, like a supervisor would:
        agents and replicas retry their MLflow calls meanwhile. Stops with the stack."""
        while not self._watch_stop.wait(MLFLOW_WATCH_S):
            srv = self.mlflow
            if srv is None or srv.alive():
                continue
            log.warning("mlflow (or its proxy) died; restarting it on %s", srv.url)
            try:
                srv.start()
            except Exception as exc:  # noqa: BLE001  # keep watching: the next round tries again
                log.error("mlflow restart failed: %s", exc)
                continue
            self.mlflow_restarts += 1
            self._say(f"mlflow: restarted ({self.mlflow_restarts})")

    def kill_mlflow(self) -> None:
        """SIGKILL MLflow's process group, as a crash would (the watch restarts it)."""
        srv = self.mlflow
        if srv is not None and srv._proc is not None:
            signal_group(srv._proc, signal.SIGKILL)

    def stop(self) -> None:
        """Stop agents (SIGTERM, then SIGKILL), sweep leftovers, stop MLflow. Idempotent."""
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=self.ready_timeout_s)
            self._watcher = None
        for role in reversed(ROLES):
            p = self.procs.get(role)
            if p is not None and p.poll() is None:
                signal_group(p, signal.SIGTERM)
        for role in reversed(ROLES):
            p = self.procs.pop(role, None)
            if p is None:
                continue
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                signal_group(p, signal.SIGKILL)
                p.wait(timeout=10)
        kill_leftovers(self.agent_home("executor"))
        self._release_ports()
        if self.mlflow is not None:
            self.mlflow.stop()
            self.mlflow = None
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def _env(self, role: str) -> dict[str, str]:
        """An agent's (or the bootstrap's) environment: its own token and MLflow login, the table of
        accepted tokens (digests), and for the Executor the credentials of what it starts."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MLFLOW_TRACKING_") and not (k.startswith("SCANFLOW_") and k.endswith("_TOKEN"))}
        user, password = (role, self.mlflow_logins[role][0])
        env.update({
            AUTH_TOKENS_ENV: self.token_table.to_json(),
            "MLFLOW_TRACKING_USERNAME": user,
            "MLFLOW_TRACKING_PASSWORD": password,
            "SCANFLOW_HOME": str(self.agent_home(role)),
            "SCANFLOW_STACK_HOME": str(self.home),  # the agents' shared monitoring runs in MLflow are the stack's
            "SCANFLOW_HTTP_TIMEOUT_S": "30",
            "MLFLOW_TRACKING_URI": self.tracking_uri,
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
            WORKFLOW_ENV: str(self.home / "workflow.yaml"),
            # discovery: the same settings the manifests and compose set, with loopback values
            "SCANFLOW_PEERS": ",".join(f"{r}={u}" for r, u in self.agent_urls.items() if r != role),
            "SCANFLOW_TRACKER_URL": self.agent_urls["tracker"],
            "SCANFLOW_SERVICE_URLS": ",".join(f"{n}={u}" for n, u in self.service_urls.items()),
            QUICK_ENV: "1" if self.quick else "0",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("SCANFLOW_STORE_URL", None)  # each agent keeps its own store in its home
        if role in self.tokens:
            env["SCANFLOW_TOKEN"] = self.tokens[role]
        env.pop(RECORD_KEY_ENV, None)
        if role in ("tracker", "executor"):
            env[RECORD_KEY_ENV] = self.record_key
        if role == "executor":  # what its platform hands to replicas and Jobs (scanflow.credentials)
            for kind in ("replica", "job"):
                token_var, user_var, password_var = kind_vars(kind)
                if kind in self.tokens:
                    env[token_var] = self.tokens[kind]
                env[user_var], env[password_var] = kind, self.mlflow_logins[kind][0]
        env.update(self.extra_env)
        return env

    def _bootstrap(self) -> None:
        argv = [self.python, "-m", "scanflow.embedded.bootstrap", "--workflow", str(self.home / "workflow.yaml")]
        if self.quick:
            argv.append("--quick")
        logf = self.home / "logs" / "bootstrap.log"
        with open_private_log(logf) as out:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, env=self._env("bootstrap"),
                                  cwd=REPO_ROOT, timeout=self.ready_timeout_s, check=False, umask=PRIVATE_UMASK)
        if proc.returncode != 0:
            raise StackError(f"bootstrap failed (exit {proc.returncode}); see {logf}:\n{_tail(logf)}")
        lines = proc.stdout.decode().strip().splitlines()
        self.bootstrap_result = json.loads(lines[-1]) if lines else {}

    def _argv(self, role: str) -> list[str]:
        # peers come from SCANFLOW_PEERS and the workflow from SCANFLOW_WORKFLOW (_env), as in a pod
        return [self.python, "-m", "scanflow.cli", "agent", "run", self.targets[role], "--port", str(self.ports[role])]

    def _spawn(self, role: str) -> None:
        """Start the agent on its reserved port; a restarted one reserves the port again first (its
        last process freed it), and fails clearly when someone else took it meanwhile."""
        self.agent_home(role).mkdir(parents=True, exist_ok=True)
        listener = self._reserved.pop(role, None) or self._reserve(f"agent {role}", self.ports[role])
        reserved: list[socket.socket] = []
        if role == "executor":  # the gateway ports go with it, once
            reserved, self._service_ports = self._service_ports, []
        self.procs[role] = spawn(self._argv(role), self.log_path(role), self._env(role),
                                 listener=listener, reserved=reserved, cwd=REPO_ROOT)

    def _wait_healthy(self, role: str, timeout_s: float | None = None) -> None:
        """Wait until THIS agent answers /health on its port.

        Why the name check: the agent serves on the socket the stack reserved for it, but a wrong
        `port` in an AgentSpec, or a mix-up of stacks, could put another server there; a bare 200 would
        let the stack carry on without its own agent.
        """
        timeout_s = timeout_s or self.ready_timeout_s
        deadline = time.monotonic() + timeout_s
        url = self.agent_urls[role] + "/health"
        spec = self.agent_spec(role)
        expected = spec.name if spec else None
        answered: str | None = None  # the last agent name seen on the port (a foreign one, if any)
        while time.monotonic() < deadline:
            p = self.procs[role]
            if p.poll() is not None:
                raise StackError(f"agent {role} exited with {p.returncode}{_foreign(answered, expected)}; "
                                 f"see {self.log_path(role)}:\n{_tail(self.log_path(role))}")
            name = self._health_name(url)
            if name is not None and (expected is None or name == expected):
                return
            answered = name or answered
            time.sleep(0.2)
        raise StackError(f"agent {role} not healthy within {timeout_s:.0f}s{_foreign(answered, expected)}; "
                         f"see {self.log_path(role)}:\n{_tail(self.log_path(role))}")

    @staticmethod
    def _health_name(url: str) -> str | None:
        """GET /health; the agent name it gives, or None (no answer, not 200, not an agent's JSON)."""
        try:
            r = httpx.get(url, timeout=2.0)
            return health_agent(r.status_code, r.json())
        except (httpx.HTTPError, ValueError):
            return None

    # -- chaos -----------------------------------------------------------------------------------
    def kill_agent(self, role: str) -> None:
        """SIGKILL the agent's process group, as a crash would (its store stays as it was)."""
        p = self.procs[role]
        signal_group(p, signal.SIGKILL)
        p.wait(timeout=10)

    def restart_agent(self, role: str, wait: bool = True) -> None:
        """Start the agent again on the same port and store; wait for /health unless told not to."""
        p = self.procs.get(role)
        if p is not None and p.poll() is None:
            raise StackError(f"agent {role} is still running; kill_agent it first")
        self._spawn(role)
        if wait:
            self._wait_healthy(role)

    def alive(self, role: str) -> bool:
        p = self.procs.get(role)
        return p is not None and p.poll() is None

    # -- reading ---------------------------------------------------------------------------------
    def client(self, role: str) -> AgentClient:
        """An async REST client of one agent (close it: `async with stack.client("planner") as c:`)."""
        return AgentClient(self.agent_urls[role], self.token, timeout=30.0)

    def get(self, role: str, path: str, **params: Any) -> Any:
        """GET an agent's JSON endpoint (sync), e.g. get("planner", "/decisions", limit=1000)."""
        r = httpx.get(self.agent_urls[role] + path, params=params or None, timeout=30.0,
                      headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()

    def decisions(self, role: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.get(role, "/decisions", limit=limit))

    def events(self, role: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.get(role, "/events", limit=limit))


def _foreign(answered: str | None, expected: str | None) -> str:
    """The part of a StackError that says another agent (or server) held the role's port."""
    return f" (its port answers /health as {answered!r}, not {expected!r})" if answered is not None else ""


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
