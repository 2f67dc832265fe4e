"""`scanflow demo`: S1-S4 on the embedded default, with rich progress, a summary table, MLflow logging.

Order: the EmbeddedStack (MLflow, bootstrap, the four agents, the digits service and its backup)
starts; S1 (drift), S4 (failover) and S2 (autoscale: the Planner's strategy turned on for a load step,
in-process on a LocalPlatform of its own when the stack or cgroup CPU limits are missing, or with
SCANFLOW_DEMO_S2=inprocess) run on its agents; S3 (tune) runs its own services on a LocalPlatform against
the same MLflow. Then one MLflow run in the `scanflow-demo`
experiment gets every figure as a metric, the summary as JSON and the plots; the table goes to
stdout, progress to stderr, and with --json the last stdout line is the summary JSON. If the agents
cannot start, S1/S4 fail with the reason and S2/S3 still run on a plain MLflow + bootstrap.
Each run writes under `home/<timestamp>/` (MLflow data stays there to browse later).
Who calls: `scanflow demo` (scanflow/cli.py), tests/demo.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scanflow.demo.common import DemoContext
from scanflow.demo.report import ScenarioResult, json_line, metric_items, summary, table

log = logging.getLogger(__name__)
Scenario = Callable[[DemoContext], ScenarioResult]


def scenarios() -> list[tuple[str, str, Scenario]]:
    from scanflow.demo import s1_drift, s2_autoscale, s3_tune, s4_failover

    return [("s1", "S1 drift", s1_drift.run), ("s4", "S4 failover", s4_failover.run),
            ("s2", "S2 autoscale", s2_autoscale.run), ("s3", "S3 tune", s3_tune.run)]


# S2's autoscale settings (the strategy itself is off until S2 turns it on over REST): the guardrail
# durations divided by 10 so a scale-down follows within seconds (down window 3 s, 5 ticks and 3 s of
# agreeing ticks, 6 s cooldown); `pending_s` 600 / 10 = 60 real seconds for a replica asked for to show
# at the gateway (replicas start in real time: python, torch, the model from MLflow); a scale-up after 2
# ticks over the SLO in a row, so one noisy second of the shared machine adds no replica.
# latency_low 0.6: scale down below 0.6x the SLO (30 ms at 50 ms), not 0.5x; the Checker reports a p99
# as its bucket's bound, and at 0.5x two replicas at the low rate on a busy 2-core box often sat just above
# it (docs/benchmarks/scenarios.md, S2). The band up to the SLO still holds replicas, so a step down never re-breaches.
# down_window_s 100 (10 real s): a scale-down goes no lower than the most replicas needed in the last 10 s.
# The arrival-rate estimate holds the replicas a step needs however calm its p99 looks, so the window only
# has to outlast a noisy second; a longer one never clears on a busy machine, a shorter one flaps within
# S2's steps (the HPA's own window is 300 s). The runs behind it: docs/benchmarks/constants.md.
DEMO_AUTOSCALE: dict[str, Any] = {"time_scale": 10.0, "pending_s": 600.0, "latency_low": 0.6,
                                  "down_window_s": 100.0, "guardrails": {"up_ticks": 2}}


def demo_workflow() -> Any:
    """The digits workflow without the Planner's autoscale strategy: on 2 shared cores every training
    job breaches 50 ms p99, and S1/S4 are about drift and failover. S2 turns the strategy on over REST
    for its load step, with the Planner's autoscale durations scaled down (DEMO_AUTOSCALE)."""
    from scanflow.examples.digits.workflow import workflow

    def planner(a: Any) -> Any:
        settings = {**a.settings, "autoscale": {**dict(a.settings.get("autoscale", {})), **DEMO_AUTOSCALE}}
        return a.model_copy(update={"strategies": [s for s in a.strategies if "autoscale" not in s.name],
                                    "settings": settings})

    agents = [planner(a) if a.role == "planner" else a for a in workflow.agents]
    return workflow.model_copy(update={"agents": agents})


@contextmanager
def knowledge_base(home: Path, quick: bool, say: Callable[[str], None]) -> Iterator[tuple[Any, str, str | None]]:
    """(stack or None, tracking URI, why the stack is missing). Falls back to MLflow + bootstrap only."""
    from scanflow.stack import EmbeddedStack, StackError

    say("starting the embedded stack: MLflow, bootstrap (champion, drift detector), four agents")
    try:
        stack = EmbeddedStack(home / "stack", demo_workflow(), quick=quick)
        stack.__enter__()
    except (StackError, OSError, RuntimeError) as exc:
        why = f"stack did not start: {str(exc).splitlines()[0][:200]}"
        say(why + "; S2/S3 continue on MLflow alone")
        with _bare_mlflow(home / "kb", quick) as uri:
            yield None, uri, why
        return
    try:
        yield stack, stack.tracking_uri, None
    finally:
        say("stopping the stack")
        stack.__exit__(None, None, None)


@contextmanager
def _bare_mlflow(home: Path, quick: bool) -> Iterator[str]:
    """MLflow behind logins (scanflow.tracking.logins: <home>/mlflow/logins.json, mode 0600) and the
    bootstrap; this process works as the operator until the server stops, as with the stack."""
    from scanflow.credentials import MLFLOW_PASSWORD, MLFLOW_USER
    from scanflow.tracking.logins import load_or_create
    from scanflow.tracking.server import MlflowServer

    home.mkdir(parents=True, exist_ok=True)
    logins = load_or_create(home / "mlflow")
    saved = {k: os.environ.get(k) for k in (MLFLOW_USER, MLFLOW_PASSWORD)}
    try:
        with MlflowServer(home / "mlflow", users=logins) as srv:
            os.environ.update({MLFLOW_USER: "operator", MLFLOW_PASSWORD: logins["operator"][0]})
            env = dict(os.environ, MLFLOW_TRACKING_URI=srv.url, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
            argv = [sys.executable, "-m", "scanflow.embedded.bootstrap", "--workflow",
                    str(Path(__file__).resolve().parents[2] / "workflows/digits/workflow.yaml")]
            subprocess.run(argv + (["--quick"] if quick else []), env=env, check=True, timeout=600,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            yield srv.url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def figures_of(results: list[ScenarioResult]) -> dict[str, Any]:
    """The plots of the scenarios that produced series."""
    from scanflow import plots

    figs: dict[str, Any] = {}
    by = {r.key: r.series for r in results if r.series}
    if "s1" in by:
        d = by["s1"]["drift"]
        figs["s1_drift_score"] = plots.drift_over_time(d["t"], d["score"], d["drift"], by["s1"]["marks"],
                                                       by["s1"].get("fpr"), p_values=d.get("p_value"),
                                                       xlabel="time since start (s)")
        figs["s1_accuracy"] = plots.accuracy_before_after(by["s1"]["accuracy"])
    if "s2" in by:
        s = by["s2"]
        figs["s2_latency_replicas"] = plots.latency_and_replicas(s["t"], s["p99"], s["replicas"], s["slo_ms"],
                                                                 load=s["clients"], load_label="load (requests/s)")
        figs["s2_planner_vs_hpa"] = plots.controllers(s["sim"], s["sim_slo_ms"])
    if "s3" in by:
        s = by["s3"]
        figs["s3_tune"] = plots.tune_probes(s["measured"], s["default"], s["chosen"])
    if "s4" in by:
        s = by["s4"]
        figs["s4_failover"] = plots.failover_timeline(s["t"], s["backup_share"], [int(x) for x in s["failed"]],
                                                      s["marks"])
    return figs


def log_to_mlflow(tracking_uri: str, results: list[ScenarioResult], quick: bool) -> str:
    """One run in `scanflow-demo`: metrics, the summary JSON, the plots. Returns the run id. Blocking."""
    import mlflow

    from scanflow import plots

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("scanflow-demo")
    with mlflow.start_run(run_name=time.strftime("demo-%Y%m%d-%H%M%S")) as run:
        mlflow.log_params({"quick": quick, "cpu_count": os.cpu_count()})
        mlflow.set_tags({f"bar.{r.key}": r.bar[:250] for r in results} |
                        {f"passed.{r.key}": str(r.passed) for r in results})
        mlflow.log_metrics(metric_items(results))
        mlflow.log_dict(summary(results), "summary.json")
        plots.log_figures(figures_of(results))
        return str(run.info.run_id)


def run_demo(*, json_output: bool = False, quick: bool = False, home: Path = Path(".scanflow/demo")) -> bool:
    """Run S1-S4; print the table (stdout) and, with json_output, the JSON summary as the last line.
    True only when every scenario met its bar."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    out = Console(width=None if sys.stdout.isatty() else 160)  # a pipe gets a readable table too
    run_home = Path(home).resolve() / time.strftime("%Y%m%d-%H%M%S")
    run_home.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=run_home / "demo.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):  # one line per request would drown the scenario log
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # said first: with output to a file, the spinner is silent for minutes and this is where to look
    err.print(f"scanflow demo: log {run_home / 'demo.log'}, state under {run_home}")
    results: list[ScenarioResult] = []
    extra: dict[str, Any] = {"quick": quick, "home": str(run_home)}
    t_all = time.monotonic()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=False) as progress:
        task = progress.add_task("starting", total=None)

        def say(msg: str) -> None:
            progress.update(task, description=msg)
            log.info(msg)

        with knowledge_base(run_home, quick, say) as (stack, uri, why):
            import mlflow

            mlflow.set_tracking_uri(uri)
            os.environ["MLFLOW_TRACKING_URI"] = uri
            ctx = DemoContext(run_home, uri, quick=quick, say=say, stack=stack)
            for key, name, fn in scenarios():
                say(f"{name}: running")
                t = time.monotonic()
                try:
                    r = fn(ctx)
                except Exception as exc:  # noqa: BLE001 - one scenario's failure must not hide the others'
                    log.error("%s failed:\n%s", name, traceback.format_exc())
                    r = ScenarioResult(key, name, "", error=f"{type(exc).__name__}: {exc}"[:300])
                if why and r.error and "not running" in r.error:
                    r.error = why
                r.seconds = time.monotonic() - t
                results.append(r)
                progress.console.print(f"{'[green]PASS' if r.passed else '[red]FAIL'}[/] {name} "
                                       f"in {r.seconds:.0f}s")
            say("logging figures and plots to MLflow")
            try:
                extra["mlflow_run_id"] = log_to_mlflow(uri, results, quick)
            except Exception as exc:  # noqa: BLE001 - the table still prints
                log.error("MLflow logging failed:\n%s", traceback.format_exc())
                extra["mlflow_error"] = f"{type(exc).__name__}: {exc}"[:200]
            extra["mlflow_ui"] = uri
        progress.update(task, description="done")
    results.sort(key=lambda r: r.key)
    extra["seconds"] = round(time.monotonic() - t_all, 1)
    ok = all(r.passed for r in results)
    out.print(table(results))
    out.print(f"MLflow: run {extra.get('mlflow_run_id', '(not logged)')} in experiment 'scanflow-demo'. "
              f"The server stopped with the demo; browse it again with:\n"
              f"  scanflow mlflow up --home {run_home / ('stack' if 'mlflow_error' not in extra else 'kb')}/mlflow"
              f"   (then open the URL it prints and log in as 'operator' with the password in the "
              f"logins.json next to it; it was {uri} during the run)")
    out.print(f"{'all scenarios met their bars' if ok else 'some scenarios missed their bar'} "
              f"({extra['seconds']:.0f}s)")
    if json_output:
        sys.stdout.flush()
        print(json_line(results, **extra), flush=True)
    return ok
