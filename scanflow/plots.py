"""The demo's figures (drift score over time, accuracy before/after, latency and replicas over time,
controller comparison, tuning probes, failover timeline), and logging them to MLflow.

Every function builds a `matplotlib.figure.Figure` directly (no pyplot, no global state, no display
needed: the Agg canvas), so it is safe in worker threads, in the CLI and inline in notebooks (a
Figure renders itself there). Inputs are plain sequences, so the plots are testable without a stack.
Who calls: scanflow.demo (logs them to the demo's MLflow run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scanflow.extras import missing_extra

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
except ModuleNotFoundError as _exc:
    raise missing_extra(_exc, "demo", "Scanflow's plots") from None


def _figure(width: float = 7.0, height: float = 3.2) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas: renders to PNG without a display
    return fig


P_FLOOR = 1e-16  # p-values below (a drifted window's can underflow to 0) are drawn at it, on a log axis


def drift_over_time(t: Sequence[float], scores: Sequence[float], drift: Sequence[bool] | None = None,
                    marks: Mapping[str, float] | None = None, threshold: float | None = None, *,
                    p_values: Sequence[float | None] | None = None, xlabel: str = "window") -> Figure:
    """Drift score per checked window; drifted windows in red; vertical marks (onset, promotion...).

    `t` is whatever positions the caller has (window indices, seconds since start): `xlabel` names them.
    The detector flags a window when its p-value is below its threshold (its stated fpr), so with
    `p_values` a second panel draws the p-values (log scale) and `threshold` as a line on it; without
    them `threshold` is taken as a threshold on the score and drawn on the score axis. p-values under
    P_FLOOR are drawn at P_FLOOR (the axis label then says so).
    """
    rows = 2 if p_values is not None else 1
    fig = _figure(7.0, 3.2 if rows == 1 else 5.0)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    ax.plot(t, scores, "-o", color="tab:blue", ms=4, label="drift score")
    flags = [bool(d) for d in drift] if drift is not None else []
    hot = [(x, y) for i, (x, y) in enumerate(zip(t, scores, strict=False)) if i < len(flags) and flags[i]]
    if hot:
        ax.scatter(*zip(*hot, strict=True), color="tab:red", zorder=3, label="drift detected")
    if threshold is not None and p_values is None:
        ax.axhline(threshold, color="grey", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_ylabel("score")
    if p_values is not None:
        ax_p = axes[1]
        pts = [(i, x, max(float(p), P_FLOOR)) for i, (x, p) in enumerate(zip(t, p_values, strict=False))
               if p is not None]
        floored = any(p is not None and float(p) < P_FLOOR for p in p_values)
        if pts:
            ax_p.plot([x for _, x, _ in pts], [p for _, _, p in pts], "-o", color="tab:purple", ms=4,
                      label="p-value")
            hot_p = [(x, p) for i, x, p in pts if i < len(flags) and flags[i]]
            if hot_p:
                ax_p.scatter(*zip(*hot_p, strict=True), color="tab:red", zorder=3)
        ax_p.set_yscale("log")
        if threshold is not None:
            ax_p.axhline(threshold, color="grey", ls="--", lw=1, label=f"threshold p < {threshold:g}")
        ax_p.set_ylabel(f"p-value (floor {P_FLOOR:g})" if floored else "p-value")
    for a in axes:
        for i, (name, x) in enumerate((marks or {}).items()):
            a.axvline(x, color=f"C{i + 2}", ls=":", lw=1.5, label=name if a is ax else None)
        a.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel(xlabel)
    ax.set_title("S1: drift score over time")
    return fig


def accuracy_before_after(values: Mapping[str, float]) -> Figure:
    """Bars, e.g. {"clean, old model": .97, "drifted, old model": .62, "drifted, new model": .9}."""
    fig = _figure(6.0, 3.2)
    ax = fig.add_subplot()
    names = list(values)
    vals = [float(values[n]) for n in names]
    bars = ax.bar(names, vals, color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, fmt="%.3f", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title("S1: accuracy before / after retraining")
    ax.tick_params(axis="x", labelsize=8)
    return fig


def latency_and_replicas(t: Sequence[float], latency_ms: Sequence[float | None], replicas: Sequence[int],
                         slo_ms: float, title: str = "S2: latency and replicas over time",
                         load: Sequence[float] | None = None, load_label: str = "load") -> Figure:
    """p99 latency (log scale) against the SLO, with the replica count on a second axis (integer ticks).

    With `load`, a panel below draws it on its own axis, labelled `load_label` (say what unit the caller's
    load is in, e.g. "load (requests/s)"): it never shares the replicas axis, whose scale it would crush.
    """
    fig = _figure(7.0, 3.2 if load is None else 4.8)
    if load is None:
        ax = fig.add_subplot()
        ax_load = None
    else:
        ax, ax_load = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    pts = [(x, y) for x, y in zip(t, latency_ms, strict=False) if y is not None and y > 0]
    if pts:
        ax.plot(*zip(*pts, strict=True), color="tab:blue", label="p99 latency (ms)")
        ax.set_yscale("log")
    ax.axhline(slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
    ax.set_ylabel("latency (ms)")
    ax2 = ax.twinx()
    ax2.step(t, replicas, where="post", color="tab:green", label="replicas")
    ax2.set_ylabel("replicas")
    ax2.set_ylim(0, max(replicas, default=1) + 1)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper right")
    ax.set_title(title)
    if ax_load is not None and load is not None:
        ax_load.step(t, load, where="post", color="tab:grey", label=load_label)
        ax_load.set_ylabel(load_label)
        ax_load.set_ylim(0, max(load, default=1) * 1.1 or 1)
        ax_load.set_xlabel("time (s)")
    else:
        ax.set_xlabel("time (s)")
    return fig


def controllers(series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                slo_ms: float) -> Figure:
    """Side by side: for each controller name, (t, cores allocated, latency_ms) on the same trace (cores:
    replicas x cores each, so a vertical-first controller's resizes show as well as replicas)."""
    fig = _figure(7.0, 4.4)
    ax_r, ax_l = fig.subplots(2, 1, sharex=True)
    for i, (name, (t, cores, lat)) in enumerate(series.items()):
        ax_r.step(t, cores, where="post", color=f"C{i}", label=name)
        ax_l.plot(t, lat, color=f"C{i}", label=name)
    ax_l.axhline(slo_ms, color="tab:red", ls="--", lw=1, label="SLO")
    ax_l.set_yscale("log")
    ax_r.set_ylabel("cores allocated")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_xlabel("time (s)")
    ax_r.legend(fontsize=8)
    ax_r.set_title("S2: Planner policy vs HPA algorithm (same trace, simulated)")
    return fig


def tune_probes(measured: Mapping[str, float], default: str, chosen: str) -> Figure:
    """Throughput per probed configuration; the default and the choice highlighted."""
    fig = _figure(6.5, 3.2)
    ax = fig.add_subplot()
    names = list(measured)
    colors = ["tab:green" if n == chosen else "tab:grey" if n == default else "tab:blue" for n in names]
    bars = ax.bar(names, [measured[n] for n in names], color=colors)
    ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_ylabel("requests/s")
    ax.set_title(f"S3: throughput per configuration (default {default}, chosen {chosen})")
    ax.tick_params(axis="x", labelsize=8)
    return fig


def failover_timeline(t: Sequence[float], backup_share: Sequence[float], failed: Sequence[int],
                      marks: Mapping[str, float] | None = None) -> Figure:
    """Share of answers served by the backup per second, failed requests per second, and event marks."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(t, backup_share, color="tab:orange", label="share served by backup")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share served by backup")
    ax_f = ax.twinx()
    ax_f.bar(t, list(failed), width=0.8, color="tab:red", alpha=0.4, label="failed requests")
    ax_f.set_ylim(0, max([*failed, 1]) * 1.05)
    ax_f.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_f.set_ylabel("failed requests per second")
    ax.set_zorder(ax_f.get_zorder() + 1)  # the share line and the legend over the bars
    ax.patch.set_visible(False)
    for i, (name, x) in enumerate((marks or {}).items()):
        ax.axvline(x, color=f"C{i + 2}", ls=":", lw=1.5, label=name)
    ax.set_xlabel("time since start (s)")
    ax.set_title("S4: failover to the backup and back")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax_f.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")
    return fig


def log_figures(figures: Mapping[str, Figure], run_id: str | None = None, client: Any = None) -> list[str]:
    """Log each figure as `plots/<name>.png` to the run (the active one when run_id is None). Blocking."""
    import mlflow

    names = []
    for name, fig in figures.items():
        path = f"plots/{name}.png"
        if run_id is None:
            mlflow.log_figure(fig, path)
        else:
            (client or mlflow.MlflowClient()).log_figure(run_id, fig, path)
        names.append(path)
    return names
