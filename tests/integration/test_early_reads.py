"""Reads that start while a fresh line-based source is still being counted (NOTE [ Early reads ]
in naiad/stream/early.py): the same batches as a counted source gives, errors that name the right
line, and a state, a len() and a resume in the middle of it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import naiad
import naiad.stream.early as early_mod
from naiad.sources.base import Source
from naiad.stream.early import EarlyReads
from tests.conftest_stream import GroupSpy

pytestmark = pytest.mark.timeout(120)

ROWS = 5000


def write(path: Path, fmt: str, bad_line: int | None = None, rows: int = ROWS) -> str:
    """Rows whose ``id`` is their number, blank lines (CRLF ones too) between some of them."""
    lines = []
    for i in range(rows):
        if fmt == "csv":
            lines.append("oops,1,2,3" if bad_line is not None and i == bad_line else f"{i},{i * 0.5},n{i % 7}")
        elif fmt == "jsonl":
            lines.append(json.dumps({"id": i, "x": i * 0.5}))
        else:
            lines.append(f"row {i}")
        if fmt != "text" and i % 97 == 5:
            lines.append("" if i % 2 else "\r")
    head = "id,x,name\n" if fmt == "csv" else ""
    path.write_text(head + "\n".join(lines) + "\n", newline="")
    return str(path)


class Gate:
    """Holds every row count of a Source until opened, and remembers the early reads made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.made: list[EarlyReads] = []
        cut = Source._cut_files
        start = EarlyReads.start.__func__  # type: ignore[attr-defined]

        def held(source: Source) -> Any:
            assert self.open.wait(60), "the gate was never opened"
            return cut(source)

        def spied(cls: type, *args: Any, **kwargs: Any) -> EarlyReads | None:
            made = start(cls, *args, **kwargs)
            if made is not None:
                self.made.append(made)
            return made

        monkeypatch.setattr(Source, "_cut_files", held)
        monkeypatch.setattr(EarlyReads, "start", classmethod(spied))
        monkeypatch.setattr(early_mod, "EARLY_MIN_BYTES", 0)


    def open_after_an_early_read(self, timeout: float = 30.0) -> None:
        """Open once an early read has been made (or ``timeout`` passed: the test then fails on
        its check of the early reads), not after a fixed delay a loaded machine can overrun."""
        deadline = time.monotonic() + timeout
        while not (self.made and self.made[0].early) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.open.set()


def ids(batches: Iterator[Any], key: str) -> list[Any]:
    return [b[key].tolist() if hasattr(b[key], "tolist") else list(b[key]) for b in batches]


def source_of(path: str, fmt: str, block_bytes: int = 512) -> naiad.Source:
    # No block index: a count would find its entry there and need no early reads.
    if fmt == "csv":
        return naiad.read_csv(path, block_bytes=block_bytes, index_dir=False)
    if fmt == "jsonl":
        return naiad.read_jsonl(path, block_bytes=block_bytes, index_dir=False)
    return naiad.read_text(path, block_bytes=block_bytes, index_dir=False)


def loader_of(source: naiad.Source, **kwargs: Any) -> naiad.DataLoader:
    kwargs.setdefault("shuffle", True)
    if kwargs["shuffle"]:
        kwargs.setdefault("shuffle_buffer", 300)
    return naiad.DataLoader(source, batch_size=kwargs.pop("batch_size", 32), seed=5, **kwargs)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text"])
@pytest.mark.parametrize("options", [
    {}, {"shuffle": False}, {"drop_last": True, "batch_size": 33}, {"num_workers": 2},
    {"num_workers": 2, "worker_mode": "process"},
])
def test_early_reads_give_the_counted_sources_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str,
                                                      options: dict[str, Any]) -> None:
    # In order, a read group is 64 Ki rows: the early ones need more than two of them.
    rows, block_bytes = (ROWS, 512) if options.get("shuffle", True) else (150_000, 16 << 10)
    path = write(tmp_path / f"data.{fmt}", fmt, rows=rows)
    key = "text" if fmt == "text" else "id"
    counted = source_of(path, fmt, block_bytes)
    counted.blocks()  # counted first: no early reads
    want = ids(iter(loader_of(counted, **options)), key)
    gate = Gate(monkeypatch)
    loader = loader_of(source_of(path, fmt, block_bytes), **options)
    it = iter(loader)
    if options.get("shuffle", True):
        got = ids(iter([next(it), next(it)]), key)  # before any row is counted
        gate.open.set()
    else:  # the pool asks for a second group, which the first half of the blocks does not hold
        threading.Thread(target=gate.open_after_an_early_read, daemon=True).start()
        got = []
    got += ids(it, key)
    assert got == want
    (made,) = gate.made
    assert made.early, "no read was made before the count ended"
    assert made.plan is not None and len(loader) == made.plan.num_batches == len(want)


def test_an_early_reads_error_names_the_planned_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every block has a bad row, so the first read fails while the count is held: read again
    # once it ends, the error names the file's own line (the early blocks know none).
    path = tmp_path / "bad.csv"
    path.write_text("id,x\n" + "".join(f"{i},{i}\n" if i % 5 else f"{i},{i},extra\n" for i in range(1, ROWS)))

    def first_error(source: naiad.Source) -> str:
        with pytest.raises(naiad.SourceError) as caught:
            for _ in loader_of(source):  # not list(): it asks len() first, which counts the rows
                pass
        return str(caught.value).split("\nnaiad: raised in")[0]

    counted = naiad.read_csv(str(path), block_bytes=512, index_dir=False)
    counted.blocks()
    want = first_error(counted)
    gate = Gate(monkeypatch)
    threading.Thread(target=gate.open_after_an_early_read, daemon=True).start()
    got = first_error(naiad.read_csv(str(path), block_bytes=512, index_dir=False))
    assert gate.made and gate.made[0].early
    assert got == want and "Expected 2 columns, got 3" in got, got


def test_a_state_taken_during_early_reads_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "data.csv", "csv")
    want = ids(iter(loader_of(source_of(path, "csv"))), "id")
    gate = Gate(monkeypatch)
    loader = loader_of(source_of(path, "csv"))
    it = iter(loader)
    got = ids(iter([next(it) for _ in range(3)]), "id")
    threading.Timer(0.3, gate.open.set).start()  # the state waits for the count
    state = json.loads(json.dumps(loader.state_dict()))
    assert gate.made and gate.made[0].early
    resumed = loader_of(source_of(path, "csv"))
    resumed.load_state_dict(state)
    got += ids(iter(resumed), "id")
    assert got == want
    assert sorted(np.concatenate(got).tolist()) == list(range(ROWS))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_next_epoch_parses_only_the_blocks_read_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          fmt: str) -> None:
    # Early reads come before the parsed blocks can be kept (the store's size needs the count):
    # the next epoch parses those blocks alone, not every read group that holds one of them.
    path = write(tmp_path / f"data.{fmt}", fmt)
    want = ids(iter(loader_of(source_of(path, fmt), read_ahead=0)), "id")
    gate = Gate(monkeypatch)
    source = source_of(path, fmt)
    loader = loader_of(source, read_ahead=0)
    it = iter(loader)
    got = ids(iter([next(it), next(it)]), "id")
    gate.open.set()
    got += ids(it, "id")
    assert got == want and gate.made[0].early
    kept = source.kept_blocks()
    assert kept is not None
    left = kept.missing(source.blocks())
    assert left

    spy = GroupSpy(monkeypatch, type(source))
    loader.set_epoch(1)
    again = ids(iter(loader), "id")
    assert sorted(np.concatenate(again).tolist()) == list(range(ROWS))
    assert spy.blocks and set(spy.blocks) <= set(left) and len(spy.blocks) == len(set(spy.blocks))
    assert kept.missing(source.blocks()) == []


def test_files_whose_headers_differ_fail_before_a_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path / "a.csv", "csv")
    b = tmp_path / "b.csv"
    b.write_text(Path(a).read_text().replace("id,x,name", "id,y,name", 1))
    Gate(monkeypatch).open.set()
    with pytest.raises(naiad.SourceError, match="differs from the first file"):
        next(iter(loader_of(naiad.read_csv([a, str(b)], block_bytes=512, index_dir=False))))


def test_a_small_or_indexed_source_is_counted_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "data.csv", "csv")
    gate = Gate(monkeypatch)
    gate.open.set()

    def epoch(source: naiad.Source) -> None:
        for _ in loader_of(source):
            pass

    monkeypatch.setattr(early_mod, "EARLY_MIN_BYTES", 1 << 40)
    epoch(source_of(path, "csv"))
    monkeypatch.setattr(early_mod, "EARLY_MIN_BYTES", 0)
    epoch(naiad.read_csv(path, block_bytes=512, index_dir=tmp_path / "index"))  # writes the entry
    epoch(naiad.read_csv(path, block_bytes=512, index_dir=tmp_path / "index"))  # reads it
    assert len(gate.made) == 1  # the first indexed one only


def test_a_count_that_fails_fails_the_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The count beside the reads raises (the file changed under it): the loop gets the error once
    # the early reads need the plan, and does not wait for ever.
    path = write(tmp_path / "data.csv", "csv")
    gate = Gate(monkeypatch)

    def broken(source: Source) -> Any:
        assert gate.open.wait(60)
        raise naiad.SourceError("the file changed while it was counted", path=path)

    monkeypatch.setattr(Source, "_cut_files", broken)
    loader = loader_of(source_of(path, "csv"))
    it = iter(loader)
    next(it)  # an early batch
    gate.open.set()
    with pytest.raises(naiad.SourceError, match="changed while it was counted"):
        for _ in it:
            pass
    assert gate.made and gate.made[0].early
