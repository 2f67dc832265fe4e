"""Load and polling helpers for the local-platform tests (a module of its own: every test folder
has a `conftest`, so importing one by name would be ambiguous)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

import httpx


@dataclass
class Load:
    """Closed-loop client threads posting one-row /predict requests; counts outcomes by model version."""

    url: str
    clients: int = 2
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        row = [[0.1] * 64]
        with httpx.Client(timeout=10.0) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url + "/predict", json={"inputs": row})
                    with self._lock:
                        if r.status_code == 200:
                            self.ok += 1
                            v = str(r.json().get("model_version"))
                            self.versions[v] = self.versions.get(v, 0) + 1
                        else:
                            self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failed.append(repr(exc))
                time.sleep(0.005)

    def __enter__(self) -> Self:
        for _ in range(self.clients):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return self.ok, dict(self.versions)


def wait_for(cond: Callable[[], bool], deadline_s: float = 60.0, interval_s: float = 0.2) -> bool:
    """Poll `cond` until it holds or the deadline passes (no sleep-as-synchronisation in tests)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval_s)
    return bool(cond())
