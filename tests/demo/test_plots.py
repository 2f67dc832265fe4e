"""What a reader checks on the demo's figures (scanflow/plots.py), asserted on the Figure objects built from
small synthetic series: the replicas axis holds the replicas and nothing else, the load has its own axis and
label, the drift plot names its x values and draws the detector's threshold, every S4 axis has a y label.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from scanflow import plots


def _ydata(line: Line2D) -> list[float]:
    return [float(y) for y in np.asarray(line.get_ydata(), dtype=float)]


def _hlines(ax: Axes) -> list[float]:
    """y of each horizontal line spanning the axis (axhline: x data in axes coordinates, 0 to 1)."""
    return [_ydata(line)[0] for line in ax.get_lines()
            if np.asarray(line.get_xdata(), dtype=float).tolist() == [0.0, 1.0] and len(set(_ydata(line))) == 1]


def _render(fig: Figure) -> None:
    fig.canvas.draw()  # layout and every artist drawn: a broken figure fails here, not only in the PNG


def test_s2_replicas_axis_holds_the_replicas_and_the_load_has_its_own() -> None:
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    replicas = [1, 1, 2, 3, 3]
    load = [40.0, 40.0, 300.0, 300.0, 40.0]  # requests/s: far above the replica counts
    fig = plots.latency_and_replicas(t, [12.0, None, 80.0, 45.0, 20.0], replicas, 50.0,
                                     load=load, load_label="load (requests/s)")
    _render(fig)
    rep_axes = [ax for ax in fig.axes if ax.get_ylabel() == "replicas"]
    assert len(rep_axes) == 1
    rep = rep_axes[0]
    assert [_ydata(line) for line in rep.get_lines()] == [[float(r) for r in replicas]]
    assert all(not set(_ydata(line)) & set(load) for line in rep.get_lines())
    lo, hi = rep.get_ylim()
    assert lo <= 0 and max(replicas) < hi <= max(replicas) + 1  # the step from 1 to 3 fills the axis
    assert all(float(tick).is_integer() for tick in rep.get_yticks())
    load_axes = [ax for ax in fig.axes if any(_ydata(line) == load for line in ax.get_lines())]
    assert len(load_axes) == 1 and load_axes[0] is not rep
    assert load_axes[0].get_ylabel() == "load (requests/s)"
    lat = [ax for ax in fig.axes if ax.get_ylabel() == "latency (ms)"]
    assert len(lat) == 1 and 50.0 in _hlines(lat[0])  # the SLO on the latency axis
    assert all(50.0 not in _hlines(ax) for ax in fig.axes if ax is not lat[0])


def test_s2_without_load_has_no_load_axis() -> None:
    fig = plots.latency_and_replicas([0, 1, 2], [10.0, 20.0, 30.0], [1, 2, 2], 50.0)
    _render(fig)
    assert sorted(ax.get_ylabel() for ax in fig.axes) == ["latency (ms)", "replicas"]
    assert all(ax.get_xlabel() or ax.get_ylabel() == "replicas" for ax in fig.axes)


def test_demo_figures_label_the_load_in_requests_per_second() -> None:
    """runner.figures_of: S2's `clients` series is the open-loop rate (requests/s), labelled so."""
    from scanflow.demo.report import ScenarioResult
    from scanflow.demo.runner import figures_of

    res = ScenarioResult("s2", "autoscale", "bar")
    res.series = {"t": [0.0, 1.0, 2.0], "p99": [20.0, 90.0, 30.0], "replicas": [1, 2, 3],
                  "clients": [50.0, 250.0, 250.0], "slo_ms": 50.0,
                  "sim": {"planner": ([0.0, 1.0], [1, 2], [10.0, 20.0])}, "sim_slo_ms": 50.0}
    fig = figures_of([res])["s2_latency_replicas"]
    labels = {ax.get_ylabel() for ax in fig.axes}
    assert "load (requests/s)" in labels and not any("clients" in label for label in labels)


def test_demo_drift_figure_in_seconds_with_the_checkers_threshold() -> None:
    """runner.figures_of: S1's series are seconds since start; the threshold is the Checker's fpr on p-values."""
    from scanflow.demo.report import ScenarioResult
    from scanflow.demo.runner import figures_of

    res = ScenarioResult("s1", "drift", "bar")
    res.series = {"drift": {"t": [5.0, 20.0, 35.0], "score": [0.3, 8.0, 9.0], "drift": [False, True, True],
                            "p_value": [0.5, 1e-9, None]},
                  "marks": {"drift onset": 12.0}, "accuracy": {"old": 0.6, "new": 0.9}, "fpr": 0.05}
    fig = figures_of([res])["s1_drift_score"]
    assert fig.axes[-1].get_xlabel() == "time since start (s)"
    p_ax = [ax for ax in fig.axes if ax.get_ylabel() == "p-value"]
    assert len(p_ax) == 1 and 0.05 in _hlines(p_ax[0])


def test_drift_plot_names_its_x_values_and_draws_the_p_value_threshold() -> None:
    t = [0, 1, 2, 3, 4]
    fig = plots.drift_over_time(t, [0.2, -0.4, 0.5, 9.0, 11.0], [False, False, False, True, True],
                                {"new scanner": 2.5}, threshold=0.05,
                                p_values=[0.6, 0.4, 0.3, 1e-12, 0.0])
    _render(fig)
    assert fig.axes[-1].get_xlabel() == "window"
    p_ax = [ax for ax in fig.axes if ax.get_ylabel().startswith("p-value")]
    assert len(p_ax) == 1 and 0.05 in _hlines(p_ax[0])
    assert p_ax[0].get_ylabel() == f"p-value (floor {plots.P_FLOOR:g})"  # the 0.0 drawn at the floor, said so
    p_line = [line for line in p_ax[0].get_lines() if line.get_label() == "p-value"]
    assert len(p_line) == 1 and _ydata(p_line[0]) == [0.6, 0.4, 0.3, 1e-12, plots.P_FLOOR]
    score = [ax for ax in fig.axes if ax.get_ylabel() == "score"]
    assert len(score) == 1 and 0.05 not in _hlines(score[0])  # not a score threshold
    legend = p_ax[0].get_legend()
    assert legend is not None and any("0.05" in text.get_text() for text in legend.get_texts())


def test_drift_plot_score_threshold_and_custom_x_label() -> None:
    fig = plots.drift_over_time([3.5, 8.0, 12.5], [0.1, 0.2, 3.0], [False, False, True], threshold=2.0,
                                xlabel="time since start (s)")
    _render(fig)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time since start (s)" and ax.get_ylabel() == "score"
    assert 2.0 in _hlines(ax)


def test_drift_plot_defaults_to_windows_without_threshold() -> None:
    fig = plots.drift_over_time([0, 1, 2], [0.1, 0.2, 3.0])
    _render(fig)
    assert fig.axes[0].get_xlabel() == "window" and _hlines(fig.axes[0]) == []


def test_failover_every_axis_has_a_y_label() -> None:
    fig = plots.failover_timeline([0, 1, 2, 3], [0.0, 1.0, 0.5, 0.0], [0, 3, 0, 0], {"kill": 0.5})
    _render(fig)
    assert fig.axes and all(ax.get_ylabel() for ax in fig.axes)
    bars = [ax for ax in fig.axes if ax.patches]
    assert len(bars) == 1 and [p.get_height() for p in bars[0].patches if isinstance(p, Rectangle)] == [0, 3, 0, 0]
