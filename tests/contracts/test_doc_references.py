"""The repository's documents stand on their own: no file cites notes kept outside it, every relative
link in the Markdown documents points at a file that exists, and so does every Markdown document any
tracked text file names (`docs/serving.md`, `README.md`, or `scenarios.md` beside the file naming it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("*.py", "*.md", "*.ipynb", "*.yaml", "*.yml", "*.toml", "*.sh", "Makefile")
SKIP = (".venv", ".git", ".scanflow", ".bench-peers", "node_modules")  # environments and state, not ours
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bSTYLE\.md\b|\.\./shared/|\bdesign notes?\b", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
# a path ending in .md, not part of a longer word or path, and no glob or template (`*.md`, `<name>.md`)
MD_PATH = re.compile(r"(?<![\w./*<>{}-])((?:\.{1,2}/)?[\w.-]+(?:/[\w.-]+)*\.md)(?![\w/*>}-])")


def _files() -> list[Path]:
    found: set[Path] = set()
    for pattern in TEXT:
        found |= {p for p in ROOT.rglob(pattern) if not any(part in SKIP for part in p.relative_to(ROOT).parts)}
    return sorted(found)


def _tracked() -> list[Path]:
    """The tracked text files (git ls-files), else every text file under the root when git cannot say."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return _files()
    names = [n for n in out.split("\0") if n]
    return sorted(ROOT / n for n in names if any(Path(n).match(pattern) for pattern in TEXT)
                  and (ROOT / n).is_file())


def md_mentions(text: str) -> list[tuple[int, str]]:
    """Pure: (line, path) of every Markdown document `text` names, URLs left out."""
    text = URL.sub(lambda m: " " * len(m.group(0)), text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in MD_PATH.finditer(text)]


def test_md_mentions_finds_paths_and_skips_urls_and_globs() -> None:
    text = ("see docs/serving.md and README.md,\n(`../docs/x.md#anchor`) https://example.org/y/README.md\n"
            "not *.md nor <name>.md nor a.mdx, but ./z.md")
    assert md_mentions(text) == [(1, "docs/serving.md"), (1, "README.md"), (2, "../docs/x.md"), (3, "./z.md")]


def test_every_markdown_document_named_exists() -> None:
    """From the repository root or from the naming file's own folder, as a reader would look."""
    me = Path(__file__).resolve()
    missing = []
    for p in _tracked():
        if p.resolve() == me:
            continue
        for line, ref in md_mentions(p.read_text(errors="replace")):
            if OUTSIDE.search(ref):
                continue  # the test above reports those
            if not ((ROOT / ref).exists() or (p.parent / ref).exists()):
                missing.append(f"{p.relative_to(ROOT)}:{line}: {ref}")
    assert not missing, missing
    assert len(_tracked()) > 100  # the listing found the repository's files


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
