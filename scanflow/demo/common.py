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
    # set by S1 at its drift onset: the new scanner stays, so the scenarios after it send the world S1
    # left (`traffic_rows`)
    world_drifted: bool = False

    def model_uri(self) -> str:
        return "models:/digits@champion"


def clean_rows(n: int = 512) -> np.ndarray:
    """Held-out clean digits rows (the test split) to send as traffic."""
    from scanflow.examples.digits.data import load_splits

    return load_splits(0).x_test[:n]


def traffic_rows(ctx: DemoContext, n: int = 512) -> np.ndarray:
    """Rows to send as traffic in the world as it is now: clean digits, or after S1's drift onset fresh
    digits through S1's drift (`scanflow.examples.digits.s1.post_drift_pool`: rows no reference, retrain or
    calibration held). Why: the champion S1 promoted serves the drifted world, and its detector was fitted
    on S1's traffic; clean rows would be a drift back, and S1's own pool rows would judge the detector
    on the rows it was refitted on."""
    if not ctx.world_drifted:
        return clean_rows(n)
    from scanflow.examples.digits.s1 import post_drift_pool

    return post_drift_pool()[0][:n]


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
