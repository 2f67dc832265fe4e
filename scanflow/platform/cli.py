"""`scanflow deploy WORKFLOW`: apply (or print) a workflow's services on a platform.

Owned by the platform area. `--platform kubernetes --dry-run` prints the manifests generated from the
spec (scanflow.platform.manifests) as YAML, ready for `kubectl apply -f -`; without --dry-run they are
applied through KubernetesPlatform (kubeconfig or in-cluster config). `--platform local` deploys on
this machine through scanflow.platform.local.LocalPlatform and keeps the services up until Ctrl-C.
Heavy imports (kubernetes, yaml dumping of big objects) stay inside the command so `--help` is fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

_WORKFLOW = typer.Argument(..., help="workflow file (.py or .yaml)")
_PLATFORM = typer.Option("local", help="local | kubernetes")
_DRY_RUN = typer.Option(False, "--dry-run", help="print manifests (kubernetes) or the spec (local), apply nothing")
_NAMESPACE = typer.Option("scanflow", help="Kubernetes namespace")
_IMAGE = typer.Option(None, help="container image (default: scanflow:<version>)")
_CONTEXT = typer.Option(None, help="kubeconfig context (outside a cluster)")
_WAIT = typer.Option(180.0, help="seconds to wait for readiness (0: do not wait)")


def deploy(
    workflow: Path = _WORKFLOW,
    platform: str = _PLATFORM,
    dry_run: bool = _DRY_RUN,
    namespace: str = _NAMESPACE,
    image: str | None = _IMAGE,
    context: str | None = _CONTEXT,
    wait: float = _WAIT,
) -> None:
    """Deploy a workflow's services."""
    from scanflow.spec import SpecError, load_workflow

    try:
        wf = load_workflow(workflow)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if platform == "kubernetes":
        _deploy_kubernetes(wf, dry_run=dry_run, namespace=namespace, image=image, context=context, wait=wait)
    elif platform == "local":
        _deploy_local(wf, dry_run=dry_run)
    else:
        typer.echo(f"--platform {platform!r}: use 'local' or 'kubernetes'", err=True)
        raise typer.Exit(2)


def _deploy_kubernetes(wf, *, dry_run: bool, namespace: str, image: str | None, context: str | None,  # type: ignore[no-untyped-def]
                       wait: float) -> None:
    import yaml

    from scanflow.platform import manifests as mf
    from scanflow.platform.base import PlatformError

    image = image or mf.DEFAULT_IMAGE
    if dry_run:
        docs = mf.workflow_manifests(wf, namespace=namespace, image=image)
        typer.echo(yaml.safe_dump_all(docs, sort_keys=False), nl=False)
        return
    from scanflow.platform.kubernetes import KubernetesPlatform

    try:
        plat = KubernetesPlatform.from_config(context=context, namespace=namespace, image=image,
                                              workflow=wf.name, tracking_uri=wf.tracking_uri,
                                              ready_timeout_s=wait)
    except Exception as exc:  # noqa: BLE001  # no kubeconfig / bad context: say so, no traceback
        typer.echo(f"cannot load a Kubernetes configuration: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        for svc in wf.services:
            st = plat.deploy(svc)
            typer.echo(f"{svc.name}: {st.ready_replicas}/{st.desired_replicas} ready at {st.endpoint}"
                       + "".join(f"\n  note: {n}" for n in st.notes))
    except PlatformError as exc:
        typer.echo(f"deploy failed: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        plat.close()


def _deploy_local(wf, *, dry_run: bool) -> None:  # type: ignore[no-untyped-def]
    if dry_run:
        typer.echo(wf.to_yaml(), nl=False)
        return
    try:
        from scanflow.platform.local import LocalPlatform
    except ImportError as exc:
        typer.echo(f"the local platform is not available ({exc}); use --platform kubernetes", err=True)
        raise typer.Exit(2) from None
    import signal
    import threading

    from scanflow.settings import Settings
    from scanflow.tracking.server import ensure_tracking

    settings = Settings()
    if wf.tracking_uri and not settings.tracking_uri:
        settings = settings.model_copy(update={"tracking_uri": wf.tracking_uri})
    token = settings.token.get_secret_value() if settings.token else None
    plat = LocalPlatform(home=settings.home / "platform", tracking_uri=ensure_tracking(settings), token=token)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for svc in wf.services:
            st = plat.deploy(svc)
            typer.echo(f"{svc.name}: {st.ready_replicas}/{st.desired_replicas} ready at {st.endpoint}")
        typer.echo("serving; Ctrl-C to stop", err=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        plat.close()
