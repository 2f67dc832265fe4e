"""`scanflow serve replica|gateway`: the same processes as `python -m scanflow.serving.replica|gateway`.

Each command's typer options are made from the module's own flag definitions
(scanflow.serving.cliargs: `replica_parser`, `gateway_parser`): the same names, types, defaults, choices
and help, so the platforms' command lines (`python -m ...`) and the CLI cannot drift apart, and `--help`
looks like the rest of the CLI. The options typer parsed go back to the module's `main()` as a command
line, where the env defaults and the checks of its `parse_args` apply, as for `python -m`.

Who calls: scanflow.cli (the `serve` group). The servers' heavy imports happen inside the commands.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer

from scanflow.serving.cliargs import gateway_parser, replica_parser

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@dataclass(frozen=True)
class Flag:
    """One argparse option, as the CLI needs it: its dest, its long name, and how it takes values."""

    dest: str
    name: str
    kind: Literal["switch", "repeat", "value"]  # store_true, append, one value
    default: Any
    annotation: Any
    help: str


def flags_of(parser: argparse.ArgumentParser) -> list[Flag]:
    """The parser's options as Flags. Pure. An option of a form not handled here (positional, nargs,
    store_false, count) raises, so a new flag in cliargs cannot silently go missing from the CLI."""
    out = []
    for action in parser._actions:  # argparse keeps its options here; there is no public listing
        if isinstance(action, argparse._HelpAction):
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs:
            raise TypeError(f"{action.dest}: only --long options are handled (got {action.option_strings})")
        helptext = action.help or ""
        if isinstance(action, argparse._StoreTrueAction):
            out.append(Flag(action.dest, longs[0], "switch", False, bool, helptext))
        elif isinstance(action, argparse._AppendAction) and action.nargs is None and action.type is None:
            out.append(Flag(action.dest, longs[0], "repeat", None, list[str] | None, helptext))
        elif type(action) is argparse._StoreAction and action.nargs is None:
            base: Any = action.type or str
            if action.choices is not None:
                base = Literal[tuple(action.choices)]  # typer lists them in --help and refuses others
            annotation = base | None if action.default is None else base
            out.append(Flag(action.dest, longs[0], "value", action.default, annotation, helptext))
        else:
            raise TypeError(f"{action.dest}: {type(action).__name__} (nargs={action.nargs}) is not handled")
    return out


def argv_of(flags: list[Flag], values: dict[str, Any]) -> list[str]:
    """Pure: the command line that gives the module's parser these values. Values equal to the
    parser's default are left out (the parser then applies its env defaults, as with `python -m`)."""
    argv: list[str] = []
    for f in flags:
        value = values.get(f.dest)
        if f.kind == "switch":
            argv += [f.name] if value else []
        elif f.kind == "repeat":
            for item in value or []:
                argv += [f.name, str(item)]
        elif value is not None and value != f.default:
            argv += [f.name, str(value)]
    return argv


def _command(name: str, parser: Callable[[], argparse.ArgumentParser], module: str) -> None:
    """Register `scanflow serve <name>`: typer options from `parser()`, running `module.main`."""
    flags = flags_of(parser())
    prog = f"scanflow serve {name}"

    def command(**values: Any) -> None:
        importlib.import_module(module).main(argv_of(flags, values), prog=prog)

    params = [inspect.Parameter(f.dest, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=Annotated[f.annotation, typer.Option(f.name, help=f.help)])
              for f in flags]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
    command.__annotations__ = {p.name: p.annotation for p in params}
    description = parser().description or ""
    app.command(name, help=f"{description} Flags left out take their env defaults (SCANFLOW_...), as with "
                           f"`python -m {module}`.")(command)


_command("replica", replica_parser, "scanflow.serving.replica")
_command("gateway", gateway_parser, "scanflow.serving.gateway")
