"""`scanflow traffic | feedback`: send predictions and true labels to a stack that `scanflow up` runs.

`traffic ROWS` replays rows from a file to a service's gateway at a steady rate (open loop, as clients
arrive) and, like a client that learns the truth later, posts the true label of a share of the answered
requests to the Tracker's `/feedback` a little after each answer. `feedback FILE` posts labels a team
collected for requests its own client sent (by the `request_id` each answer returned). Both find the stack
as `status` does (--home, --workflow-name, or the one stack under ./.scanflow) and read its token from
the file `up` wrote; for a stack elsewhere (a cluster) `--url` / `--tracker-url` name the addresses and
SCANFLOW_TOKEN holds the token. Exit codes: 0; 1 when nothing was answered or stored (or, with
`--until-new-version`, no new model version came); 2 for bad input or no stack.
Who calls: scanflow/cli.py registers these commands; docs/quickstart.md uses them.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from scanflow.embedded.cli import HomeOpt, _fail, _home, _state_or_exit
from scanflow.embedded.readcli import NameOpt

if TYPE_CHECKING:
    import numpy as np

    from scanflow.embedded.statefile import StackState

PROGRESS_EVERY_S = 5.0


class RowsError(ValueError):
    """A rows or labels file that cannot be read as documented; the message names the file and why."""


def read_rows(path: Path, label_column: str = "label") -> tuple[np.ndarray, np.ndarray | None]:
    """(rows as float32 (n, features), labels or None) from `.npz` (arrays `x` and, optionally, `y`)
    or `.csv` (a header row; every column but `label_column` is a feature). RowsError otherwise."""
    import numpy as np

    if not path.is_file():
        raise RowsError(f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                if "x" not in data:
                    raise RowsError(f"{path}: needs an array 'x' (rows) and optionally 'y' (labels); has {sorted(data)}")
                x, y = np.asarray(data["x"]), (np.asarray(data["y"]) if "y" in data else None)
        except (OSError, ValueError) as exc:
            raise RowsError(f"{path}: not a readable .npz file: {exc}") from None
    elif path.suffix == ".csv":
        with path.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise RowsError(f"{path}: empty; the first line names the columns")
            body = [row for row in reader if row]
        features = [i for i, name in enumerate(header) if name != label_column]
        try:
            x = np.array([[float(row[i]) for i in features] for row in body], dtype=np.float64)
        except (ValueError, IndexError) as exc:
            raise RowsError(f"{path}: every feature must be a number on every line ({exc})") from None
        y = None
        if label_column in header:
            at = header.index(label_column)
            raw = [row[at] for row in body]
            try:
                y = np.array([float(v) for v in raw])
                if np.all(y == np.round(y)):
                    y = y.astype(np.int64)
            except ValueError:
                y = np.array(raw)
    else:
        raise RowsError(f"{path}: use a .npz (arrays x, y) or a .csv file")
    if x.ndim != 2 or len(x) == 0 or not np.isfinite(x).all():
        raise RowsError(f"{path}: rows must be a non-empty 2-D table of finite numbers, got shape {x.shape}")
    if y is not None and len(y) != len(x):
        raise RowsError(f"{path}: {len(x)} rows but {len(y)} labels")
    return x.astype(np.float32), y


def read_labels(path: Path) -> list[dict[str, Any]]:
    """Feedback records from `.csv` (columns `request_id` and `label`: one label per request) or
    `.jsonl` (one {"request_id": ..., "labels": [...]} per line, as POST /feedback takes them)."""
    if not path.is_file():
        raise RowsError(f"{path}: no such file")
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RowsError(f"{path}:{n}: not JSON: {exc.msg}") from None
            if not isinstance(record, dict) or "request_id" not in record or "labels" not in record:
                raise RowsError(f"{path}:{n}: each line is an object with 'request_id' and 'labels'")
            out.append(record)
        return out
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if rows and not {"request_id", "label"} <= set(rows[0]):
            raise RowsError(f"{path}: needs the columns 'request_id' and 'label' (has {sorted(rows[0])})")
        return [{"request_id": r["request_id"], "labels": [_label(r["label"])]} for r in rows]
    raise RowsError(f"{path}: use a .csv (request_id,label) or a .jsonl file")


def _label(text: str) -> Any:
    """Pure: a CSV label as the number it spells (int when whole), else the string."""
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def _token(state: StackState) -> str | None:
    path = Path(state.token_file)
    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise _fail(f"cannot read the stack's token file {path}: {exc.strerror}") from None


def _service_url(state: StackState, service: str | None) -> str:
    services = dict(state.urls.get("services") or {})
    if service is None:
        url = state.urls.get("primary")
        if not url:
            raise _fail("the stack has no service address yet (still starting? see `scanflow status`)")
        return str(url)
    if service not in services:
        raise _fail(f"--service {service!r}: the stack serves {sorted(services)}")
    return str(services[service])


UrlOpt = Annotated[str | None, typer.Option(
    "--url", help="the service's base URL when its stack does not run here (a cluster, e.g. through "
    "`kubectl port-forward svc/digits-gateway 8080`); the token is read from SCANFLOW_TOKEN, never argv")]
TrackerOpt = Annotated[str | None, typer.Option(
    "--tracker-url", help="the Tracker's base URL, where labels go, with --url")]


def _remote(url: str | None, tracker_url: str | None, need_tracker: bool) -> tuple[str | None, str | None, str | None]:
    """(service URL, Tracker URL, token) given on the command line and in SCANFLOW_TOKEN for a stack this
    machine did not start, or (None, None, None) to read them from a local stack's home."""
    import os

    if url is None and tracker_url is None:
        return None, None, None
    for name, value in (("--url", url), ("--tracker-url", tracker_url)):
        if value is not None and not value.startswith(("http://", "https://")):
            raise _fail(f"{name} {value!r}: give an http:// or https:// address")
    if need_tracker and not tracker_url:
        raise _fail("labels go to the Tracker: give --tracker-url too (or --labels 0)")
    return (url.rstrip("/") if url else None, tracker_url.rstrip("/") if tracker_url else None,
            os.environ.get("SCANFLOW_TOKEN") or None)


def progress_line(elapsed: float, answers: list[Any], since: int, labelled: int, with_labels: bool) -> str:
    """Pure: one line of progress: requests answered and failed so far, then over the answers after index
    `since` (those of this interval): the model versions that answered and their accuracy."""
    ok = sum(1 for a in answers if a.status == 200)
    recent = [a for a in answers[since:] if a.status == 200]
    judged = [a for a in recent if a.correct is not None]
    versions = ",".join(sorted({str(a.version) for a in recent})) or "-"
    acc = f"  accuracy {sum(bool(a.correct) for a in judged) / len(judged):.3f}" if with_labels and judged else ""
    return (f"{elapsed:6.0f}s  answered {ok:>6}  failed {len(answers) - ok:>4}  model version {versions}{acc}"
            f"  labels posted {labelled}")


def new_version(answers: list[Any], since: int) -> str | None:
    """Pure: the model version that answered every request after index `since`, when it is not the one
    that answered first (a promotion reached every replica); None otherwise."""
    first = next((a.version for a in answers if a.status == 200), None)
    recent = {a.version for a in answers[since:] if a.status == 200}
    if first is None or len(recent) != 1 or first in recent:
        return None
    return str(next(iter(recent)))


def traffic(
    rows: Annotated[Path, typer.Argument(help="rows to send: .npz (arrays x and, for labels, y) or .csv (a header; "
                                         "the label column is optional)")],
    home: HomeOpt = None,
    workflow_name: NameOpt = None,
    service: Annotated[str | None, typer.Option("--service", help="default: the service the agents watch")] = None,
    rate: Annotated[float, typer.Option("--rate", min=0.1, max=10000, help="requests per second")] = 50.0,
    seconds: Annotated[float, typer.Option("--seconds", min=1, help="how long to send")] = 60.0,
    clients: Annotated[int, typer.Option("--clients", min=1, max=256, help="the most requests in flight")] = 4,
    labels: Annotated[float, typer.Option("--labels", min=0.0, max=1.0, help="share of answered requests whose "
                                          "true label is posted to the Tracker")] = 0.2,
    label_delay_s: Annotated[float, typer.Option("--label-delay-s", min=0.0, help="how long after its answer a "
                                                 "label is posted")] = 2.0,
    label_column: Annotated[str, typer.Option("--label-column", help="a .csv file's label column")] = "label",
    seed: Annotated[int, typer.Option("--seed", help="which rows, in which order")] = 0,
    until_new_version: Annotated[bool, typer.Option("--until-new-version", help="stop once every answer of the "
                                                    "last 5 s came from another model version than the first "
                                                    "answer (the loop promoted a new one), or after --seconds")] = False,
    url: UrlOpt = None,
    tracker_url: TrackerOpt = None,
) -> None:
    """Send rows to a service one request per row at a steady rate, and post the true labels of a share of
    them as feedback. A line every 5 s (the model versions that answered in those 5 s and their accuracy
    when the rows are labelled), a JSON summary at the end."""
    import numpy as np

    from scanflow.embedded.traffic import Traffic

    try:
        x, y = read_rows(rows, label_column)
    except RowsError as exc:
        raise _fail(str(exc)) from None
    if y is None and labels > 0:
        raise _fail(f"{rows} holds no labels (array 'y' / column {label_column!r}): add them, or pass --labels 0")
    if url is None and tracker_url is not None:
        raise _fail("--tracker-url goes with --url (the service's address)")
    url, tracker, token = _remote(url, tracker_url, labels > 0)
    if url is None:
        state = _state_or_exit(_home(home, workflow_name))
        url, token = _service_url(state, service), _token(state)
        tracker = (state.urls.get("agents") or {}).get("tracker")
        if labels > 0 and not tracker:
            raise _fail("the stack has no Tracker address to post labels to (still starting? see `scanflow status`)")
    pool = (x, y if y is not None else np.zeros(len(x), np.int64))
    t0 = time.monotonic()
    new_at: float | None = None
    with Traffic(url, pool, pool, rate=rate, clients=clients, seed=seed, tracker_url=tracker if labels > 0 else None,
                 token=token, feedback_fraction=labels, feedback_delay_s=label_delay_s) as load:
        shown = 0
        try:
            while (elapsed := time.monotonic() - t0) < seconds:
                time.sleep(min(PROGRESS_EVERY_S, max(0.0, seconds - elapsed)))
                answers = load.snapshot()
                typer.echo(progress_line(time.monotonic() - t0, answers, shown, load.feedback_counts().acknowledged,
                                         y is not None))
                if until_new_version and new_version(answers, shown) is not None:
                    new_at = round(time.monotonic() - t0, 1)
                    break
                shown = len(answers)
        except KeyboardInterrupt:
            typer.echo("stopping (Ctrl-C)", err=True)
    answers = load.snapshot()
    ok = [a for a in answers if a.status == 200]
    acc = load.accuracy() if y is not None else float("nan")
    counts = load.feedback_counts()
    summary = {"sent": len(answers), "answered": len(ok), "failed": len(answers) - len(ok), "unsent": load.unsent,
               "versions": sorted({str(a.version) for a in ok}),
               "accuracy": None if math.isnan(acc) else round(acc, 4),
               "labels_posted": counts.acknowledged, "labels_dropped": counts.dropped,
               **({"new_version_after_s": new_at} if until_new_version else {})}
    typer.echo(json.dumps(summary))
    if not ok:
        raise _fail(f"no request was answered by {url} (see `scanflow status` and `scanflow logs`)", 1)
    if until_new_version and new_at is None:
        raise _fail(f"no new model version answered within {seconds:g} s (see `scanflow plans` and "
                    "`scanflow decisions`)", 1)


def feedback(
    file: Annotated[Path, typer.Argument(help=".csv with columns request_id,label, or .jsonl with one "
                                         "{\"request_id\", \"labels\"} per line")],
    home: HomeOpt = None,
    workflow_name: NameOpt = None,
    tracker_url: Annotated[str | None, typer.Option(
        "--tracker-url", help="the Tracker's base URL when its stack does not run here; the token is read "
        "from SCANFLOW_TOKEN, never argv")] = None,
) -> None:
    """Post true labels, by the request ids your predictions returned, to the stack's Tracker (exactly once
    per request id: a label posted again is counted as a duplicate, not stored twice)."""
    from scanflow.agent.client import AgentHTTPError
    from scanflow.tracking.feedback_client import post_feedback

    try:
        records = read_labels(file)
    except RowsError as exc:
        raise _fail(str(exc)) from None
    _url, tracker, token = _remote(None, tracker_url, True) if tracker_url else (None, None, None)
    if tracker is None:
        state = _state_or_exit(_home(home, workflow_name))
        tracker, token = (state.urls.get("agents") or {}).get("tracker"), _token(state)
        if not tracker:
            raise _fail("the stack has no Tracker address yet (still starting? see `scanflow status`)")
    try:
        got = post_feedback(str(tracker), token, records)
    except AgentHTTPError as exc:
        raise _fail(f"{file}: the Tracker refused the labels: {exc}", 2 if not exc.retryable else 1) from None
    except Exception as exc:  # noqa: BLE001 - the Tracker is unreachable: say so in one line
        raise _fail(f"{tracker}: {type(exc).__name__}: {exc}", 1) from None
    typer.echo(json.dumps(got))
    if records and not got["stored"] and not got["duplicates"]:
        raise _fail("nothing was stored", 1)
