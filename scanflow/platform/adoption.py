"""Adoption: the spec a (re)started Executor deploys for a service that already runs (pure).

Why: the Executor deploys its workflow's services at start-up. Deploying the declaration as written
would undo what the loop decided since (a scale-out, a resize, a promoted model, an image an operator
rolled), every time the Executor restarts. So for the fields actuations change, what runs wins; the
declaration keeps the rest (backup, SLO, batching). Same rule on every platform: LocalPlatform and
KubernetesPlatform both answer `services()` with what runs now.
Who calls: scanflow/standard/executor.py (start_platform), tests.
"""

from __future__ import annotations

from scanflow.spec import Service

ADOPTED_FIELDS = ("replicas", "model_uri", "image", "resources", "affinity", "threads")


def adopt_running(declared: Service, running: Service | None) -> Service:
    """The spec to deploy: `running`'s replicas, model, image, resources, affinity policy and threads,
    the declaration for everything else; the declaration itself when nothing runs.
    Placement (node selector, spread) stays declared: only the affinity policy is an actuation."""
    if running is None:
        return declared
    # all of them, None included (threads None = "follow the CPU limit" is a state too), as they run
    update = {k: getattr(running, k) for k in ADOPTED_FIELDS}
    update["affinity"] = declared.affinity.model_copy(update={"policy": running.affinity.policy})
    # what runs may sit outside the declared bounds (an operator scaled by hand)
    update["min_replicas"] = min(declared.min_replicas, running.replicas)
    update["max_replicas"] = max(declared.max_replicas, running.replicas)
    return declared.model_copy(update=update)


def at_configured_port(service: Service, urls: dict[str, str]) -> Service:
    """The service with its gateway port taken from its configured endpoint (SCANFLOW_SERVICE_URLS),
    when the declaration fixes none: on the local platform in a container (docker-compose) the
    Executor must serve each service where the configuration tells the Checker and the clients it
    is. A declared port, or no configured URL, leaves the service as it is."""
    from urllib.parse import urlsplit

    if service.port is not None or service.name not in urls:
        return service
    port = urlsplit(urls[service.name]).port
    return service if port is None else service.model_copy(update={"port": port})
