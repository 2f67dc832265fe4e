"""OS process helpers for the local platform: spawn, stop, pin, read back, and small HTTP calls.

Kept apart from local.py so the platform module reads as "what to apply" and this one as "how the
OS does it". Who calls: scanflow.platform.local, benchmarks/tuning.py, tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from scanflow.platform.topology import parse_cpu_list


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process in its own session (so a timeout can kill its whole group), output to a file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after `grace_s`; returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    _signal_group(proc, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        return proc.wait(timeout=10)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
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
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:
            raise ProcessLookupError(pid) from None
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
    """Parse /proc/PID/status (None when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_proc_status(text)


def parse_proc_status(text: str) -> ProcInfo:
    fields = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    rss = fields.get("VmRSS", "").split()
    return ProcInfo(
        cpus=parse_cpu_list(fields.get("Cpus_allowed_list", "")),
        threads=int(fields.get("Threads", "0") or 0),
        rss_bytes=int(rss[0]) * 1024 if rss else None,
    )


class HttpError(RuntimeError):
    """An HTTP call failed after its retries (message names method, URL and the last problem)."""


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
    last = ""
    for attempt in range(retries + 1):
        try:
            r = httpx.request(method, url, json=json, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
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
    raise HttpError(f"{method} {url} failed: {last}")


def is_ready(url: str, timeout_s: float = 2.0) -> bool:
    """GET url (a /ready or /health endpoint) answers 200."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False
