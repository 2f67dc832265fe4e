"""What every scenario gets: where to write, the knowledge base, the size, and a progress callback.

Who calls: scanflow.demo.runner builds one `DemoContext`; each scenario module takes it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Say = Callable[[str], None]


def _quiet(_msg: str) -> None:
    return None


@dataclass
class DemoContext:
    home: Path
    tracking_uri: str
    quick: bool = False
    say: Say = _quiet  # one-line progress updates (the runner shows them with rich)
    stack: Any = None  # scanflow.stack.EmbeddedStack for S1/S4 (None: those scenarios cannot run)
    t0: float = field(default_factory=time.monotonic)

    def model_uri(self) -> str:
        return "models:/digits@champion"


def clean_rows(n: int = 512) -> np.ndarray:
    """Held-out clean digits rows (the test split) to send as traffic."""
    from workflows.digits.data import load_splits

    return load_splits(0).x_test[:n]


def wait_for(cond: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll a condition until it holds or the deadline passes (never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval_s)
    return cond()


def reversals(replicas: Sequence[int]) -> int:
    """Pure: direction changes in a replica series (up then down counts 1)."""
    last, n = 0, 0
    for a, b in itertools.pairwise(replicas):
        if a != b:
            d = 1 if b > a else -1
            n += int(last != 0 and d != last)
            last = d
    return n
