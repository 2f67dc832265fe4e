"""The embedded default: everything of a workflow on one machine (MLflow, agents, services).

Public API: `EmbeddedStack` (scanflow/embedded/stack.py), `Traffic` (a labelled load generator),
`bootstrap`. `scanflow.stack` re-exports them.
"""

from scanflow.embedded.stack import EmbeddedStack, StackError
from scanflow.embedded.traffic import Answer, Traffic

__all__ = ["Answer", "EmbeddedStack", "StackError", "Traffic"]
