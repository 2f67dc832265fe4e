"""Notebook fixtures: run a notebook top to bottom in the venv's python3 kernel, kill what it leaves.

The kernel's working directory is notebooks/, as when Jupyter opens the notebook there: each notebook
works in a folder of its own beside it (notebooks/scientist/, notebooks/operator/; git ignores them).

The kernel is ipykernel's native spec (`python3` -> this interpreter), so no kernel needs installing.
A notebook that fails half-way may leave processes it started (MLflow, agents, replicas): the
fixture kills every child process of the kernel still alive after the run, by pid.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _descendants(pid: int) -> list[int]:
    """Pids of every live descendant of pid (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.fixture
def run_notebook(tmp_path: Path):  # type: ignore[no-untyped-def]
    import nbformat
    from nbclient import NotebookClient

    def run(name: str, timeout_s: int = 300) -> nbformat.NotebookNode:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}})  # as Jupyter: beside it
        with client.setup_kernel():
            kernel_pid = client.km.provisioner.pid if client.km.provisioner else None
            try:
                for i, cell in enumerate(nb.cells):
                    client.execute_cell(cell, i)
            except Exception:
                # the failing cell's error says what broke, the cells before it say why: show them too
                print(f"{name}: the outputs of the cells run so far")
                for i, cell in enumerate(nb.cells):
                    for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                        text = str(out.get("text", "")) or str(out.get("data", {}).get("text/plain", ""))
                        if text:
                            print(f"[cell {i}] {text.rstrip()[-3000:]}")
                raise
            finally:
                if kernel_pid:
                    for pid in _descendants(kernel_pid):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        return nb

    return run
