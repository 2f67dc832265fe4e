"""The digest of a registered model version's files: recorded when the version becomes the champion,
checked by every replica before it loads the version.

Why: a registered model is a pickle, so whoever changes its files runs code in every replica that
loads it next. The MLflow proxy keeps finalized models' files immutable for every login but the
operator's (scanflow.tracking.mlflow_routes), but the artifact store can be reached around MLflow (a
shared volume, a bucket with its own credentials). The digest is the last check, where the code runs:
a replica refuses files that differ from what the Executor promoted, and says so.

The digest: SHA-256 over each file's relative path and SHA-256, in path order, of the folder MLflow
downloads for `models:/NAME/VERSION`, without the `registered_model_meta` file MLflow writes into
that download itself. Only the Executor's (and the operator's) MLflow login may set the tag.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DIGEST_TAG = "scanflow.model_digest"
# Written by MLflow into a models:/ download (the name and version), not part of the logged model.
_NOT_MODEL_FILES = frozenset({"registered_model_meta"})
_CHUNK = 1 << 20


class ModelIntegrityError(RuntimeError):
    """A model's files differ from the digest recorded when it was promoted."""


def tree_digest(root: str | Path) -> str:
    """`sha256:<hex>` of the files under `root` (paths and contents; empty folders do not count)."""
    root = Path(root)
    outer = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in _NOT_MODEL_FILES)
    for path in files:
        inner = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                inner.update(chunk)
        outer.update(path.relative_to(root).as_posix().encode() + b"\0" + inner.digest())
    return "sha256:" + outer.hexdigest()


def verify(local_path: str | Path, expected: str | None, what: str) -> str:
    """The digest of `local_path`; ModelIntegrityError when `expected` is given and differs."""
    got = tree_digest(local_path)
    if expected is not None and got != expected:
        raise ModelIntegrityError(f"{what}: its files do not match the digest recorded when it was promoted "
                                  f"({expected[:19]}..., found {got[:19]}...): refused to load")
    return got


def recorded_digest(name: str, version: str) -> str | None:
    """The digest recorded on `name` version `version`, or None (never promoted since digests exist)."""
    from mlflow import MlflowClient

    return MlflowClient().get_model_version(name, version).tags.get(DIGEST_TAG)


def record_digest(name: str, version: str) -> str:
    """Download `name` version `version`, record its digest as a version tag (once: an existing digest
    is kept, so a later promotion cannot bless files changed meanwhile) and return the digest."""
    import mlflow
    from mlflow import MlflowClient

    known = recorded_digest(name, version)
    if known is not None:
        return known
    with tempfile.TemporaryDirectory(prefix="scanflow-digest-") as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp)
        digest = tree_digest(local)
    MlflowClient().set_model_version_tag(name, version, DIGEST_TAG, digest)
    log.info("%s version %s: digest %s recorded", name, version, digest)
    return digest
