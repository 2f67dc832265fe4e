"""Planner decision policies: pure `decide(ctx) -> (decision, new_state)` functions.

Each module holds one policy; the context carries `now`, the observed metrics, the config and the
typed (frozen) state, and the decision carries `reason` and its `inputs`. The caller (the Planner
agent, a benchmark, a test) owns the clock and applies the decision; state goes back into the next
context, so a restarted Planner resumes with the same hysteresis.

- elastic: vertical-first scaling, cores per replica then replicas, on the Checker's observations
  (S2, S3; the digits workflow's Planner)
- autoscale: replicas on latency vs SLO and queue depth (S2; the horizontal part of elastic)
- hpa: the Kubernetes HPA algorithm, the baseline autoscale must beat
- retrain: retrain on drift, promote challenger vs champion (S1)
- failover: primary <-> backup routing with hysteresis (S4)
- delivery: a challenger's shadow and canary stages judged live (time-uniform non-inferiority on
  labelled rows, errors, p99 against the SLO)
- pinning: whether a `resources` plan pins its replicas to exclusive cores (CPUMEM), opt-in
- tune: replicas x threads x pinning for a machine (S3)
- guardrails: bounds, cold start, hysteresis, cooldown, max step shared by the replica policies
- simulated: what the policies observe in a simulation (windowed, delayed, noisy) and the controllers
  reading it, for benchmarks/scaling.py and scanflow/demo/sim.py (imported from there, not here)
"""

from scanflow.policies import autoscale, delivery, elastic, failover, guardrails, hpa, pinning, retrain, tune
from scanflow.policies.types import Decision, Streak

__all__ = ["Decision", "Streak", "autoscale", "delivery", "elastic", "failover", "guardrails", "hpa", "pinning", "retrain",
           "tune"]
