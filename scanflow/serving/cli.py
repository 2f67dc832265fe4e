"""`scanflow serve replica|gateway`: the same processes as `python -m scanflow.serving.replica|gateway`.

The options are passed through unchanged to the modules' `main()` (one argument parser each, so the
platforms' command lines and the CLI cannot drift apart). Heavy imports happen inside the commands.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def replica(ctx: typer.Context) -> None:
    """Serve one model: --model-uri URI --port P [--threads N] [--max-batch-size 32] ... (--help for all)."""
    from scanflow.serving.replica import main

    main(list(ctx.args))


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def gateway(ctx: typer.Context) -> None:
    """Balance one service: --port P --service NAME [--replica URL ...] [--backup URL] (--help for all)."""
    from scanflow.serving.gateway import main

    main(list(ctx.args))
