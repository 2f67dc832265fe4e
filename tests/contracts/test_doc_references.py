"""The repository's documents stand on their own: no file cites notes kept outside it, and every relative
link in the Markdown documents points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("*.py", "*.md", "*.ipynb", "*.yaml", "*.yml", "*.toml", "Makefile")
SKIP = (".venv", ".git", ".scanflow", "node_modules")
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bSTYLE\.md\b|\.\./shared/")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _files() -> list[Path]:
    found: set[Path] = set()
    for pattern in TEXT:
        found |= {p for p in ROOT.rglob(pattern) if not any(part in SKIP for part in p.relative_to(ROOT).parts)}
    return sorted(found)


def test_no_file_cites_notes_outside_the_repository() -> None:
    me = Path(__file__).resolve()
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in _files() if p.resolve() != me
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad, bad


def test_relative_markdown_links_resolve() -> None:
    broken = []
    for p in [f for f in _files() if f.suffix == ".md"]:
        for target in LINK.findall(p.read_text(errors="replace")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (p.parent / target).exists():
                broken.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not broken, broken
