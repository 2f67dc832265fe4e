"""The benchmarks' shared verdict: `--check` makes a benchmark exit 1 when its `target_met` is false.

Who calls it: each benchmark with a target (agent_events, alarms, canary, delivery_analysis, drift, s1,
scaling, serving, tuning) and `make bench`, which runs every benchmark with `--check`, so a missed target
fails the command instead of scrolling past in its output. A benchmark whose last JSON line has no `target_met` is a failed check too:
a verdict that is absent is not a pass.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


def add_check(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the target is not met (the last JSON line's target_met is false)")


def exit_code(figures: Mapping[str, Any], check: bool) -> int:
    """0, or 1 when `check` is on and the figures' `target_met` is not true."""
    return 1 if check and figures.get("target_met") is not True else 0
