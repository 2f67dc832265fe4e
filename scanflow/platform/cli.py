"""`scanflow deploy`: apply (or print) a workflow on a platform. Owned by the platform area."""

from pathlib import Path

import typer


def deploy(
    workflow: Path = typer.Argument(..., help="workflow file (.py or .yaml)"),
    platform: str = typer.Option("local", help="local | kubernetes"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print manifests instead of applying"),
    namespace: str = typer.Option("scanflow", help="Kubernetes namespace"),
) -> None:
    """Deploy a workflow's services."""
    typer.echo("not implemented yet", err=True)
    raise typer.Exit(2)
