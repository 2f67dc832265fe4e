"""What an agent process learns from its environment and its workflow: sizes, windows, the watched service.

The workflow itself is not read here: `scanflow agent run` loads the file SCANFLOW_WORKFLOW (or
--workflow) names and binds the agent to it at start (Agent.bound), and handlers read it as
`ctx.workflow` / `ctx.spec`. The helpers below are pure over a workflow or an AgentSpec. Where things
are (peers, services, the Tracker) comes from scanflow.settings (SCANFLOW_PEERS, SCANFLOW_SERVICE_URLS,
SCANFLOW_TRACKER_URL). Who calls: scanflow/standard/*.py, the embedded stack (it sets both variables).
"""

from __future__ import annotations

import os

from scanflow.spec import AgentSpec, Service, Workflow

WORKFLOW_ENV = "SCANFLOW_WORKFLOW"
QUICK_ENV = "SCANFLOW_QUICK"


def quick() -> bool:
    """Small sizes for tests, benchmarks and the demo (fewer epochs, smaller windows)."""
    return os.environ.get(QUICK_ENV, "").lower() in ("1", "true", "yes")


DRIFT_WINDOW, QUICK_DRIFT_WINDOW = 500, 200  # rows per drift check when the Tracker's settings name none


def drift_window(tracker: AgentSpec, quick: bool) -> int:
    """Rows per drift check: the Tracker's `quick_window` (quick) or `window` setting. Who calls: the Tracker
    (when to announce a window) and the Checker (it validates this against its detector's min_window)."""
    return int(tracker.settings.get("quick_window" if quick else "window", QUICK_DRIFT_WINDOW if quick else DRIFT_WINDOW))


def primary_service(wf: Workflow) -> Service:
    """The service the agents watch: the one the Tracker's `service` setting names, else the first one
    that names a backup, else the first one."""
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
