"""What an agent process of the embedded stack learns from its environment: the workflow and its peers.

The stack (scanflow/embedded/stack.py) writes the workflow it runs, with every service's gateway
port fixed, to a YAML file and names it in SCANFLOW_WORKFLOW; each agent reads it at import time to
add its declared strategies and settings. Where things are (peers, services, the Tracker) comes from
scanflow.settings (SCANFLOW_PEERS, SCANFLOW_SERVICE_URLS, SCANFLOW_TRACKER_URL), never from here. Without the variable an
agent cannot know its workflow: run one by hand with SCANFLOW_WORKFLOW=path/to/workflow.py (or .yaml).
Who calls: scanflow/standard/*.py.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from scanflow.spec import AgentSpec, Service, Workflow

WORKFLOW_ENV = "SCANFLOW_WORKFLOW"
QUICK_ENV = "SCANFLOW_QUICK"


@lru_cache(maxsize=1)
def current_workflow() -> Workflow:
    """The workflow named by SCANFLOW_WORKFLOW (YAML or .py); LookupError saying so when it is not set."""
    from scanflow.spec import load_workflow

    path = os.environ.get(WORKFLOW_ENV)
    if not path:
        raise LookupError(f"{WORKFLOW_ENV} is not set: point it at the workflow file (.py or .yaml) these agents "
                          "supervise (scanflow up and the embedded stack set it)")
    return load_workflow(path)


def quick() -> bool:
    """Small sizes for tests, benchmarks and the demo (fewer epochs, smaller windows)."""
    return os.environ.get(QUICK_ENV, "").lower() in ("1", "true", "yes")


def agent_spec(role: str) -> AgentSpec:
    """The workflow's AgentSpec with this role (or name); a clear error naming what exists."""
    wf = current_workflow()
    for a in wf.agents:
        if a.role == role or a.name == role:
            return a
    raise LookupError(f"workflow {wf.name!r} declares no agent with role {role!r} "
                      f"(has {[a.name for a in wf.agents]})")


DRIFT_WINDOW, QUICK_DRIFT_WINDOW = 500, 200  # rows per drift check when the Tracker's settings name none


def drift_window(tracker: AgentSpec, quick: bool) -> int:
    """Rows per drift check: the Tracker's `quick_window` (quick) or `window` setting. Who calls: the Tracker
    (when to announce a window) and the Checker (it validates this against its detector's min_window)."""
    return int(tracker.settings.get("quick_window" if quick else "window", QUICK_DRIFT_WINDOW if quick else DRIFT_WINDOW))


def primary_service(wf: Workflow | None = None) -> Service:
    """The service the agents watch: the one the Tracker's `service` setting names, else the first one
    that names a backup, else the first one."""
    wf = wf or current_workflow()
    if not wf.services:
        raise LookupError(f"workflow {wf.name!r} has no service")
    tracker = next((a for a in wf.agents if a.role == "tracker"), None)
    named = (tracker.settings if tracker else {}).get("service")
    if named:
        found = next((s for s in wf.services if s.name == named), None)
        if found is None:
            raise LookupError(f"agents.{tracker.name if tracker else 'tracker'}.settings.service = {named!r}: "
                              f"not a service of workflow {wf.name!r} ({[s.name for s in wf.services]})")
        return found
    return next((s for s in wf.services if s.backup), wf.services[0])


def service_url(service: Service) -> str:
    """The endpoint (gateway) of a service, from configuration: SCANFLOW_SERVICE_URLS (or the
    `service_urls` of the SCANFLOW_CONFIG file). Never built from a port: in a pod or a container
    127.0.0.1 is the agent itself. Kubernetes manifests and docker-compose.yml name the gateway's
    Service; the embedded stack names its loopback ports (EmbeddedStack.service_urls)."""
    from scanflow.settings import Settings

    urls = Settings().service_urls
    if service.name not in urls:
        raise LookupError(f"service {service.name!r} has no endpoint: set SCANFLOW_SERVICE_URLS="
                          f"'{service.name}=http://HOST:PORT' (configured: {sorted(urls)})")
    return urls[service.name]


def loopback_url(service: Service) -> str:
    """The gateway endpoint of a service whose port the embedded stack fixed (this machine only)."""
    if service.port is None:
        raise LookupError(f"service {service.name!r} has no fixed port; run it through EmbeddedStack")
    return f"http://127.0.0.1:{service.port}"


def settings_of(role: str) -> dict[str, Any]:
    return dict(agent_spec(role).settings)
