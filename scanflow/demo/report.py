"""Scenario outcomes and how the demo shows them: a rich table for people, one JSON line for machines.

Pure (no I/O besides the render calls handed a console): each scenario module returns a
`ScenarioResult` whose `bar` says in words what it had to meet and whose `passed` says whether it did.
Who calls: scanflow.demo.runner (the table and the JSON line), tests/demo.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ScenarioResult:
    """One scenario's verdict. `figures` are plain numbers/strings (they go to MLflow and JSON)."""

    key: str  # "s1".."s4"
    title: str
    bar: str  # the explicit pass criterion, in words
    passed: bool = False
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)  # short "why" lines, newest last
    error: str | None = None
    series: dict[str, Any] = field(default_factory=dict, repr=False)  # time series for plots only

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "bar": self.bar, "passed": self.passed,
                "seconds": round(self.seconds, 2), "figures": _plain(self.figures),
                "decisions": self.decisions[-5:], "error": self.error}


def _plain(v: Any) -> Any:
    """JSON-safe: NaN/inf -> None, floats rounded, tuples -> lists."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float):
        return None if not math.isfinite(v) else round(v, 4)
    return v


def summary(results: list[ScenarioResult], **extra: Any) -> dict[str, Any]:
    """The figures of the whole run as one JSON-ready object (the `--json` last line)."""
    return {"ok": all(r.passed for r in results) and bool(results),
            "scenarios": {r.key: r.to_dict() for r in results}, **_plain(extra)}


def json_line(results: list[ScenarioResult], **extra: Any) -> str:
    return json.dumps(summary(results, **extra), separators=(",", ":"), allow_nan=False)


def fmt(v: Any) -> str:
    """Compact human form of a figure."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def metric_items(results: list[ScenarioResult]) -> dict[str, float]:
    """Numeric figures flattened to MLflow metric names, e.g. "s1.accuracy_after"."""
    out: dict[str, float] = {}
    for r in results:
        out[f"{r.key}.passed"] = float(r.passed)
        out[f"{r.key}.seconds"] = float(r.seconds)
        for k, v in r.figures.items():
            if isinstance(v, (bool, int, float)) and math.isfinite(float(v)):
                out[f"{r.key}.{k}"] = float(v)
    return out


def table(results: list[ScenarioResult]) -> Any:
    """A rich Table: scenario, time, key figures, decisions, bar, verdict."""
    from rich.table import Table

    t = Table(title="Scanflow demo: autonomic scenarios", show_lines=True)
    t.add_column("scenario", style="bold")
    t.add_column("time", justify="right")
    t.add_column("figures")
    t.add_column("decisions")
    t.add_column("bar")
    t.add_column("met", justify="center")
    for r in results:
        figs = "\n".join(f"{k}: {fmt(v)}" for k, v in r.figures.items())
        if r.error:
            figs = (figs + "\n" if figs else "") + f"[red]error: {r.error}[/red]"
        verdict = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        t.add_row(f"{r.key.upper()} {r.title}", f"{r.seconds:.0f}s", figs, "\n".join(r.decisions[-3:]),
                  r.bar, verdict)
    return t
