"""Which file an agent process of the embedded stack runs, and under which agent name.

An AgentSpec may name its code as `module` ('package.module:attr'). The stack runs every agent as
`python -m scanflow.cli agent run FILE --name NAME`, so the module is turned into its source file
first (scanflow.agent.sources, without importing the module). `agent run --name`
picks the Agent object whose name is NAME, so the AgentSpec's name is passed, not the attribute.
A spec without `module` falls back to `<agents_dir>/<role>.py`, as before.
Who calls: scanflow.embedded.stack.EmbeddedStack (at construction, so a wrong module fails before
MLflow starts and the bootstrap trains).
"""

from __future__ import annotations

from pathlib import Path

from scanflow.agent.sources import module_file
from scanflow.spec import AgentSpec


def agent_target(role: str, spec: AgentSpec | None, agents_dir: Path) -> tuple[Path, str | None]:
    """(file to run, --name to pass or None) for the agent of `role`.

    With `spec.module`: its source file and the spec's name. Otherwise `agents_dir/<role>.py` and no
    name (the reference files define one Agent each).
    """
    if spec is not None and spec.module:
        return module_file(spec.module), spec.name
    return agents_dir / f"{role}.py", None
