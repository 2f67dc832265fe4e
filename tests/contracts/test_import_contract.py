"""The framework never knows an example: nothing in scanflow/ imports the shipped examples.

The examples live in workflows/ and install as `scanflow.examples` (pyproject.toml maps the folder), so
that is the name an import would use. A team's workflow is learned from its declaration and from MLflow
(scanflow.tracking.reference); the shipped workflows are examples and test fixtures. Only the demo
(scanflow/demo/), which runs the shipped examples, may import them. Checked on the source, so an import
inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("scanflow/demo/",)
EXAMPLES = "scanflow.examples"
DYNAMIC = {"import_module", "__import__", "load_entrypoint", "find_spec"}


def forbidden_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of `scanflow.examples` in `source`: statements and dynamic imports by name (pure)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == EXAMPLES.rpartition(".")[0]:  # `from scanflow import examples`
                names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in DYNAMIC and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [(node.lineno, n) for n in names if n == EXAMPLES or n.startswith((EXAMPLES + ".", EXAMPLES + ":"))]
    return found


def test_the_checker_sees_every_kind_of_import() -> None:
    src = ("import scanflow.examples.digits\nfrom scanflow.examples.digits.s1 import gate_data\nimport os\n"
           "def f():\n    import importlib\n    importlib.import_module('scanflow.examples.tabular')\n"
           "    load_entrypoint('scanflow.examples.digits.train:train')\nfrom scanflow import examples_helper\n"
           "from scanflow import examples\n")
    assert [m for _, m in forbidden_imports(src)] == [
        "scanflow.examples.digits", "scanflow.examples.digits.s1", "scanflow.examples",  # ast.walk: top level first
        "scanflow.examples.tabular", "scanflow.examples.digits.train:train"]


def test_scanflow_imports_no_workflow() -> None:
    offenders = []
    for folder in ("scanflow",):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            offenders += [f"{rel}:{line}: imports {mod}" for line, mod in forbidden_imports(path.read_text())]
    assert not offenders, "the framework must not know an example workflow:\n" + "\n".join(offenders)
