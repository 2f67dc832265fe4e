"""`scanflow traffic | feedback`: the files they read (and the clear errors for bad ones), the progress
they print, and `feedback` posting labels to a real Tracker over loopback HTTP. The whole of `traffic`
against a running stack, to a promotion, is tests/e2e/test_quickstart.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.embedded.clientcli import RowsError, new_version, progress_line, read_labels, read_rows
from scanflow.embedded.statefile import Pid, StackState, write_state

REPO = Path(__file__).resolve().parents[2]
TOKEN = "client-cli-token"


def test_rows_from_npz_and_csv(tmp_path: Path) -> None:
    np.savez(tmp_path / "r.npz", x=np.arange(6, dtype=np.float64).reshape(3, 2), y=np.array([0, 1, 0]))
    x, y = read_rows(tmp_path / "r.npz")
    assert x.dtype == np.float32 and x.shape == (3, 2) and y is not None and y.tolist() == [0, 1, 0]
    (tmp_path / "r.csv").write_text("a,label,b\n1,2,3\n4,5,6\n")
    x, y = read_rows(tmp_path / "r.csv")
    assert x.tolist() == [[1.0, 3.0], [4.0, 6.0]] and y is not None and y.tolist() == [2, 5]
    (tmp_path / "nolabel.csv").write_text("a,b\n1,2\n")
    assert read_rows(tmp_path / "nolabel.csv")[1] is None
    (tmp_path / "s.csv").write_text("a,label\n1,cat\n2,dog\n")
    assert read_rows(tmp_path / "s.csv")[1].tolist() == ["cat", "dog"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "content", "says"), [
    ("r.txt", "1,2\n", "use a .npz"),
    ("r.csv", "", "empty"),
    ("r.csv", "a,b\n1,x\n", "must be a number"),
    ("r.csv", "a,b\n1,nan\n", "finite"),
    ("absent.npz", None, "no such file"),
])
def test_bad_rows_files_say_what_is_wrong(tmp_path: Path, name: str, content: str | None, says: str) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(RowsError, match=says):
        read_rows(tmp_path / name)


def test_npz_without_x_or_with_unequal_labels(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", rows=np.zeros((2, 2)))
    with pytest.raises(RowsError, match="needs an array 'x'"):
        read_rows(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", x=np.zeros((2, 2)), y=np.zeros(3))
    with pytest.raises(RowsError, match="2 rows but 3 labels"):
        read_rows(tmp_path / "b.npz")


def test_labels_from_csv_and_jsonl(tmp_path: Path) -> None:
    (tmp_path / "l.csv").write_text("request_id,label\nr1,3\nr2,0.5\nr3,cat\n")
    assert read_labels(tmp_path / "l.csv") == [{"request_id": "r1", "labels": [3]}, {"request_id": "r2", "labels": [0.5]},
                                              {"request_id": "r3", "labels": ["cat"]}]
    (tmp_path / "l.jsonl").write_text('{"request_id": "r1", "labels": [1, 2]}\n\n')
    assert read_labels(tmp_path / "l.jsonl") == [{"request_id": "r1", "labels": [1, 2]}]
    (tmp_path / "bad.jsonl").write_text('{"request_id": "r1"}\n')
    with pytest.raises(RowsError, match=r"bad.jsonl:1: each line is an object"):
        read_labels(tmp_path / "bad.jsonl")
    (tmp_path / "bad.csv").write_text("id,y\nr1,1\n")
    with pytest.raises(RowsError, match="needs the columns 'request_id' and 'label'"):
        read_labels(tmp_path / "bad.csv")


def _answer(status: int, version: str | None, correct: bool | None) -> Any:
    return SimpleNamespace(status=status, version=version, correct=correct)


def test_progress_reports_this_intervals_versions_and_accuracy() -> None:
    answers = [_answer(200, "1", False)] * 4 + [_answer(0, None, None)] + [_answer(200, "2", True)] * 3
    line = progress_line(10.0, answers, 5, 7, with_labels=True)
    assert "answered      7" in line and "failed    1" in line and "model version 2 " in line
    assert "accuracy 1.000" in line and "labels posted 7" in line  # only the 3 answers after index 5
    assert "accuracy" not in progress_line(10.0, answers, 0, 0, with_labels=False)


def test_new_version_only_once_every_recent_answer_is_another_one() -> None:
    first = [_answer(200, "1", None)] * 3
    assert new_version(first + [_answer(200, "2", None), _answer(200, "1", None)], 3) is None  # mid-swap
    assert new_version(first + [_answer(200, "2", None)] * 2, 3) == "2"
    assert new_version(first, 0) is None and new_version([], 0) is None


def _stack(home: Path, tracker_url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text(TOKEN)
    write_state(home, StackState(pid=Pid.of(os.getpid()), workflow="digits", home=str(home), log_dir=str(home),
                                 token_file=str(home / "token"), state="running",
                                 urls={"agents": {"tracker": tracker_url}, "services": {}, "primary": None}))


@pytest.fixture
def tracker(tmp_path: Path, serve_app: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The standard Tracker, bound to the digits workflow, served on loopback (its logs in SQLite)."""
    from scanflow.agent import create_app
    from scanflow.settings import Settings
    from scanflow.spec import load_workflow
    from scanflow.standard.tracker import agent

    monkeypatch.delenv("SCANFLOW_AUTH_TOKENS", raising=False)
    bound = agent.bound(load_workflow(REPO / "workflows" / "digits" / "workflow.yaml"))
    bound.sensors.clear()  # its flush to MLflow is not under test
    yield serve_app(create_app(bound, Settings(token=TOKEN, home=tmp_path / "tracker")))


def test_feedback_posts_labels_once_and_counts_a_repeat(tmp_path: Path, tracker: str) -> None:
    home = tmp_path / "stack"
    _stack(home, tracker)
    (tmp_path / "labels.csv").write_text("request_id,label\nr1,3\nr2,7\n")
    first = CliRunner().invoke(app, ["feedback", str(tmp_path / "labels.csv"), "--home", str(home)])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout.strip().splitlines()[-1]) == {"accepted": 2, "stored": 2, "duplicates": 0}
    again = CliRunner().invoke(app, ["feedback", str(tmp_path / "labels.csv"), "--home", str(home)])
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {"accepted": 2, "stored": 0, "duplicates": 2}


def test_feedback_refused_by_the_tracker_is_one_line_and_exit_2(tmp_path: Path, tracker: str) -> None:
    home = tmp_path / "stack"
    _stack(home, tracker)
    (tmp_path / "bad.jsonl").write_text('{"request_id": "r1", "labels": []}\n')  # a record needs a label
    res = CliRunner().invoke(app, ["feedback", str(tmp_path / "bad.jsonl"), "--home", str(home)])
    assert res.exit_code == 2 and "the Tracker refused the labels" in res.stderr, res.output


def test_without_a_stack_or_with_bad_files_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "rows.npz", x=np.zeros((3, 2)))
    nostack = CliRunner().invoke(app, ["traffic", "rows.npz", "--labels", "0"])
    assert nostack.exit_code == 2 and "no stack under" in nostack.stderr, nostack.output
    unlabelled = CliRunner().invoke(app, ["traffic", "rows.npz"])
    assert unlabelled.exit_code == 2 and "holds no labels" in unlabelled.stderr
    missing = CliRunner().invoke(app, ["feedback", "labels.csv"])
    assert missing.exit_code == 2 and "labels.csv: no such file" in missing.stderr


def test_traffic_with_labels_needs_the_trackers_address(tmp_path: Path) -> None:
    home = tmp_path / "stack"
    _stack(home, "")  # the state names no Tracker (yet): labels would go nowhere
    np.savez(tmp_path / "rows.npz", x=np.zeros((3, 2)), y=np.zeros(3))
    res = CliRunner().invoke(app, ["traffic", str(tmp_path / "rows.npz"), "--home", str(home), "--service", "x"])
    assert res.exit_code == 2 and "--service 'x'" in res.stderr  # a service the stack does not serve
    _stack(home, "")
    state = json.loads((home / "stack.json").read_text())
    state["urls"]["primary"] = "http://127.0.0.1:9"
    (home / "stack.json").write_text(json.dumps(state))
    res = CliRunner().invoke(app, ["traffic", str(tmp_path / "rows.npz"), "--home", str(home)])
    assert res.exit_code == 2 and "no Tracker address" in res.stderr, res.output


def test_a_stack_elsewhere_by_its_addresses_and_the_token_from_the_environment(
        tmp_path: Path, tracker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's stack (reached e.g. through kubectl port-forward): no home here, the addresses on the
    command line, the token only from SCANFLOW_TOKEN."""
    monkeypatch.chdir(tmp_path)  # no stack under ./.scanflow
    (tmp_path / "labels.csv").write_text("request_id,label\nr1,3\n")
    monkeypatch.delenv("SCANFLOW_TOKEN", raising=False)
    anonymous = CliRunner().invoke(app, ["feedback", "labels.csv", "--tracker-url", tracker])
    assert anonymous.exit_code == 2 and "refused" in anonymous.stderr, anonymous.output
    monkeypatch.setenv("SCANFLOW_TOKEN", TOKEN)
    done = CliRunner().invoke(app, ["feedback", "labels.csv", "--tracker-url", tracker + "/"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"accepted": 1, "stored": 1, "duplicates": 0}
    np.savez(tmp_path / "rows.npz", x=np.zeros((3, 2)), y=np.zeros(3))
    for args, says in ((["--url", "http://127.0.0.1:9"], "give --tracker-url too"),
                       (["--url", "127.0.0.1:9", "--labels", "0"], "give an http:// or https:// address"),
                       (["--tracker-url", tracker], "--tracker-url goes with --url")):
        res = CliRunner().invoke(app, ["traffic", "rows.npz", *args])
        assert res.exit_code == 2 and says in res.stderr, (args, res.output)
