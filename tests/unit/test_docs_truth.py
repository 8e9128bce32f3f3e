"""The maps stay true: every module docs/ARCHITECTURE.md and docs/WORKERS.md name exists, and
every ``NOTE [ ... ]`` a document or a comment cites is anchored in the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "naiad"
MAPS = ("docs/ARCHITECTURE.md", "docs/WORKERS.md")
ELSEWHERE = {"test/test_dataloader.py"}  # torch's own test file, in a PyTorch source tree
_PATH = re.compile(r"`((?:[A-Za-z_][\w-]*/)*[A-Za-z_][\w-]*\.py)`")
_NOTE = re.compile(r"NOTE \[ ([^\]\n]+?) \]")
# An anchor starts a note: on a line of its own, or followed by a colon (``# NOTE [ X ]: ...``).
_ANCHOR = re.compile(r"^\s*(?:#\s*)?NOTE \[ ([^\]\n]+?) \](?:\s*$|:)", re.M)


def _files() -> set[str]:
    """Every Python file of the project by its path from the repository root and by every tail
    of it (``naiad/sources/csv.py``, ``sources/csv.py``, ``csv.py``): a map names a module from
    its folder."""
    out: set[str] = set()
    for top in ("src", "tests", "bench", "scripts", "examples"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            out.update("/".join(parts[k:]) for k in range(len(parts)))
    return out


@pytest.mark.parametrize("doc", MAPS)
def test_every_module_a_map_names_exists(doc: str) -> None:
    files = _files() | ELSEWHERE
    named = set(_PATH.findall((ROOT / doc).read_text()))
    assert named, f"{doc} names no module: the pattern no longer fits it"
    missing = sorted(name for name in named if name not in files)
    assert not missing, f"{doc} names modules that do not exist: {missing}"


def test_every_note_cited_is_anchored_in_the_code() -> None:
    code = {p: p.read_text() for p in PACKAGE.rglob("*.py")}
    anchored = {note for text in code.values() for note in _ANCHOR.findall(text)}
    cited: dict[str, set[str]] = {}
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for note in _NOTE.findall(doc.read_text()):
            cited.setdefault(note, set()).add(doc.name)
    for path, text in code.items():
        for note in _NOTE.findall(text):
            cited.setdefault(note, set()).add(str(path.relative_to(PACKAGE)))
    missing = {note: sorted(where) for note, where in cited.items() if note not in anchored}
    assert not missing, f"notes cited but anchored nowhere in src/naiad: {missing}"


_STARTS_THREADS = re.compile(r"threading\.Thread\(|ThreadPoolExecutor\(|DaemonThreads\(")


def test_every_module_that_starts_threads_is_in_the_thread_list() -> None:
    # docs/WORKERS.md, "Threads, processes and waits": one row per module that starts a thread.
    text = (ROOT / "docs" / "WORKERS.md").read_text()
    section = text[text.index("### Threads, processes and waits"):]
    section = section[:section.index("\n## ")]
    listed = set(re.findall(r"^\| `([\w/]+\.py)`", section, re.M))
    starting = {
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
        if _STARTS_THREADS.search("\n".join(line for line in p.read_text().splitlines()
                                            if not line.lstrip().startswith((">>>", "#"))))
    }
    assert not starting - listed, f"modules that start threads, missing from docs/WORKERS.md: {sorted(starting - listed)}"
