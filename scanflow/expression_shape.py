"""Pure measures of a parsed constraint's shape, for the static cost model of scanflow.expressions:
how deep it nests, the value of a number literal, how long a sequence its form alone says it builds,
and how high a chain of powers raises its base. No names, no evaluation: the AST only.
"""

from __future__ import annotations

import ast
import math


def depth(tree: ast.AST) -> int:
    """Pure: the nesting depth of a tree (iterative: a 1990-deep `-----1` must not recurse here)."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def literal_number(node: ast.AST) -> int | float | None:
    """Pure: the value of a number literal, `-3` included; None for anything else (bools too)."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign = -1 if isinstance(node.op, ast.USub) else 1
        node = node.operand
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return sign * node.value
    return None


def static_len(node: ast.AST) -> int | None:
    """Pure: items/characters of a value known to be a string, list or tuple from its form alone
    (literals, their sums and repetitions; nested items counted), or None when the form does not
    say (a name, a call, a number). The static half of MAX_SEQUENCE."""
    if isinstance(node, ast.Constant):
        return len(node.value) if isinstance(node.value, (str, bytes)) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        return sum(1 + (static_len(e) or 0) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = static_len(node.left), static_len(node.right)
        if left is None and right is None:
            return None
        if isinstance(node.op, ast.Add):
            return (left or 0) + (right or 0)
        seq, factor = (left, node.right) if left is not None else (right, node.left)
        n = literal_number(factor)
        return (seq or 0) * int(n) if isinstance(n, int) and n > 0 else seq
    if isinstance(node, ast.IfExp):
        lens = [x for x in (static_len(node.body), static_len(node.orelse)) if x is not None]
        return max(lens) if lens else None
    return None


def power_degree(node: ast.AST) -> float:
    """Pure: how many times a power chain multiplies its base's size at most: `x ** 3` is 3,
    `(x ** 2 * x) ** 2` is 6, `((9 ** 64) ** 64)` is 4096. Numbers and names are 1."""
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            e = literal_number(node.right)
            return power_degree(node.left) * max(1.0, abs(e) if e is not None else math.inf)
        left, right = power_degree(node.left), power_degree(node.right)
        return left + right if isinstance(node.op, ast.Mult) else max(left, right)
    if isinstance(node, ast.UnaryOp):
        return power_degree(node.operand)
    return 1.0
