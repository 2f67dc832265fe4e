"""The Executor's platform at start-up: open the one configuration names, adopt what runs, deploy.

Everything comes from configuration (scanflow.settings), the same on every platform: the Tracker the
replicas post to (SCANFLOW_TRACKER_URL, else the `tracker` peer), MLflow (MLFLOW_TRACKING_URI).
- local (default): adopt the services a killed predecessor left running (LocalPlatform.adopt), kill its
  other leftovers, run services as local processes;
- kubernetes: in-cluster config, namespace SCANFLOW_NAMESPACE, image SCANFLOW_IMAGE (else its own pod's
  image), KubernetesPlatform.from_settings; the Deployments it owns (managed-by scanflow-executor) are
  read back (KubernetesPlatform.services).
Either way an adopted service is deployed with the settings it runs with now (replicas, model, image,
resources, affinity, threads: what earlier actuations set), so deploying it changes nothing; an image
that is not the configured one is returned as an upgrade for the Executor to decide on.
`reconcile_sizes` is the Executor's sensor that resizes pods started since an in-place resize.
Who calls: scanflow/standard/executor.py (start_platform, its sensor).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scanflow.agent import Context, PermanentError
from scanflow.platform.adoption import ImageUpgrade, adopt_running, at_configured_port, image_upgrades
from scanflow.platform.base import PlatformError
from scanflow.platform.jobruns import jobs_experiment


def open_platform(ctx: Context) -> Any:
    """The platform SCANFLOW_PLATFORM names, opened with what configuration says (see the module doc)."""
    wf = ctx.workflow
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or ctx.settings.tracking_uri
    if not tracking_uri:
        raise PermanentError("MLFLOW_TRACKING_URI (or SCANFLOW_TRACKING_URI) must name the MLflow server")
    tracker_url = ctx.settings.tracker_endpoint() or ctx.peers.get("tracker")
    if ctx.settings.platform == "kubernetes":
        from scanflow.platform.kubernetes import KubernetesPlatform

        try:
            return KubernetesPlatform.from_settings(ctx.settings, workflow=wf.name, tracking_uri=tracking_uri,
                                                    tracker_url=tracker_url)
        except PlatformError as exc:
            raise PermanentError(str(exc)) from None
    from scanflow.platform.local import LocalPlatform

    home = Path(ctx.settings.home).resolve()
    token = ctx.settings.token.get_secret_value() if ctx.settings.token else None
    plat = LocalPlatform(home / "platform", tracking_uri, tracker_url=tracker_url, token=token,
                         experiment=jobs_experiment(wf.name))
    # also kills what the predecessor's platform left and no one adopts (stray replicas, cut jobs)
    adopted = plat.adopt()
    if adopted:
        ctx.log.info("adopted running services: %s", adopted)
    return plat


def deploy_services(ctx: Context, plat: Any) -> list[ImageUpgrade]:
    """Deploy every service of the workflow, an adopted one as it runs; return the adopted services whose
    image is not the configured one (the declared image, else the platform's)."""
    wf = ctx.workflow
    running = plat.services() if hasattr(plat, "services") else {}
    if running:
        ctx.log.info("running services adopted with their current settings: %s", sorted(running))
    services = [adopt_running(s, running.get(s.name)) for s in sorted(wf.services, key=lambda s: s.backup is None)]
    if ctx.settings.platform == "local":  # serve where the configuration says the services are
        services = [at_configured_port(s, ctx.settings.service_urls) for s in services]
    # all at once: a first start (or a service that could not be adopted) waits for its replicas, and
    # one after the other doubled that (the platform wires a backup deployed second)
    with ThreadPoolExecutor(max(1, len(services)), thread_name_prefix="deploy") as pool:
        for f in [pool.submit(plat.deploy, svc) for svc in services]:
            f.result()
    return image_upgrades(wf.services, running, getattr(plat, "image", None))


RECONCILE_S = 10.0  # how often pods started since an in-place resize are brought to their service's size


def reconcile_sizes(ctx: Context) -> None:
    """Kubernetes: a pod started since an in-place resize (a scale-up, a restart) runs its template's
    size, which the resize left alone (changing it would roll the pods just resized); resize such pods
    in place to their service's size (KubernetesPlatform.reconcile_resized). Elsewhere: nothing to do."""
    plat = ctx.resources.get("platform")
    if plat is None or not hasattr(plat, "reconcile_resized"):
        return
    for svc in ctx.workflow.services:
        try:
            asked = plat.reconcile_resized(svc.name)
        except PlatformError as exc:
            ctx.log.warning("service %s: pods not brought to its size: %s", svc.name, exc)
            continue
        if asked:
            ctx.log.info("service %s: resized %s in place to its size", svc.name, ", ".join(asked))
