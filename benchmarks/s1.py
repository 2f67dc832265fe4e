"""S1 benchmark: drift onset -> new champion serving, on the embedded stack (real processes).

    .venv/bin/python benchmarks/s1.py --quick [--workflow digits|<name>]

Any shipped example workflow with an `s1` module (`traffic_pools()`, `unseen_test()`): digits (S1's "new
scanner", workflows/digits/s1.py) or the tabular one. Labels reach the agents only as feedback: the load
posts the true label of 20 % of the answered requests to the Tracker's /feedback, 2 s later.
Figures: s1_seconds (drift onset -> first answer from the new champion; target < 60 s on 2 cores; with
--delivery the first answer by the challenger in its canary stage, and promotion_seconds beside it);
accuracy_gap_points (target <= 2) = the old champion's accuracy on the clean test split minus the new
champion's accuracy on a freshly corrupted copy of it: digits no training, traffic or promotion gate
ever held, so it says whether the new champion learned the drift, not whether it memorised rows;
traffic_gap_points beside it = old champion on clean traffic minus new champion on drifted traffic
after the swap (flattered: the traffic replays 8 corrupted copies of 180 digits, and the new champion
trained on critical points drawn from them); failed requests over the whole run. The baseline: the
old champion's accuracy on drifted traffic before the swap (what a system without the loop would
keep serving). With --runs N the medians are quoted. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in the figures
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from verdict import add_check, exit_code


def s1_module(workflow: str) -> Any:
    import importlib

    return importlib.import_module(f"workflows.{workflow}.s1")


def workflow_of(name: str) -> Any:
    import importlib

    return importlib.import_module(f"workflows.{name}.workflow").workflow


def executor_phases(store: Path, onset: float) -> dict[str, float]:
    """Where the seconds went: the retrain plan's arrival after onset (gathering critical points) and each
    S1 actuator's duration, from the Executor's action records (its SQLite store, read only)."""
    import sqlite3

    out: dict[str, float] = {}
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT actuator, started_at, finished_at FROM actions WHERE status = 'succeeded' "
                          "ORDER BY started_at").fetchall()
    for name, t0, t1 in rows:
        if name in ("retrain", "evaluate_and_promote", "swap_model") and f"{name}_s" not in out:
            if name == "retrain":
                out["plan_arrived_s"] = float(t0) - onset
            out[f"{name}_s"] = float(t1) - float(t0)
    return out


def unseen_accuracy(workflow: str, model: str, task: str, old: str | None, new: str) -> dict[str, float]:
    """Both champions on digits neither saw in any form: the clean test split and a freshly corrupted copy.

    Why: the drifted traffic replays a fixed pool (8 corrupted copies of the 180 traffic digits), and the
    new champion trained on critical points drawn from that very pool, so its accuracy on drifted
    traffic partly measures memorised rows. accuracy_gap_points (old champion clean - new champion
    drifted, unseen digits) says whether it learned the drift; unseen_gap_points is the new champion's
    own clean - drifted."""
    from scanflow.policies.retrain import score
    from scanflow.serving.model import load_model

    x_c, x_d, y = s1_module(workflow).unseen_test()
    out: dict[str, float] = {}
    for tag, version in (("old", old), ("new", new)):
        if version is None:
            continue
        m = load_model(f"models:/{model}/{version}")
        out[f"unseen_clean_{tag}"] = score(task, y, m.predict(np.ascontiguousarray(x_c, np.float32))[0])
        out[f"unseen_drifted_{tag}"] = score(task, y, m.predict(np.ascontiguousarray(x_d, np.float32))[0])
    if "unseen_clean_new" in out:
        out["unseen_gap_points"] = 100.0 * (out["unseen_clean_new"] - out["unseen_drifted_new"])
        if "unseen_clean_old" in out:
            out["accuracy_gap_points"] = 100.0 * (out["unseen_clean_old"] - out["unseen_drifted_new"])
    return out


def one_run(home: Path, quick: bool, rate: float, name: str = "digits", feedback: float = 0.2,
            delivery: bool = False) -> dict[str, float]:
    import mlflow

    from scanflow.agentkit.env import primary_service
    from scanflow.spec import Delivery
    from scanflow.stack import EmbeddedStack, Traffic
    from scanflow.tracking.reference import reference_for_version
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    workflow = workflow_of(name)
    model = str(workflow.jobs[0].params.get("model_name", workflow.name))
    agents = [a.model_copy(update={"strategies": [s for s in a.strategies if s.name != "autoscale"]})
              if a.role == "planner" else a for a in workflow.agents]
    wf = workflow.model_copy(update={"agents": agents})
    if delivery:  # the primary service through shadow and canary (benchmarks/canary.py's quick stages)
        from canary import QUICK_STAGES

        staged = Delivery.model_validate({"mode": "progressive", "stages": QUICK_STAGES})
        primary = primary_service(wf).name
        wf = wf.model_copy(update={"services": [sv.model_copy(update={"delivery": staged}) if sv.name == primary else sv
                                                for sv in wf.services]})
    p = s1_module(name).traffic_pools()
    with EmbeddedStack(home, wf, quick=quick) as stack:
        mlflow.set_tracking_uri(stack.tracking_uri)
        old = get_alias_version(model, CHAMPION)
        task = reference_for_version(model, str(old)).schema.task
        with Traffic(stack.service_url, p["clean"], p["drifted"], rate=rate, clients=3,
                     tracker_url=stack.agent_urls["tracker"], token=stack.token, feedback_fraction=feedback) as t:
            t0 = time.time()
            while t.count() < rate * 5 and time.time() - t0 < 60:
                time.sleep(0.2)
            onset = time.time()
            t.drifted = True
            new, promoted, limit = None, None, 480 if delivery else 240
            deadline = onset + limit
            while time.time() < deadline:
                cur = get_alias_version(model, CHAMPION)
                if cur != old and promoted is None:
                    promoted = time.time()
                if cur != old and any(a.version == cur for a in t.snapshot()[-10:]):
                    new = cur
                    break
                time.sleep(0.5)
            if new is None or promoted is None:
                raise SystemExit(f"no new champion served within {limit} s of the drift onset")
            served = min(a.t for a in t.snapshot() if a.version == new)
            after = time.time()
            while t.count(since=after) < rate * 5 and time.time() - after < 60:
                time.sleep(0.2)
        clean_old = t.accuracy(drifted=False, version=old)
        drifted_old = t.accuracy(since=onset, drifted=True, version=old)
        drifted_new = t.accuracy(since=after, drifted=True, version=new)
        phases = executor_phases(stack.agent_home("executor") / "executor.db", onset)
        unseen = unseen_accuracy(name, model, task, old, new)
        staged_figures = {"promotion_seconds": promoted - onset} if delivery else {}
        return {"s1_seconds": served - onset, **staged_figures, **phases, **unseen, "accuracy_clean_old": clean_old,
                "accuracy_drifted_old": drifted_old, "accuracy_drifted_new": drifted_new,
                "traffic_gap_points": 100.0 * (clean_old - drifted_new),
                "failed_requests": float(len(t.failed())), "requests": float(t.count())}


def main() -> int:
    from scanflow.platform.children import stop_children_on_exit

    stop_children_on_exit()  # its servers stop on any exit: exception, Ctrl-C, SIGTERM, SIGHUP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small windows and sizes (under a minute of S1)")
    ap.add_argument("--runs", type=int, default=1)
    add_check(ap)
    ap.add_argument("--workflow", default="digits", help="a shipped example with an s1 module (digits, ...)")
    ap.add_argument("--feedback", type=float, default=0.2, help="share of answered requests whose label is sent")
    ap.add_argument("--delivery", action="store_true",
                    help="the primary service with `delivery: progressive` (shadow, then a 20 %% canary): s1_seconds "
                         "is then the first answer by the challenger, promotion_seconds its promotion")
    ap.add_argument("--rate", type=float, default=150.0,
                    help="requests per second (critical points gather in proportion: 400 in ~8 s at 150)")
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="scanflow-s1-") as tmp:
            r = one_run(Path(tmp), args.quick, args.rate, args.workflow, args.feedback, args.delivery)
        runs.append(r)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    med = {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]}
    print(f"\nS1 over {len(runs)} run(s), medians:")
    print(f"  drift onset -> new champion serving : {med['s1_seconds']:.1f} s (target < 60 s)")
    print(f"  {'':34s}   old champion (baseline)   new champion (Scanflow loop)")
    print(f"  accuracy on drifted traffic        : {med['accuracy_drifted_old']:.3f}                     "
          f"{med['accuracy_drifted_new']:.3f}")
    print(f"  accuracy on clean traffic (old)    : {med['accuracy_clean_old']:.3f}")
    print(f"  traffic gap clean(old) - drifted(new): {med['traffic_gap_points']:.1f} points (replayed rows, "
          "partly trained on)")
    print(f"  failed requests                    : {med['failed_requests']:.0f} of {med['requests']:.0f}")
    print("  phases after onset: " + ", ".join(f"{k} {med[k]:.1f}" for k in
                                               ("plan_arrived_s", "retrain_s", "evaluate_and_promote_s", "swap_model_s")
                                               if k in med))
    if "unseen_gap_points" in med:
        print(f"  unseen test digits (clean / drifted): old {med.get('unseen_clean_old', float('nan')):.3f} / "
              f"{med.get('unseen_drifted_old', float('nan')):.3f}, new {med['unseen_clean_new']:.3f} / "
              f"{med['unseen_drifted_new']:.3f}")
        print(f"  accuracy_gap_points clean(old) - drifted(new), unseen digits: "
              f"{med.get('accuracy_gap_points', float('nan')):.1f} points (target <= 2); "
              f"new champion's own clean - drifted {med['unseen_gap_points']:.1f}")
    gap = med.get("accuracy_gap_points", float("nan"))
    figures = {"workflow": args.workflow, "feedback_fraction": args.feedback,
                      "s1_seconds": round(med["s1_seconds"], 2),
                      "accuracy_gap_points": round(med.get("accuracy_gap_points", float("nan")), 2),
                      "traffic_gap_points": round(med["traffic_gap_points"], 2),
                      "failed_requests": int(med["failed_requests"]),
                      "accuracy_drifted_old": round(med["accuracy_drifted_old"], 4),
                      "accuracy_drifted_new": round(med["accuracy_drifted_new"], 4),
                      "accuracy_clean_old": round(med["accuracy_clean_old"], 4),
                      "unseen_gap_points": round(med.get("unseen_gap_points", float("nan")), 2),
                      "rate": args.rate, "runs": len(runs), "delivery": "progressive" if args.delivery else "none",
                      **({"promotion_seconds": round(med["promotion_seconds"], 2)} if args.delivery else {}),
                      # the targets: S1 under 60 s, the new champion within 2 points on unseen drifted rows, no loss
                      "target_met": bool(med["s1_seconds"] < 60.0 and math.isfinite(gap) and gap <= 2.0
                                         and int(med["failed_requests"]) == 0)}
    print(json.dumps(figures))
    return exit_code(figures, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
