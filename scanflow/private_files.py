"""Files a stack writes are its user's alone: labels, prediction records, models, databases, spools
and tokens are assets (docs/security.md), and another account on the machine needs no token to read
a file left world-readable. Every process a stack starts gets PRIVATE_UMASK (its children inherit
it), and the stack's home is made 0700, so what any library inside creates is private too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # files 0600, folders 0700


def private_dir(path: Path) -> Path:
    """Create `path` (and its parents) if needed and make it 0700; return it."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def open_private_log(path: Path):  # type: ignore[no-untyped-def]  # -> BufferedWriter
    """`path` opened for appending bytes, created 0600 (whatever this process's umask): the logs a
    stack's processes write name its files, services and sometimes the data they refused."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, created (or left) 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def open_to_others(root: Path) -> list[str]:
    """Paths under `root` (itself included) that group or others may read, write or enter, each with
    its mode: what to fix (or what a test refuses) after a stack ran. A running stack creates and
    removes files as this walks (SQLite's -journal files come and go with each transaction), so a
    file gone between the listing and its stat is skipped: it can no longer be read by anyone."""
    found = []
    for path in [root, *_walk(root)]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(mode) and mode & (stat.S_IRWXG | stat.S_IRWXO):
            found.append(f"{path} {stat.S_IMODE(mode):o}")
    return found


def _walk(root: Path) -> list[Path]:
    """Everything under `root`; os.walk skips a folder removed while it walks (pathlib's rglob raises)."""
    return [Path(top, name) for top, dirs, files in os.walk(root) for name in [*dirs, *files]]
