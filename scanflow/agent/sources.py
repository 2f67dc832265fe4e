"""Where an agent's code is: a Python file, or a module reference ('package.module:attr').

Workflows name agent code as a module reference (`AgentSpec.module`, e.g. the standard agents'
'scanflow.standard.planner:agent'), which works wherever the package is installed: in a container
image the code lives in site-packages, not at a path a manifest could spell. The reference is turned
into its source file with importlib's finder, without importing the module (importing it would run
the agent's module-level code in the caller's process). Who calls: `load_agents` (scanflow.agent.serve,
so `scanflow agent run` takes either form) and the embedded stack (it checks every spec's module
before anything starts).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from scanflow.agent.agent import AgentDefinitionError

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*$")


class AgentModuleError(AgentDefinitionError):
    """An agent module reference is malformed or cannot be found as a Python source file."""


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
        raise AgentModuleError(f"agent module {module!r} cannot be found: {exc}{_moved(module)}") from None
    if spec is None:
        raise AgentModuleError(f"agent module {module!r} cannot be found on the Python path{_moved(module)}")
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        raise AgentModuleError(f"agent module {module!r} has no Python source file (found {origin!r})")
    return Path(origin).resolve()


def _moved(module: str) -> str:
    """A hint for a workflow written before the standard agents moved into the package."""
    head, _, role = module.partition(".")
    if head == "agents" and role in ("tracker", "checker", "planner", "executor"):
        return f" (the standard agents are now scanflow.standard.{role}: write 'scanflow.standard.{role}:agent')"
    return ""


def is_module_ref(source: str | Path) -> bool:
    """Pure: whether `source` reads as a module reference rather than a file path (no path separator,
    no .py suffix, dotted identifiers with an optional ':attr')."""
    text = str(source)
    if "/" in text or "\\" in text or text.endswith(".py"):
        return False
    try:
        split_module_ref(text)
    except AgentModuleError:
        return False
    return True
