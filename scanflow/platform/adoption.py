"""Adoption: the spec a (re)started Executor deploys for a service that already runs (pure).

Why: the Executor deploys its workflow's services at start-up. Deploying the declaration as written
would undo what the loop decided since (a scale-out, a resize, a promoted model, an image an operator
rolled), every time the Executor restarts. So for the fields actuations change, what runs wins; the
declaration keeps the rest (backup, SLO, batching). An image that differs from the configured one is
adopted too, then rolled as a separate, recorded step (`image_upgrades`). Same rule on every platform: LocalPlatform and
KubernetesPlatform both answer `services()` with what runs now.
Who calls: scanflow/standard/executor.py (start_platform), tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ImageUpgrade:
    """A service that runs `running` where the configuration names `configured`."""

    service: str
    running: str
    configured: str


def image_upgrades(declared: Iterable[Service], running: Mapping[str, Service],
                   default_image: str | None) -> list[ImageUpgrade]:
    """Pure: the adopted services whose running image is not the configured one (the service's declared
    image, else `default_image`: the platform's, e.g. the Executor's own). Adoption deploys what runs, so a
    restart changes nothing; an upgrade is then its own step, one the Executor decides and records, not
    a side effect of a restart. A service with no image (local processes) or nothing configured is never
    an upgrade."""
    out = []
    for spec in declared:
        now = running.get(spec.name)
        want = spec.image or default_image
        if now is not None and now.image and want and now.image != want:
            out.append(ImageUpgrade(spec.name, now.image, want))
    return out


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
