"""What an agent process of the embedded stack runs: the AgentSpec's module, else the role's standard file.

An AgentSpec may name its code as `module` ('package.module:attr'); the stack runs it as `python -m
scanflow.cli agent run package.module:attr`, and `agent run` binds the Agent found there to the
workflow (SCANFLOW_WORKFLOW), which names it after the spec. The module's source file is looked up
here first (scanflow.agent.sources, without importing it) so that a wrong module fails before MLflow
starts and the bootstrap trains. A spec without `module` falls back to `<agents_dir>/<role>.py`.
Who calls: scanflow.embedded.stack.EmbeddedStack (at construction).
"""

from __future__ import annotations

from pathlib import Path

from scanflow.agent.sources import module_file
from scanflow.spec import AgentSpec


def agent_target(role: str, spec: AgentSpec | None, agents_dir: Path) -> str:
    """What `agent run` gets for the agent of `role`: the spec's module reference (checked to exist:
    AgentModuleError otherwise), else the file `agents_dir/<role>.py`."""
    if spec is not None and spec.module:
        module_file(spec.module)
        return spec.module
    return str(agents_dir / f"{role}.py")
