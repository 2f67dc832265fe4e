"""Which file an agent process of the embedded stack runs, and under which agent name.

An AgentSpec may name its code as `module` ('package.module:attr'). The stack runs every agent as
`python -m scanflow.cli agent run FILE --name NAME`, so the module is turned into its source file
here, with importlib's finder and without importing the module itself (importing it would run the
agent's module-level code, e.g. reading the workflow, in the stack's own process). `agent run --name`
picks the Agent object whose name is NAME, so the AgentSpec's name is passed, not the attribute.
A spec without `module` falls back to `<agents_dir>/<role>.py`, as before.
Who calls: scanflow.embedded.stack.EmbeddedStack (at construction, so a wrong module fails before
MLflow starts and the bootstrap trains).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from scanflow.spec import AgentSpec

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*$")


class AgentModuleError(ValueError):
    """An AgentSpec's `module` is malformed or cannot be found as a Python source file."""


def split_module_ref(ref: str) -> tuple[str, str | None]:
    """Pure: 'package.module:attr' -> ('package.module', 'attr'); 'package.module' -> (..., None).

    Raises AgentModuleError naming the value when it is not a dotted module path (with an optional
    ':attr' that is an identifier).
    """
    module, sep, attr = ref.strip().partition(":")
    if not _DOTTED.match(module) or (sep and not _ATTR.match(attr)):
        raise AgentModuleError(f"agent module {ref!r} must look like 'package.module:attr'")
    return module, (attr if sep else None)


def module_file(ref: str) -> Path:
    """The source file of the module in `ref` ('package.module:attr'), found without importing it.

    importlib.util.find_spec imports the parent packages (their __init__), not the module. Raises
    AgentModuleError when the module (or a parent package) is missing or has no .py source.
    """
    module, _attr = split_module_ref(ref)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:  # a parent package is missing or broken
        raise AgentModuleError(f"agent module {module!r} cannot be found: {exc}") from None
    if spec is None:
        raise AgentModuleError(f"agent module {module!r} cannot be found on the Python path")
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        raise AgentModuleError(f"agent module {module!r} has no Python source file (found {origin!r})")
    return Path(origin).resolve()


def agent_target(role: str, spec: AgentSpec | None, agents_dir: Path) -> tuple[Path, str | None]:
    """(file to run, --name to pass or None) for the agent of `role`.

    With `spec.module`: its source file and the spec's name. Otherwise `agents_dir/<role>.py` and no
    name (the reference files define one Agent each).
    """
    if spec is not None and spec.module:
        return module_file(spec.module), spec.name
    return agents_dir / f"{role}.py", None
