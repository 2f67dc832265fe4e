"""OS process helpers for the local platform: spawn, stop, pin, read back, and small HTTP calls.

Kept apart from local.py so the platform module reads as "what to apply" and this one as "how the
OS does it". Readings of other processes (argv, environment, threads, cores, memory) come from
psutil, whose readers handle what hand-written /proc parsers get wrong (a command name holding ")" or
spaces, a process that ends or turns zombie mid-read, permissions) in one place; the start time alone
is read by hand (`start_time` says why).
Who calls: scanflow.platform.local, benchmarks/tuning_sweep.py, tests.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from scanflow.handoff import LISTEN_FD_ENV, RESERVED_PORTS_ENV, reserved_ports_value
from scanflow.private_files import PRIVATE_UMASK, open_private_log

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_LISTEN_PORT = 10000  # below: well-known and registered services' ports
_PICK_TRIES = 64
LISTEN_BACKLOG = 2048  # what the serving processes ask uvicorn for; the server sets its own on takeover


def listen_port_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """Pure: the ports `free_port` picks from, [low, high), given the OS's ephemeral range.

    Why outside the ephemeral range: a port is picked before the process that listens on it starts
    (seconds later for an agent or a replica), and in that window any outgoing connection of any
    process may take it as its source port. That happened in CI (an agent failed to bind twice). Below
    the ephemeral range, only another listener can take it. When the ephemeral range leaves no room
    below it (it starts under LOWEST_LISTEN_PORT + 1024), the range above it is used."""
    low, high = ephemeral
    if low - LOWEST_LISTEN_PORT >= 1024:
        return LOWEST_LISTEN_PORT, low
    if 65536 - (high + 1) >= 1024:
        return high + 1, 65536
    return 0, 0  # no room outside it: let the OS pick


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


class PortInUse(OSError):
    """A fixed port (a spec's, or one a restart must keep) is held by another socket."""


def reserve_port(host: str = "127.0.0.1", port: int | None = None) -> socket.socket:
    """A TCP socket listening on `host`:`port`: the port is ours until the socket is handed to the
    process that serves on it (`spawn(listener=)`, scanflow.handoff) or closed. Listening, because a
    listening port cannot be bound by anyone else, not even with SO_REUSEADDR (two sockets that set it
    may share a port while neither listens); a connection made before the server takes over waits in
    the queue until it does.

    SO_REUSEADDR, as every server sets: a restarted agent or gateway keeps its port, and the
    connections its last process closed (TIME_WAIT) must not keep it from the next one.
    `port` None: a free one outside the OS's ephemeral range (see `listen_port_range`), else the OS's
    pick. A fixed `port` held by someone else: `PortInUse`."""
    if port:
        try:
            return _listening(host, port)
        except OSError as exc:
            raise PortInUse(exc.errno, f"port {port} on {host} is in use by another process ({exc.strerror})") from None
    for candidate in _candidate_ports():
        try:
            return _listening(host, candidate)
        except OSError:
            continue
    return _listening(host, 0)


def _candidate_ports() -> list[int]:
    """Up to _PICK_TRIES random ports outside the OS's ephemeral range (none when there is no room)."""
    low, high = listen_port_range(_ephemeral_range())
    rng = random.SystemRandom()
    return [rng.randrange(low, high) for _ in range(_PICK_TRIES if high > low else 0)]


def _listening(host: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(LISTEN_BACKLOG)
    except OSError:
        s.close()
        raise
    return s


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now, outside the OS's ephemeral range: for a server this process
    cannot hand a socket to (MLflow's). Anything may take it before that server binds it; prefer
    `reserve_port` and `spawn(listener=)`."""
    for port in _candidate_ports():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))  # no SO_REUSEADDR: not even a TIME_WAIT may linger on it
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None, *,
          listener: socket.socket | None = None, reserved: list[socket.socket] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session (so a timeout can kill its whole group), output to a file;
    it creates files private to its user (PRIVATE_UMASK).

    `listener`: a `reserve_port` socket the process is to serve on (scanflow.handoff.LISTEN_FD_ENV);
    `reserved`: reservations it is to hand on to what it starts (RESERVED_PORTS_ENV). Either way the
    process gets the sockets and this one closes its copies, started or not: the ports belong to the
    child from here on (and are free again when it exits)."""
    handed = ([listener] if listener is not None else []) + list(reserved or [])
    try:
        env = dict(os.environ if env is None else env)
        env.pop(LISTEN_FD_ENV, None)  # descriptors of ours that are not the child's
        env.pop(RESERVED_PORTS_ENV, None)
        if listener is not None:
            env[LISTEN_FD_ENV] = str(listener.fileno())
        if reserved:
            env[RESERVED_PORTS_ENV] = reserved_ports_value(list(reserved))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open_private_log(log_path) as log:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                start_new_session=True, umask=PRIVATE_UMASK, pass_fds=tuple(s.fileno() for s in handed),
            )
    finally:
        for s in handed:
            s.close()


class Adopted:
    """A process another (now dead) platform started: watched and signalled by pid, not a child of ours.

    Mirrors the part of Popen the platform uses (pid, poll, wait, send_signal, returncode), so a
    replica or gateway reads the same whether we spawned or adopted it. `start_time` (clock ticks
    since boot, see `start_time()`) is what tells it from a later process that got the same pid.
    Exit codes of non-children are unknowable: a gone process reads -1.
    """

    def __init__(self, pid: int, start_time: int) -> None:
        self.pid = pid
        self.start_time = start_time
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not same_process(self.pid, self.start_time):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not wait_until(lambda: self.poll() is not None, timeout if timeout is not None else 1e9, 0.05):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return -1

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


Proc = subprocess.Popen[bytes] | Adopted


def start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat); None when gone or a zombie.

    The one reading not taken from psutil. The value is persisted (the platform's state.json,
    stack.json) and compared for equality after a restart to tell a process from a later one with the
    same pid. psutil's public create_time() adds the boot time as the wall clock tells it at each call,
    so converting it back to ticks can be off when the clock is set in between; the kernel's ticks since
    boot never change."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_process(pid: int, started: int) -> bool:
    """The process `pid` is alive and is the one that started at `started` (not a reused pid)."""
    return start_time(pid) == started


def cmdline(pid: int) -> list[str]:
    """argv of `pid` ([] when gone, a zombie, or unreadable)."""
    if pid <= 0:
        return []
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def scan_proc(match: Callable[[list[str], dict[str, str]], bool], exclude: set[int] | None = None) -> list[int]:
    """Pids (other than ours and `exclude`) whose argv and environment `match` accepts. Processes that
    end meanwhile, zombies, and those not ours to read (their environment is private) are skipped."""
    skip = (exclude or set()) | {os.getpid()}
    out = []
    for p in psutil.process_iter(["cmdline", "environ"], ad_value=None):  # ad_value: unreadable or zombie
        argv, env = p.info["cmdline"], p.info["environ"]
        if p.pid not in skip and argv is not None and env is not None and match(argv, env):
            out.append(p.pid)
    return out


def find_processes(key: str, value: str, modules: tuple[str, ...], exclude: set[int] | None = None) -> list[int]:
    """Pids (other than ours and `exclude`) running `python -m <one of modules>` with KEY=value in
    their environment: how processes a killed platform left behind are found."""

    return scan_proc(lambda argv, env: runs_module_with(argv, env, key, value, modules), exclude)


def runs_module_with(argv: list[str], environ: dict[str, str], key: str, value: str,
                     modules: tuple[str, ...]) -> bool:
    """Pure: `find_processes`' test of one process: one of `modules` is an argument of its own (as
    `python -m` gives it) and the environment holds KEY=value exactly."""
    return any(m in argv for m in modules) and environ.get(key) == value


def kill_groups(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """SIGKILL each pid's process group (the pid alone if it leads none); wait until they are gone.
    Returns the pids still alive at the deadline."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    left = list(pids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        left = [p for p in left if start_time(p) is not None]
        if left:
            time.sleep(0.05)
    return left


def stop(proc: Proc, grace_s: float = 10.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after `grace_s`; returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None


def signal_group(proc: Proc, sig: int) -> None:
    """`sig` to the process group `proc` leads (its children too); to `proc` alone where the group is
    gone or not ours; nothing when the process is already gone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def wait_until(cond: Callable[[], bool], deadline_s: float, interval_s: float = 0.1) -> bool:
    """Poll `cond` until it holds or the deadline passes; True when it held."""
    end = time.monotonic() + deadline_s
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval_s)


def set_affinity_all_threads(pid: int, cpus: tuple[int, ...]) -> None:
    """sched_setaffinity on every thread of `pid` (the call alone changes only the main thread).

    Two passes catch threads started during the first; threads started later inherit from their
    creator, which is already pinned.
    """
    for _ in range(2):
        try:
            tids = [t.id for t in psutil.Process(pid).threads()]
        except psutil.NoSuchProcess:  # ZombieProcess too
            raise ProcessLookupError(pid) from None
        except psutil.AccessDenied as exc:  # callers handle OSError
            raise PermissionError(f"threads of pid {pid}: {exc}") from None
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                continue  # thread ended meanwhile


@dataclass(frozen=True)
class ProcInfo:
    """What the kernel says about a process: the cores it may run on and its thread count."""

    cpus: tuple[int, ...]
    threads: int
    rss_bytes: int | None = None


def read_proc_status(pid: int) -> ProcInfo | None:
    """What the kernel says about `pid` (None when it is gone, a zombie, or unreadable)."""
    if pid <= 0:
        return None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return ProcInfo(cpus=tuple(p.cpu_affinity()), threads=p.num_threads(), rss_bytes=p.memory_info().rss)
    except psutil.Error:
        return None


class HttpError(RuntimeError):
    """An HTTP call failed after its retries (message names method, URL and the last problem); `status`: the
    last answer's HTTP status, None when there was no answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def call(
    method: str,
    url: str,
    *,
    json: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    retries: int = 3,
    backoff_s: float = 0.2,
    ok: tuple[int, ...] = (200, 201, 202, 204),
) -> Any:
    """One blocking HTTP call with a timeout and bounded retries (connect errors and 5xx) with backoff.

    4xx is not retried: it is a mistake of ours and the message says so. Returns the JSON body or None.
    """
    last, status = "", None
    for attempt in range(retries + 1):
        try:
            r = httpx.request(method, url, json=json, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            last, status = f"{type(exc).__name__}: {exc}", None
        else:
            status = r.status_code
            if r.status_code in ok:
                try:
                    return r.json()
                except ValueError:
                    return None
            last = f"HTTP {r.status_code}: {r.text[:300]}"
            if r.status_code < 500:
                break
        if attempt < retries:
            time.sleep(backoff_s * 2**attempt)
    raise HttpError(f"{method} {url} failed: {last}", status)


def is_ready(url: str, timeout_s: float = 2.0) -> bool:
    """GET url (a /ready or /health endpoint) answers 200."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
