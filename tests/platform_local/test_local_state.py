"""The local platform's state file (pure parts): what a successor reads back before adopting anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scanflow.platform.local_state import STATE_VERSION, read_state, take_over, write_state


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", json.dumps({"version": STATE_VERSION + 1})])
def test_a_state_file_that_cannot_be_adopted_adopts_nothing(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    assert read_state(path) == {}


def test_the_state_written_is_the_state_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert read_state(path) == {}  # none yet
    state = {"version": STATE_VERSION, "cgroup_prefix": "scanflow-1", "services": {}}
    assert write_state(path, json.dumps(state))
    assert read_state(path) == state and not path.with_suffix(".tmp").exists()


def test_an_unwritable_home_is_a_warning_not_an_error(tmp_path: Path) -> None:
    assert not write_state(tmp_path / "missing-dir" / "state.json", "{}")


@pytest.mark.parametrize("rec", [{}, {"pid": "1", "start": 1, "port": 1}, {"pid": 1, "start": None, "port": 1},
                                 {"pid": 2**22 + 12345, "start": 1, "port": 8000}])
def test_a_record_that_is_not_a_live_process_of_ours_is_not_taken_over(rec: dict) -> None:
    assert take_over(rec, "scanflow.serving.replica", "/ready") == (None, False)
