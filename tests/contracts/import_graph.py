"""Pure (over source files): the import graph of Python packages, and its cycles.

Every `import` and `from ... import` counts, at module level or inside a function (a function-level
import still runs, and hiding one in a function is how a cycle usually survives); only imports under
`if TYPE_CHECKING:` are left out (annotations that name each other's types never run). `from pkg import
sub` is an edge to `pkg.sub` when that is a module, else to `pkg`. Edges to modules outside the roots
are dropped. No import is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path


def modules(base: Path, roots: Iterable[str], installed_as: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under each root package in `base`. `installed_as`
    names a folder by the package it installs as (pyproject.toml maps workflows/ to scanflow.examples),
    so the graph has the names the imports use."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            head, _, rest = name.partition(".")
            mapped = (installed_as or {}).get(head)
            found[f"{mapped}.{rest}".rstrip(".") if mapped else name] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return subs if len(subs) == len(node.names) else [base, *subs]


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules (among `found`) it imports at run time."""
    graph: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            for target in _targets(module, path.name == "__init__.py", node, found):
                while target and target not in found:  # `import a.b.c` names a.b.c, or an attribute of a.b
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out
