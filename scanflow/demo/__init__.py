"""`scanflow demo`: the autonomic scenarios S1-S4 on the embedded default (see runner.py).

    from scanflow.demo import run_demo
    ok = run_demo(json_output=False, quick=True, home=Path(".scanflow/demo"))

Modules: runner (orchestration, table, MLflow), report (results, bars, JSON), load (load generator),
sim (Planner vs HPA simulation), s1_drift, s2_autoscale, s3_tune, s4_failover, common.
"""

from scanflow.demo.runner import run_demo

__all__ = ["run_demo"]
