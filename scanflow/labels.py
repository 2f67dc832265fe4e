"""Comparing a model's output with a true label, as both arrive over JSON.

Its own module (no numpy, no torch) because both the drift package's accuracy measurement and the
Planner's delivery analysis compare predictions with feedback labels, and the policies must stay light.
"""

from __future__ import annotations

from typing import Any


def same_label(a: Any, b: Any) -> bool:
    """Labels equal as the model and the feedback write them (3, 3.0, "3" and numpy ints are one label)."""
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)
