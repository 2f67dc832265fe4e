"""`scanflow.stack`: the embedded default orchestrator (see scanflow/embedded/stack.py for the details).

    from scanflow.stack import EmbeddedStack, Traffic
"""

from scanflow.embedded import Answer, EmbeddedStack, StackError, Traffic

__all__ = ["Answer", "EmbeddedStack", "StackError", "Traffic"]
