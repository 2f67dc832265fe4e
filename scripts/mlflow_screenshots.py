"""Screenshots of the MLflow UI pages where the agents' story shows, for docs/tracking.md.

Run after a demo or a stack that went through a retrain (its MLflow data stays in its home):

    python scripts/mlflow_screenshots.py --mlflow-home .scanflow/demo/<timestamp>/stack/mlflow --out docs/img

It starts an MLflow server on that data (or uses --tracking-uri), finds the pages by the tags the
agents write (scanflow.tracking.monitoring): the workflow experiment's runs, the monitoring run's
metric charts, the retrain run with its cause and description, the model version it registered, and
the demo's summary run; then has headless Chromium (Debian's `chromium` package) render each page.
A page that cannot be found is reported and skipped; the exit code is 1 when none could be taken.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def pages(uri: str) -> list[tuple[str, str]]:
    """(file name, UI route) of each page worth showing in this store."""
    from mlflow.tracking import MlflowClient

    from scanflow.tracking import monitoring

    client = MlflowClient(uri)
    out: list[tuple[str, str]] = []
    experiments = client.search_experiments()
    monitors = [r for e in experiments for r in client.search_runs(
        [e.experiment_id], f"tags.`{monitoring.KIND_TAG}` = '{monitoring.MONITOR_KIND}'", max_results=10)]
    if monitors:
        # the primary service's run: the one holding drift checks (a backup's holds latency only)
        m = max(monitors, key=lambda r: ("drift/score" in r.data.metrics, len(r.data.metrics)))
        exp = m.info.experiment_id
        out.append(("mlflow-experiment-runs.png", f"#/experiments/{exp}"))
        out.append(("mlflow-monitoring-run-charts.png", f"#/experiments/{exp}/runs/{m.info.run_id}/model-metrics"))
        # training runs live in the workflow's jobs experiment
        retrains = client.search_runs([e.experiment_id for e in experiments], "attributes.run_name LIKE 'retrain-%'",
                                      max_results=5)
        if retrains:
            r = retrains[0]
            out.append(("mlflow-retrain-run.png", f"#/experiments/{r.info.experiment_id}/runs/{r.info.run_id}"))
    for model in client.search_registered_models(max_results=10):
        versions = client.search_model_versions(f"name = '{model.name}'")
        promoted = [v for v in versions if v.tags.get(monitoring.PROMOTED_TAG)]
        v = max(promoted or versions, key=lambda x: int(x.version), default=None)
        if v is not None:
            out.append((f"mlflow-model-{model.name}-v{v.version}.png", f"#/models/{model.name}/versions/{v.version}"))
            break
    demo = client.get_experiment_by_name("scanflow-demo")
    if demo is not None:
        runs = client.search_runs([demo.experiment_id], max_results=1)
        if runs:
            out.append(("mlflow-demo-summary.png", f"#/experiments/{demo.experiment_id}/runs/{runs[0].info.run_id}"))
    return out


def shoot(chromium: str, url: str, path: Path) -> bool:
    charts = "model-metrics" in url
    height = 2400 if charts else 1000  # the charts page: every metric section
    budget = 120_000 if charts else 30_000  # virtual ms; each chart loads its metric history on its own
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--window-size=1500,{height}", f"--virtual-time-budget={budget}", f"--user-data-dir={profile}",
                               f"--screenshot={path}", url],
                              capture_output=True, timeout=180)
    return done.returncode == 0 and path.exists() and path.stat().st_size > 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--mlflow-home", type=Path, help="an embedded MLflow's directory (mlflow.db, artifacts/)")
    src.add_argument("--tracking-uri", help="a running MLflow server")
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"no Chromium at {args.chromium}: apt-get install chromium", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        uri = args.tracking_uri
        if uri is None:
            from scanflow.tracking.server import MlflowServer

            uri = stack.enter_context(MlflowServer(args.mlflow_home)).url
        found = pages(uri)
        taken = 0
        for name, route in found:
            # the model-training view of the UI (a fresh browser profile opens on the GenAI one)
            ok = shoot(args.chromium, f"{uri}/{route}?workflowType=machine_learning", args.out / name)
            taken += ok
            print(f"{'wrote' if ok else 'FAILED'} {args.out / name}  ({route})")
    if not found:
        print("no monitoring run, model or demo run found in this store", file=sys.stderr)
    return 0 if taken else 1


if __name__ == "__main__":
    raise SystemExit(main())
