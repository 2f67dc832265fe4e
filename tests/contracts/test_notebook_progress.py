"""The tutorials as committed (nbformat, no kernel: running them is the e2e test in tests/notebooks):
valid notebooks with clean outputs, and notebook 01's slow cells (the MLflow start, the training) say
what they are doing before they block and what they did after."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_valid_and_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
            assert not re.search(r"^\s*(from|import) tqdm", cell.source, re.MULTILINE)  # printed lines, never widgets


@pytest.mark.parametrize("blocking", [r"\bserver\.start\(\)", r"\btrain\("])
def test_slow_cells_of_01_print_before_and_after_they_block(blocking: str) -> None:
    nb = nbformat.read(ROOT / "notebooks/01_data_scientist.ipynb", as_version=4)
    cells = [c.source.splitlines() for c in nb.cells if c.cell_type == "code" and re.search(blocking, c.source)]
    assert len(cells) == 1, blocking
    lines = cells[0]
    at = next(i for i, line in enumerate(lines) if re.search(blocking, line))
    assert any(re.search(r"\bprint\(.*flush=True\)", line) for line in lines[:at]), "nothing printed before it"
    assert any("print(" in line for line in lines[at + 1:]), "nothing printed after it"
