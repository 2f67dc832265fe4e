"""Every third-party module the shipped code imports belongs to a distribution pyproject.toml declares
(dependencies or an extra): a package that arrives only as another one's dependency can vanish when
that one changes, and the import then fails on a user's machine, not here."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("scanflow", "agents", "workflows")


def imported_top_modules(root: Path) -> dict[str, str]:
    """{top-level module: one file importing it} for absolute imports under the shipped packages."""
    found: dict[str, str] = {}
    for pkg in SHIPPED:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(root)))
    return found


def declared(pyproject: dict) -> set[str]:
    """Normalised distribution names in [project] dependencies and optional-dependencies."""
    project = pyproject["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {normalise(re.split(r"[\s\[<>=!~;]", r.strip(), maxsplit=1)[0]) for r in reqs}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_third_party_module_is_declared() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = declared(pyproject)
    dists = packages_distributions()
    missing = {}
    for module, where in imported_top_modules(ROOT).items():
        if module in sys.stdlib_module_names or module in SHIPPED or module == "__future__":
            continue
        owners = {normalise(d) for d in dists.get(module, [])}
        if owners and not owners & names:
            missing[module] = (sorted(owners), where)
    assert not missing, f"imported but not declared in pyproject.toml (module: (distribution, file)): {missing}"


def test_the_check_sees_an_undeclared_import() -> None:
    # the check itself: a dependency removed from the declaration is reported
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = declared(pyproject) - {"scipy"}
    owners = {normalise(d) for d in packages_distributions().get("scipy", [])}
    assert owners and not owners & names
    assert "scipy" in imported_top_modules(ROOT)
