"""The Prometheus metrics of one agent (events, decisions, action outcomes, handler latency, queue depth),
in a registry of its own that GET /metrics serves.

Separate from scanflow.agent.runtime, which only increments them: the metric names are a contract with
the dashboards (tests/contracts/test_dashboard.py reads them from here), and building the registry needs
none of the loop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scanflow.tracking.latest import LATEST


class Metrics:
    """Prometheus metrics of one agent, in their own registry (several agents may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events_received = Counter(
            "scanflow_agent_events_received",
            "events accepted into the inbox",
            ["duplicate"],
            registry=self.registry,
        )
        self.events_processed = Counter(
            "scanflow_agent_events_processed", "events fully processed", registry=self.registry
        )
        self.decisions = Counter(
            "scanflow_agent_decisions", "strategy decisions", ["result"], registry=self.registry
        )
        self.actions = Counter(
            "scanflow_agent_action_outcomes", "action outcomes", ["status"], registry=self.registry
        )
        self.handler_seconds = Histogram(
            "scanflow_agent_handler_seconds",
            "handler latency",
            ["kind", "name"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.queue_depth = Gauge("scanflow_agent_queue_depth", "pending events", registry=self.registry)
        # drift, latency-vs-SLO, replica and decision values the agent wrote to its monitoring runs
        self.registry.register(LATEST)
