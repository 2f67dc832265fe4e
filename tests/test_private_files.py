"""open_to_others: what a stack's home leaves readable to other accounts, while the stack runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scanflow import private_files
from scanflow.private_files import open_to_others, private_dir, write_private


def test_a_world_readable_file_is_named_with_its_mode(tmp_path: Path) -> None:
    home = private_dir(tmp_path / "home")
    write_private(home / "token", "t")
    (home / "db").mkdir(mode=0o700)
    leaked = home / "db" / "labels.db"
    leaked.write_text("x")
    os.chmod(leaked, 0o644)
    assert open_to_others(home) == [f"{leaked} 644"]


def test_a_file_removed_during_the_walk_is_skipped_not_an_error(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # what CI hit: SQLite's -journal file was listed, then gone before its stat
    home = private_dir(tmp_path / "home")
    open_file = home / "open.txt"
    open_file.write_text("x")
    os.chmod(open_file, 0o604)
    walk = private_files._walk
    monkeypatch.setattr(private_files, "_walk", lambda root: [*walk(root), root / "mlflow.db-journal"])
    assert open_to_others(home) == [f"{open_file} 604"]
