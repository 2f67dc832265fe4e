"""No import cycle between the modules of scanflow/ and agents/ (tests/contracts/import_graph.py reads
the sources; nothing is imported). A cycle is how layers rot: two modules that import each other are one
module in two files, and the one that hides its import in a function only defers the knot. That the
product never imports an example is test_import_contract.py; that it never imports the tests or the
benchmarks is here."""

from __future__ import annotations

from pathlib import Path

from tests.contracts.import_graph import cycles, import_graph, modules

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("scanflow",)


def _graph() -> dict[str, set[str]]:
    return import_graph(modules(ROOT, (*PRODUCT, "workflows", "tests", "benchmarks"),
                                installed_as={"workflows": "scanflow.examples"}))


def test_no_module_of_the_product_is_in_an_import_cycle() -> None:
    graph = _graph()
    product = {m: {t for t in ts if t.split(".")[0] in PRODUCT} for m, ts in graph.items()
               if m.split(".")[0] in PRODUCT}
    assert len(product) > 100  # the whole product was read
    found = cycles(product)
    edges = [f"{a} -> {b}" for c in found for a in c for b in sorted(product[a] & set(c))]
    assert found == [], "import cycles (break them: move what both need into a module of its own):\n" + "\n".join(edges)


def test_the_product_never_imports_the_tests_or_the_benchmarks() -> None:
    graph = _graph()
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] in PRODUCT
                   for t in targets if t.split(".")[0] in ("tests", "benchmarks"))
    assert wrong == []


def test_a_planted_cycle_is_found_even_inside_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted import b\n")
    (pkg / "b.py").write_text("def later():\n    from planted.c import x\n")
    (pkg / "c.py").write_text("from . import a\nx = 1\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted import a\n")
    graph = import_graph(modules(tmp_path, ["planted"]))
    assert cycles(graph) == [["planted.a", "planted.b", "planted.c"]]
    assert graph["planted.d"] == set()  # annotations only: not a run-time edge
