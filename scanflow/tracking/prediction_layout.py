"""Where a prediction log's batches live in MLflow: the run (tagged with the log's name) and, in it,
`predictions/<shard>/<shard>/<shard>/batch-<first seq>.parquet`, and which of them a consumer at a
watermark must read. The path is a function of the batch's first seq alone, so a re-flush after a crash
overwrites the same file (scanflow.tracking.predictions explains why that makes the log exactly-once).
Pure functions but for `run_artifact_repo` and `mlflow_lister`, the only I/O; tests pass a fake `Lister`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ARTIFACT_DIR = "predictions"
SEQ_DIGITS = 12  # batch names carry their first seq zero-padded to this width
# Shard levels under ARTIFACT_DIR, as digits of the 12-digit first seq: level-1 directories span 10**9
# seqs, level-2 10**6, level-3 10**3, so no directory holds more than 1,000 entries (the root gains one
# per billion seqs). Part of the stored format: changing it strands existing runs.
SHARD_DIGITS: tuple[int, ...] = (3, 6, 9)
_SHARD_RE = re.compile(r"[0-9]{1,18}")
RUN_TAG = "scanflow.predictions"  # value: the log's name; identifies the run a log flushes into
LOG_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")  # the name goes into MLflow search filters


def batch_artifact_name(first_seq: int) -> str:
    """Deterministic file name of the batch starting at `first_seq` (re-flush overwrites, never adds)."""
    return f"batch-{first_seq:0{SEQ_DIGITS}d}.parquet"


def shard_dirs(first_seq: int, digits: Sequence[int] | None = None) -> list[str]:
    """The shard directories, outermost first, of the batch starting at `first_seq`. Pure.

    Level i is named by the first `digits[i]` digits of the zero-padded first seq (a prefix of the
    batch's own name, so names sort as seqs do): with (3, 6, 9), batch 1234567 lives in
    `000/000001/000001234/`. Deterministic in `first_seq` alone, so a re-flush after a crash between upload
    and commit overwrites the same path.
    """
    widths = SHARD_DIGITS if digits is None else digits
    return [f"{first_seq // 10 ** (SEQ_DIGITS - w):0{w}d}" for w in widths]


def batch_artifact_path(first_seq: int, digits: Sequence[int] | None = None) -> str:
    """Where the batch starting at `first_seq` is written, relative to the run's artifact root. Pure."""
    return "/".join([ARTIFACT_DIR, *shard_dirs(first_seq, digits), batch_artifact_name(first_seq)])


def shard_start(name: str, width: int) -> int | None:
    """The first seq a level directory named `name` may hold (it spans 10**(SEQ_DIGITS - width) seqs),
    or None if `name` is not a shard directory. Pure. Goes by the level's width, not the name's
    length, so prefixes of seqs beyond 12 digits still order correctly."""
    if not _SHARD_RE.fullmatch(name):
        return None
    return int(name) * 10 ** (SEQ_DIGITS - width)


def shard_plan(starts: Sequence[int], watermark: int) -> tuple[list[int], list[int]]:
    """Which shard directories of one level a consumer at `watermark` lists. Pure.

    Returns (now, fallback). `now`: the last shard starting at or before the watermark (it holds the
    watermark) and every later one, ascending. `fallback`: the earlier shards, nearest first, listed
    one by one only while no batch starting at or before the watermark was found: a batch is a seq
    range, so the batch holding the watermark may start in an earlier shard than the watermark's own
    (a batch whose first seq is in shard k can hold seqs of shard k+1).
    """
    ordered = sorted(starts)
    now = batches_to_read(ordered, watermark)
    return now, ordered[: len(ordered) - len(now)][::-1]


# one artifact directory listing: (path relative to the run's artifact root, is_dir) of each entry
Lister = Callable[[str], Sequence[tuple[str, bool]]]


def locate_batches(
    list_dir: Lister, watermark: int, *, limit: int | None = None, digits: Sequence[int] | None = None
) -> dict[int, str]:
    """first seq -> artifact path of every batch a consumer at `watermark` must read, in both layouts.

    Lists only the root and, at each shard level, the shard holding the watermark and later ones (and
    an earlier one when a batch straddles the edge), so a caught-up consumer's cost does not grow with
    the run's history. Flat `predictions/batch-*.parquet` files (the layout before shards) are read
    at the root as before. `limit`: stop listing later shards once that many batches are known (a
    consumer reading at most `limit` batches). `list_dir` is the only I/O, so tests can pass a fake.
    """
    widths = tuple(SHARD_DIGITS if digits is None else digits)
    limit = None if limit is None else max(1, limit)  # as before shards: at least the first batch
    found = _locate(list_dir, ARTIFACT_DIR, 0, watermark, limit, widths)
    wanted = batches_to_read(list(found), watermark)
    return {s: found[s] for s in (wanted if limit is None else wanted[:limit])}


def _locate(
    list_dir: Lister, path: str, depth: int, wm: int, limit: int | None, widths: tuple[int, ...]
) -> dict[int, str]:
    entries = list_dir(path)
    files = {s: p for p, is_dir in entries if not is_dir and (s := first_seq_of(p)) is not None}
    found = {s: files[s] for s in batches_to_read(list(files), wm)}
    if depth == len(widths):
        return found
    shards = {
        start: p
        for p, is_dir in entries
        if is_dir and (start := shard_start(Path(p).name, widths[depth])) is not None
    }
    now, fallback = shard_plan(list(shards), wm)
    below: dict[int, str] = {}
    for start in now:
        if limit is not None and sum(1 for s in below if s > wm) >= limit:
            break  # later shards hold only later batches: the consumer stops before them
        below.update(_locate(list_dir, shards[start], depth + 1, wm, limit, widths))
    for start in fallback:
        if any(s <= wm for s in below):
            break
        below.update(_locate(list_dir, shards[start], depth + 1, wm, limit, widths))
    # the same first seq flat and sharded: a batch re-flushed after an upgrade, the sharded copy is
    # the newer one and holds every row the flat one did (the same seqs, from the same log)
    found.update(below)
    return found


def all_batch_artifacts(list_dir: Lister, path: str = ARTIFACT_DIR) -> list[str]:
    """Every batch file under `path`, both layouts, duplicates included: what MLflow really holds
    (for audits and tests; a consumer uses `locate_batches`)."""
    out: list[str] = []
    for p, is_dir in list_dir(path):
        if is_dir:
            out += all_batch_artifacts(list_dir, p)
        elif first_seq_of(p) is not None:
            out.append(p)
    return out


def run_artifact_repo(run_id: str) -> Any:
    """The run's artifact repository, resolved once (one get_run). Why not `MlflowClient.list_artifacts`
    / `download_artifacts`: they go through a `runs:/` URI, which re-resolves the run and searches the
    experiment's logged models on every call: 4 HTTP requests per listing instead of 1, 5 per download
    instead of 2."""
    from mlflow import MlflowClient
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    return get_artifact_repository(MlflowClient().get_run(run_id).info.artifact_uri)


def mlflow_lister(run_id: str, repo: Any = None) -> Lister:
    """A `Lister` over one run's artifacts (one HTTP request per call with the default server)."""
    artifacts = run_artifact_repo(run_id) if repo is None else repo

    def list_dir(path: str) -> list[tuple[str, bool]]:
        return [(f.path, bool(f.is_dir)) for f in artifacts.list_artifacts(path)]

    return list_dir


def first_seq_of(artifact_path: str) -> int | None:
    stem = Path(artifact_path).name
    if not (stem.startswith("batch-") and stem.endswith(".parquet")):
        return None
    try:
        return int(stem[len("batch-") : -len(".parquet")])
    except ValueError:
        return None


def batches_to_read(first_seqs: Sequence[int], watermark: int) -> list[int]:
    """Which batch files a consumer at `watermark` must read: the one containing it, and all later.

    Pure, so the rule that keeps `read_since` from missing rows is tested without MLflow.
    """
    ordered = sorted(first_seqs)
    at_or_before = [s for s in ordered if s <= watermark]
    keep = [at_or_before[-1]] if at_or_before else []
    return keep + [s for s in ordered if s > watermark]
