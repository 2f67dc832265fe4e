"""Which stack a command means when it names none: the one stack under `./.scanflow/` (where `up` keeps
a workflow's stack unless --home says otherwise).

`scanflow status`, `down`, `decisions`, `plans` and `logs` accept --home or --workflow-name; without
either they take the single stack found here, the way `docker compose ps` takes the project of the
current directory. Several live stacks are never guessed between: the error lists them.
Who calls: scanflow.embedded.cli and scanflow.embedded.readcli.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scanflow.embedded.statefile import STATE_FILE, StackState, StateError, is_alive, read_state

STACKS_DIR = ".scanflow"


class NoStackHere(LookupError):
    """No stack, or more than one, under the directory searched; the message says which and what to do."""


@dataclass(frozen=True)
class FoundStack:
    home: Path
    state: StackState
    alive: bool  # the `up` process that wrote it still runs


def stacks_under(root: Path) -> list[FoundStack]:
    """Every readable stack.json one level under root/.scanflow, live ones first, then by name. A
    stack.json that cannot be read is skipped here (the command that reads it by --home says why)."""
    found = []
    for path in sorted((Path(root) / STACKS_DIR).glob(f"*/{STATE_FILE}")):
        try:
            state = read_state(path.parent)
        except StateError:
            continue
        if state is not None:
            found.append(FoundStack(path.parent.resolve(), state, is_alive(state.pid)))
    return sorted(found, key=lambda f: (not f.alive, f.home.name))


def choose(found: list[FoundStack], root: Path) -> FoundStack:
    """Pure: the stack a command without --home means: the only live one, else the only one there is
    (a stale stack.json: `down` sweeps what it left, `status` says it is down); NoStackHere otherwise."""
    live = [f for f in found if f.alive]
    if len(live) == 1:
        return live[0]
    if not live and len(found) == 1:
        return found[0]
    if not found:
        raise NoStackHere(f"no stack under {Path(root).resolve() / STACKS_DIR} (started with `scanflow up` "
                          "here?): give --home DIR or --workflow-name NAME")
    named = ", ".join(f"{f.state.workflow} ({f.home}{'' if f.alive else ', stopped'})" for f in (live or found))
    raise NoStackHere(f"{len(live or found)} stacks here: {named}; say which with --home DIR or --workflow-name NAME")


def find_home(root: Path | None = None) -> Path:
    """The home of the one stack under `root` (default: the current directory); NoStackHere otherwise."""
    base = Path.cwd() if root is None else Path(root)
    return choose(stacks_under(base), base).home
