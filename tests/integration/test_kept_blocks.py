"""Parsed blocks kept across epochs (NOTE [ Kept blocks ] in naiad/sources/decoded.py): later
epochs parse nothing, and yield exactly what a source that keeps nothing yields."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.parallel.context import WorkerContext
from naiad.sources.csv import CsvSource
from naiad.sources.decoded import KeptBlocks, default_keep_bytes, usable_memory
from naiad.sources.jsonl import JsonlSource
from naiad.sources.text import TextSource
from naiad.stream.plan import ReadTask
from naiad.stream.reads import make_handler_factory
from naiad.stream.shuffle import as_array
from tests.conftest_stream import GroupSpy

pytestmark = pytest.mark.timeout(120)

ROWS = 6000


def write_csv(path: Path, bad: dict[int, str] | None = None) -> str:
    bad = bad or {}
    path.write_text("id,x,name\n" + "".join(bad.get(i, f"{i},{i * 0.5},n{i % 7}") + "\n" for i in range(ROWS)))
    return str(path)


def write_jsonl(path: Path) -> str:
    path.write_text("".join(json.dumps({"id": i, "x": i * 0.5}) + "\n" for i in range(ROWS)))
    return str(path)


class ParseCounter:
    """Counts the parses of a line-based source class (every read path parses through it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> None:
        self.calls = 0
        original = getattr(cls, method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, method, counted)


def epochs(loader: naiad.DataLoader, n: int, counter: ParseCounter | None = None,
           first: int = 0) -> list[list[dict[str, Any]]]:
    out, parses = [], []
    for ep in range(first, first + n):
        loader.set_epoch(ep)
        before = counter.calls if counter else 0
        out.append([{k: (v.numpy().copy() if hasattr(v, "numpy") else list(v)) for k, v in b.items()} for b in loader])
        parses.append((counter.calls if counter else 0) - before)
    if counter is not None:
        counter.parses = parses  # type: ignore[attr-defined]
    return out


def assert_same(a: list[list[dict[str, Any]]], b: list[list[dict[str, Any]]]) -> None:
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb, strict=True):
            assert ba.keys() == bb.keys()
            for k in ba:
                if isinstance(ba[k], np.ndarray):
                    np.testing.assert_array_equal(ba[k], bb[k])
                else:
                    assert ba[k] == bb[k]


@pytest.mark.parametrize("read_ahead", [0, 2])
@pytest.mark.parametrize("shuffle", [True, False])
def test_later_epochs_parse_nothing_and_yield_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            read_ahead: int, shuffle: bool) -> None:
    path = write_csv(tmp_path / "d.csv")
    counter = ParseCounter(monkeypatch, CsvSource, "_parse_lines")

    def loader(keep: int | None) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_csv(path, block_bytes=4000, keep_parsed_bytes=keep), batch_size=256,
                                shuffle=shuffle, seed=3, shuffle_buffer=1000, read_ahead=read_ahead)

    kept_loader = loader(None)
    got = epochs(kept_loader, 3, counter)
    assert counter.parses[0] > 0 and counter.parses[1:] == [0, 0]  # type: ignore[attr-defined]
    kept = kept_loader.dataset.kept_blocks()
    assert kept is not None and len(kept) == len(kept_loader.dataset.blocks())

    counter.calls = 0
    want = epochs(loader(0), 3, counter)
    assert all(p > 0 for p in counter.parses)  # type: ignore[attr-defined]
    assert_same(got, want)
    ids = np.concatenate([b["id"] for b in got[2]])
    assert np.array_equal(np.sort(ids), np.arange(ROWS))


def test_jsonl_keeps_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "d.jsonl")
    counter = ParseCounter(monkeypatch, JsonlSource, "_read_group")
    got = epochs(naiad.DataLoader(naiad.read_jsonl(path, block_bytes=4000), batch_size=256, shuffle=True, seed=1,
                                  shuffle_buffer=1000), 2, counter)
    assert counter.parses[0] > 0 and counter.parses[1] == 0  # type: ignore[attr-defined]
    want = epochs(naiad.DataLoader(naiad.read_jsonl(path, block_bytes=4000, keep_parsed_bytes=0), batch_size=256,
                                   shuffle=True, seed=1, shuffle_buffer=1000), 2)
    assert_same(got, want)


def test_text_keeps_its_lines_and_counts_them_at_their_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.txt"
    path.write_text("".join(f"line {i} " + "é" * (i % 5) + "\n" for i in range(ROWS)), encoding="utf-8")
    counter = ParseCounter(monkeypatch, TextSource, "_read_group")

    def loader(keep: int | None) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_text(str(path), block_bytes=4000, keep_parsed_bytes=keep), batch_size=256,
                                shuffle=True, seed=2, shuffle_buffer=1000)

    kept_loader = loader(None)
    got = epochs(kept_loader, 3, counter)
    assert counter.parses[0] > 0 and counter.parses[1:] == [0, 0]  # type: ignore[attr-defined]
    assert_same(got, epochs(loader(0), 3))
    assert sorted(v for b in got[2] for v in b["text"]) == sorted(path.read_text(encoding="utf-8").splitlines())
    # The lines' memory: their UTF-8 bytes and 88 a line, not 8 bytes a row; a budget a byte
    # under it keeps nothing.
    source = naiad.read_text(str(path), block_bytes=4000)
    need = path.stat().st_size + 88 * ROWS
    assert source.parsed_bytes() == need
    for budget, keeps in ((need, True), (need - 1, False)):
        counted = naiad.read_text(str(path), keep_parsed_bytes=budget)
        counted.blocks()  # decided once the rows are counted
        assert (counted.kept_blocks() is not None) == keeps


def test_a_source_over_the_budget_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_csv(tmp_path / "d.csv")
    counter = ParseCounter(monkeypatch, CsvSource, "_parse_lines")
    # 6,000 rows of an int, a float and a string: about 6000 * (8 + 8 + 32) bytes.
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000, keep_parsed_bytes=100_000), batch_size=256,
                              shuffle=True, seed=0)
    epochs(loader, 2, counter)
    assert all(p > 0 for p in counter.parses)  # type: ignore[attr-defined]
    assert loader.dataset.kept_blocks() is None


def test_columnar_formats_keep_nothing_unless_asked(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"id": np.arange(ROWS)}), path, row_group_size=1000)
    source = naiad.read_parquet(path)
    source.blocks()
    assert source.kept_blocks() is None  # a Parquet read is a decode, not a parse
    asked = naiad.read_parquet(path)
    asked.keep_parsed_bytes = 1 << 20
    asked.blocks()
    assert asked.kept_blocks() is not None


def test_changing_a_batch_in_place_does_not_reach_the_kept_rows(tmp_path: Path) -> None:
    # Every 50th x is missing: its column is a writable copy (NaNs), not a read-only Arrow view.
    path = write_csv(tmp_path / "d.csv", {i: f"{i},,n" for i in range(0, ROWS, 50)})
    for shuffle in (False, True):
        loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000), batch_size=256, shuffle=shuffle, seed=0,
                                  shuffle_buffer=1000)
        first = []
        for b in loader:
            first.append(b["id"].clone())
            b["id"].mul_(-1)  # a user's in-place transform
            b["x"].zero_()
        loader.set_epoch(0)
        again = list(loader)
        assert all(a.equal(b["id"]) for a, b in zip(first, again, strict=True))
        for b in again:
            x, want = b["x"].numpy(), b["id"].numpy() * 0.5
            missing = b["id"].numpy() % 50 == 0
            assert np.isnan(x[missing]).all() and np.array_equal(x[~missing], want[~missing])


def test_blocks_with_a_skipped_row_are_parsed_again_and_ledgered_every_epoch(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "bad.csv", {17: "17,oops,n", 4000: "4000"})
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000, on_bad_rows="skip"), batch_size=256,
                              shuffle=True, seed=0, shuffle_buffer=1000, read_ahead=0)
    totals = []
    for ep in range(3):
        loader.set_epoch(ep)
        ids = np.concatenate([b["id"].numpy() for b in loader])
        assert np.array_equal(np.sort(ids), np.setdiff1d(np.arange(ROWS), [17, 4000]))
        totals.append(sum(loader.bad_rows.values()))
    assert totals == [2, 4, 6]  # two skipped rows reported by every epoch
    kept = loader.dataset.kept_blocks()
    assert kept is not None and 0 < len(kept) < len(loader.dataset.blocks())


def test_a_resume_in_a_later_epoch_reads_the_kept_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_csv(tmp_path / "d.csv")
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000), batch_size=256, shuffle=True, seed=5,
                              shuffle_buffer=1000)
    epochs(loader, 1)
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    rest = [b["id"].numpy().copy() for b in it]
    counter = ParseCounter(monkeypatch, CsvSource, "_parse_lines")
    loader.load_state_dict(state)
    resumed = [b["id"].numpy().copy() for b in loader]
    assert counter.calls == 0  # the buffer's rows and the rest of the epoch: all kept
    assert len(resumed) == len(rest) and all(np.array_equal(a, b) for a, b in zip(resumed, rest, strict=True))
    # A new process's loader (here: a new source) resumes to the same rows by parsing.
    fresh = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000), batch_size=256, shuffle=True, seed=5,
                             shuffle_buffer=1000)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert all(np.array_equal(a, b["id"].numpy()) for a, b in zip(rest, fresh, strict=True))
    assert counter.calls > 0


@pytest.mark.timeout(180)
def test_process_workers_keep_nothing_and_yield_the_same_rows(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv")
    ref = epochs(naiad.DataLoader(naiad.read_csv(path, block_bytes=4000, keep_parsed_bytes=0), batch_size=256,
                                  shuffle=True, seed=2, shuffle_buffer=1000), 2)
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=4000), batch_size=256, shuffle=True, seed=2,
                              shuffle_buffer=1000, num_workers=2, worker_mode="process", persistent_workers=True,
                              timeout=60)
    try:
        assert_same(epochs(loader, 2), ref)
    finally:
        loader.close()
    source = naiad.read_csv(path, block_bytes=4000)
    source.blocks()
    assert source.kept_blocks() is not None
    copy = pickle.loads(pickle.dumps(source))  # a copy decides again, and keeps its own
    copy.blocks()
    assert copy.kept_blocks() is not None and copy.kept_blocks() is not source.kept_blocks()
    # What a process worker builds its handler from: a copy that keeps nothing.
    handler = make_handler_factory(copy)(WorkerContext(0, 2, 0, "process"))
    block = copy.blocks()[0]
    columns, bad = handler(ReadTask(block, 0, block.rows))
    assert len(columns["id"]) == block.rows and not bad and copy.kept_blocks() is None
    # A thread worker's handler reads the loader's own source, which keeps.
    make_handler_factory(source)(WorkerContext(0, 2, 0, "thread"))(ReadTask(block, 0, block.rows))
    assert source.kept_blocks() is not None and len(source.kept_blocks()) == 1


def test_gather_joins_ranges_picks_and_lists() -> None:
    from naiad.sources.base import Block

    blocks = [Block("f", i, i + 1, n, 0) for i, n in enumerate([4, 6, 3])]
    kept = KeptBlocks(blocks, 1 << 20)
    cols = {"a": np.arange(10), "s": [f"s{i}" for i in range(10)], "e": np.arange(20.0).reshape(10, 2)}
    kept.put([(blocks[0], 4), (blocks[1], 6)], cols)  # one read of two blocks
    assert len(kept) == 2 and cols["a"].flags.writeable  # the read's own arrays are left alone
    whole = kept.gather([(blocks[1], 0, 6, None)])
    assert whole is not None and whole["a"].tolist() == [4, 5, 6, 7, 8, 9] and whole["s"][0] == "s4"
    whole["a"][:] = -1  # a copy: the kept rows stay
    got = kept.gather([(blocks[1], 1, 6, np.array([0, 3])), (blocks[0], 1, 3, None)])
    assert got is not None and got["a"].tolist() == [5, 8, 1, 2] and got["s"].tolist() == ["s5", "s8", "s1", "s2"]
    assert got["s"].dtype == object  # Python values as objects: a gather is a C loop
    assert got["e"].tolist() == [[10.0, 11.0], [16.0, 17.0], [2.0, 3.0], [4.0, 5.0]]
    many = kept.gather([(blocks[1], 2, 4, None), (blocks[0], 0, 1, None), (blocks[1], 5, 6, None)])
    assert many is not None and many["a"].tolist() == [6, 7, 0, 9]
    assert kept.gather([(blocks[0], 0, 4, None), (blocks[2], 0, 1, None)]) is None  # block 2 not kept
    kept.put([(blocks[2], 3)], {"a": np.arange(3) + 100, "s": ["x", "y", "z"], "e": np.zeros((3, 2))})
    last = kept.gather([(blocks[2], 0, 3, None), (blocks[0], 3, 4, None)])
    assert last is not None and last["a"].tolist() == [100, 101, 102, 3] and last["s"].tolist() == ["x", "y", "z", "s3"]
    # Nested values (a JSON list per row) stay one object a row.
    nested = KeptBlocks(blocks[:1], 1 << 20)
    nested.put([(blocks[0], 4)], {"v": [[1, 2], [3, 4], [5, 6], []]})
    got_nested = nested.gather([(blocks[0], 1, 4, None)])
    assert got_nested is not None and got_nested["v"].tolist() == [[3, 4], [5, 6], []]
    # A block whose column comes in another dtype than the first one kept is not kept (its bytes
    # would read as the other type).
    mixed = KeptBlocks(blocks[:2], 1 << 20)
    mixed.put([(blocks[0], 4)], {"a": np.arange(4)})
    mixed.put([(blocks[1], 6)], {"a": np.arange(6) + 0.5})
    assert len(mixed) == 1 and mixed.gather([(blocks[1], 0, 6, None)]) is None
    first = mixed.gather([(blocks[0], 0, 4, None)])
    assert first is not None and first["a"].dtype == np.int64 and first["a"].tolist() == [0, 1, 2, 3]
    # Only whole blocks: a part of one is not kept (its place is laid out for all its rows).
    mixed.put([(blocks[1], 5)], {"a": np.arange(5)})
    assert len(mixed) == 1
    # Columns over the budget: nothing is kept.
    small = KeptBlocks(blocks, 100)
    small.put([(blocks[0], 4)], {"a": np.arange(4.0)})
    assert len(small) == 0 and small.gather([(blocks[0], 0, 4, None)]) is None


def test_gather_reads_a_run_of_blocks_in_order() -> None:
    # NOTE [ Block runs ]: blocks that follow one another, read whole or in part, in order.
    from naiad.sources.base import Block

    blocks = [Block("f", i, i + 1, 3, 0) for i in range(40)]
    kept = KeptBlocks(blocks, 1 << 20)
    kept.put([(b, 3) for b in blocks], {"a": np.arange(120)})
    order = list(range(20, 40)) + list(range(0, 20))  # two runs of 20 blocks
    parts = [(blocks[i], 0, 3, None) for i in order]
    got = kept.gather(parts)
    assert got is not None and got["a"].tolist() == list(range(60, 120)) + list(range(60))
    scattered = [(blocks[i], 1, 3, None) for i in order]  # not one run: a range per block
    got = kept.gather(scattered)
    assert got is not None and got["a"].tolist() == [3 * i + k for i in order for k in (1, 2)]


def test_budget_defaults_and_checks(tmp_path: Path) -> None:
    assert 0 < default_keep_bytes() <= 1 << 30
    assert default_keep_bytes() <= usable_memory() // 16
    with pytest.raises(naiad.ConfigError, match="keep_parsed_bytes"):
        naiad.read_csv(write_csv(tmp_path / "d.csv"), keep_parsed_bytes=-1)



@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("read_ahead", [0, 2])
def test_a_pass_cut_short_parses_only_the_blocks_it_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fmt: str, read_ahead: int) -> None:
    path = write_csv(tmp_path / "d.csv") if fmt == "csv" else write_jsonl(tmp_path / "d.jsonl")

    def loader(keep: int | None) -> naiad.DataLoader:
        source = naiad.read(path, block_bytes=2000, keep_parsed_bytes=keep)
        return naiad.DataLoader(source, batch_size=256, shuffle=True, seed=4, shuffle_buffer=1000,
                                read_ahead=read_ahead)

    cut = loader(None)
    it = iter(cut)
    for _ in range(3):
        next(it)
    cut.close()  # a break, the read-ahead threads joined: some blocks were parsed and kept, most not
    kept = cut.dataset.kept_blocks()
    assert kept is not None
    left = kept.missing(cut.dataset.blocks())
    assert left is not None and 0 < len(left) < len(cut.dataset.blocks()) - 3
    spy = GroupSpy(monkeypatch, type(cut.dataset))
    got = epochs(cut, 1, first=1)
    # The groups parsed only blocks left, each once (a group that held a left block used to parse
    # all of its blocks), and every block is kept after epoch 1 (a single-block read parses
    # through ``_read``, not seen here).
    assert spy.blocks and set(spy.blocks) <= set(left) and len(spy.blocks) == len(set(spy.blocks))
    assert kept.missing(cut.dataset.blocks()) == []
    got += epochs(cut, 1, first=2)
    assert len(spy.blocks) == len(set(spy.blocks))  # epoch 2 parsed nothing
    assert_same(got, epochs(loader(0), 2, first=1))


def test_every_way_of_gathering_gives_the_columns_values_dtypes_and_copies() -> None:
    # One range, a few (joined slices), many (one index for all columns) and row picks, over
    # columns of every kind a reader hands over.
    from naiad.sources.base import Block

    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 9, size=60)
    blocks = [Block("f", i, i + 1, int(n), 0) for i, n in enumerate(sizes)]
    total = int(sizes.sum())
    cols: dict[str, Any] = {"id": np.arange(total), "x": rng.standard_normal(total).astype(np.float32),
                            "ok": rng.random(total) < 0.5, "u": np.arange(total, dtype=np.uint8),
                            "s": [f"s{i}" for i in range(total)], "e": np.arange(2.0 * total).reshape(total, 2),
                            "y": -rng.standard_normal(total).astype(np.float32), "t": [(i,) for i in range(total)],
                            "n": np.arange(total) * 7, "f": np.arange(4.0 * total).reshape(total, 2, 2)}
    kept = KeptBlocks(blocks, 1 << 20)
    kept.put([(b, b.rows) for b in blocks], cols)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    reads = [
        [(blocks[3], 0, blocks[3].rows, None)],  # one range
        [(blocks[b], 0, blocks[b].rows, None) for b in (7, 2, 9)],  # a few
        [(blocks[b], 0, blocks[b].rows, None) for b in rng.permutation(60)[:40].tolist()],  # many
        [(blocks[5], 0, blocks[5].rows, np.array([0])), (blocks[1], 0, 1, None)],  # row picks
    ]
    for parts in reads:
        want = np.concatenate([np.arange(starts[blocks.index(b)] + lo, starts[blocks.index(b)] + hi)
                               if take is None else starts[blocks.index(b)] + lo + take for b, lo, hi, take in parts])
        got = kept.gather(parts)
        assert got is not None and list(got) == list(cols)
        for name, col in cols.items():
            expect = as_array(col)[want]
            assert got[name].dtype == expect.dtype and np.array_equal(got[name], expect), name
            assert got[name].flags.c_contiguous and got[name].flags.writeable, name
        # Columns of one dtype share a stack (NOTE [ Kept blocks ]), each its own rows: a write to
        # one reaches neither its neighbours nor the kept rows.
        got["id"][:] = -1
        got["x"][:] = 0
        got["s"][:] = None
        assert got["n"].tolist() == (want * 7).tolist() and np.array_equal(got["y"], cols["y"][want])
        assert got["t"].tolist() == [(i,) for i in want.tolist()]
    again = kept.gather(reads[2])
    assert again is not None and again["id"].min() >= 0 and again["x"].any() and None not in again["s"].tolist()
