"""`scanflow init NAME`: write a runnable workflow skeleton a team replaces piece by piece.

The skeleton is a package NAME/ (a Python identifier) with a training job that follows the contract
of docs/bring-your-own-model.md (a scikit-learn classifier on generated rows, its reference data
logged, extra labelled points trained on), a workflow declaring one service with a backup and the four
standard agents, and a README saying what to replace. It runs as written: `scanflow validate
NAME/workflow.py` and `scanflow up NAME/workflow.py` work before anything is changed, so a team starts
from a loop that closes and swaps in its own data and model.
Who calls: scanflow/cli.py (`init`).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
FILES = ("__init__.py", "data.py", "train.py", "workflow.py", "README.md")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


class ScaffoldError(ValueError):
    """The name or the target directory cannot take a skeleton; the message says why."""


def check_name(name: str) -> str:
    """Pure: `name` as a package and workflow name, or ScaffoldError. Lower case letters, digits and
    underscores (a Python package); the workflow, model and service take it with '-' for '_'."""
    if not _NAME_RE.match(name) or keyword.iskeyword(name) or name.endswith("_"):
        raise ScaffoldError(f"name {name!r}: use a lower-case Python identifier of at most 41 characters "
                            "(letters, digits, underscores; e.g. churn or fraud_v2)")
    return name


def render(name: str) -> dict[str, str]:
    """Pure: file name -> text of the skeleton for `name`."""
    check_name(name)
    dns = name.replace("_", "-")
    out = {}
    for f in FILES:
        text = (TEMPLATES / f"{f}.tmpl").read_text()
        out[f] = text.replace("{{package}}", name).replace("{{name}}", dns)
    return out


def write(name: str, parent: Path) -> Path:
    """Write the skeleton into parent/name (which must not exist or be empty); returns that directory."""
    files = render(name)
    target = parent / name
    if target.exists() and any(target.iterdir()):
        raise ScaffoldError(f"{target} exists and is not empty: pick another name or directory")
    target.mkdir(parents=True, exist_ok=True)
    for f, text in files.items():
        (target / f).write_text(text)
    return target
