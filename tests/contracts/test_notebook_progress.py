"""The notebooks as committed (nbformat, no kernel): valid documents whose progress is printed lines,
never widgets. That they hold their outputs and use only public API is tests/notebooks (the committed
checks run in `make test`; running them is the e2e part)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_found() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_data_scientist.ipynb", "02_operator.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_valid_and_print_their_progress_as_lines(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not re.search(r"^\s*(from|import) tqdm", cell.source, re.MULTILINE)  # printed lines, never widgets
            widgets = [o for o in cell.get("outputs", []) if "application/vnd.jupyter.widget-view+json" in
                       o.get("data", {})]
            assert not widgets, cell.source[:80]
