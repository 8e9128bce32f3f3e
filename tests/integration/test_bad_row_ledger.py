"""The ledger of bad rows: each skipped row named (file, line or row, column, reason), counts that
survive a resume, an exact resume after skipped rows, and ``max_bad_rows``."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.errors import SourceError
from naiad.sources import SkipBadRows

pytestmark = pytest.mark.timeout(120)

ROWS = 400
# data row -> (what the line holds, the column the problem is in, a word of the reason)
CSV_BAD = {6: ("6,oops", "b", "conversion error"), 97: ("97", None, "Expected 2 columns"),
           98: ("98,1,2", None, "Expected 2 columns"), 250: ("250,", "b", "missing value"),
           399: ("399,x", "b", "conversion error")}
JSONL_BAD = {0: ('{"a": 0, "b": ', None, "JSON"), 150: ('{"a": 150, "b": "x"}', "b", "changed from number to string"),
             151: ("not json", None, "JSON"), 300: ('{"a": 300}', "b", "missing value")}


def write_csv(directory: str) -> str:
    path = os.path.join(directory, "bad.csv")
    lines = ["a,b"] + [CSV_BAD[i][0] if i in CSV_BAD else f"{i},{i * 2}" for i in range(ROWS)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def write_jsonl(directory: str) -> str:
    path = os.path.join(directory, "bad.jsonl")
    lines = [JSONL_BAD[i][0] if i in JSONL_BAD else json.dumps({"a": i, "b": i * 2}) for i in range(ROWS)]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


FORMATS = {
    "csv": (write_csv, naiad.read_csv, CSV_BAD, 2),  # the header is line 1: data row i is line i + 2
    "jsonl": (write_jsonl, naiad.read_jsonl, JSONL_BAD, 1),
}


def loader_for(path: str, reader: Any, workers: int, **kw: Any) -> naiad.DataLoader:
    limit = kw.pop("max_bad_rows", None)
    src = reader(path, on_bad_rows=SkipBadRows(max_rows=limit), block_bytes=512)
    return naiad.DataLoader(src, batch_size=kw.pop("batch_size", 16), shuffle=True, seed=5, shuffle_buffer=48,
                            num_workers=workers, worker_mode="process", **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_ledger_names_every_skipped_row(tmp_path: Any, fmt: str, workers: int) -> None:
    write, reader, bad, first_line = FORMATS[fmt]
    path = write(str(tmp_path))
    loader = loader_for(path, reader, workers)
    batches = list(loader)
    assert len(batches) == len(loader)  # the plan's batch count, skipped rows or not
    got = sorted(int(v) for b in batches for v in b["a"].tolist())
    assert got == [i for i in range(ROWS) if i not in bad]  # every good row once
    stats = loader.stats()
    ledger = sorted(stats.bad_row_ledger, key=lambda e: e["line"])
    assert [e["line"] for e in ledger] == [i + first_line for i in sorted(bad)]
    for e, i in zip(ledger, sorted(bad), strict=True):
        text, column, word = bad[i]
        assert e["file"] == path and e["epoch"] == 0 and word in e["reason"], e
        assert e.get("column") == column, e
    assert stats.bad_rows == {path: len(bad)} and sum(stats.bad_row_reasons.values()) == len(bad)
    assert json.loads(json.dumps(stats.to_dict()))["bad_row_ledger"] == stats.bad_row_ledger


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_resume_after_skipped_rows_equals_the_uninterrupted_run(tmp_path: Any, fmt: str, workers: int) -> None:
    write, reader, bad, _ = FORMATS[fmt]
    path = write(str(tmp_path))
    whole_loader = loader_for(path, reader, workers)
    whole = [b["a"].tolist() for b in whole_loader]
    for k in (3, 11, len(whole) - 1):  # some bad rows delivered, some in the buffer, some unread
        loader = loader_for(path, reader, workers)
        it = iter(loader)
        head = [next(it)["a"].tolist() for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        assert state["pipeline"]["bad_rows"]["ledger"]["total"] == sum(loader.bad_rows.values())
        resumed = loader_for(path, reader, workers)
        resumed.load_state_dict(state)
        rest = [b["a"].tolist() for b in resumed]
        assert head + rest == whole, k
        # The ledger came with the state: after the resume it is the uninterrupted run's.
        assert resumed.stats().bad_row_ledger == whole_loader.stats().bad_row_ledger
        assert resumed.bad_rows == whole_loader.bad_rows == {path: len(bad)}


def test_elastic_resume_after_skipped_rows_delivers_every_good_row_once(tmp_path: Any) -> None:
    path = write_csv(str(tmp_path))
    loader = loader_for(path, naiad.read_csv, 0)
    it = iter(loader)
    head = [v for _ in range(7) for v in next(it)["a"].tolist()]
    state = loader.state_dict()
    del it
    rest = []
    for rank in range(3):  # another world size and batch size
        resumed = loader_for(path, naiad.read_csv, 0, batch_size=10, rank=rank, world_size=3)
        resumed.load_state_dict(state)
        batches = [b["a"].tolist() for b in resumed]
        rest += [v for b in batches for v in b]
    assert sorted(head + rest) == [i for i in range(ROWS) if i not in CSV_BAD]


def test_ranks_yield_equal_steps_whatever_they_skip(tmp_path: Any) -> None:
    path = write_csv(str(tmp_path))
    counts, rows = [], []
    for rank in range(2):
        for drop_last in (False, True):
            batches = list(loader_for(path, naiad.read_csv, 0, batch_size=24, rank=rank, world_size=2, drop_last=drop_last))
            counts.append((drop_last, len(batches)))
            if not drop_last:
                rows += [v for b in batches for v in b["a"].tolist()]
    assert counts[0] == counts[2] and counts[1] == counts[3]
    assert sorted(rows) == [i for i in range(ROWS) if i not in CSV_BAD]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("limit", "fails"), [(5, False), (4, True), (5 / ROWS, False), (4.5 / ROWS, True)])
def test_max_bad_rows_count_and_fraction(tmp_path: Any, workers: int, limit: float, fails: bool) -> None:
    path = write_csv(str(tmp_path))  # 5 bad rows of 400
    loader = loader_for(path, naiad.read_csv, workers, max_bad_rows=limit)
    if not fails:
        assert len([b for b in loader]) == len(loader)
        return
    with pytest.raises(SourceError) as info:
        list(loader)
    message = str(info.value)
    assert "5 bad rows skipped in epoch 0, past max_bad_rows" in message
    assert path in message and "the commonest reasons" in message and "conversion error" in message
    assert info.value.path == path


def test_max_bad_rows_needs_a_valid_value(tmp_path: Any) -> None:
    path = write_csv(str(tmp_path))
    for bad in (-1, 1.5, 0.0, "3", True):
        with pytest.raises(naiad.ConfigError, match="max_rows"):
            naiad.read_csv(path, on_bad_rows=SkipBadRows(max_rows=bad))  # type: ignore[arg-type]
    with pytest.raises(naiad.ConfigError, match="on_bad_rows"):
        naiad.read_csv(path, on_bad_rows={"max_rows": 3})  # type: ignore[arg-type]


def test_parquet_null_integers_are_ledgered_by_row(tmp_path: Any) -> None:
    path = os.path.join(str(tmp_path), "nulls.parquet")
    a = pa.array([None if i in (3, 70, 71) else i for i in range(100)], pa.int64())
    pq.write_table(pa.table({"a": a, "x": np.arange(100.0)}), path, row_group_size=32)
    loader = naiad.DataLoader(naiad.read_parquet(path, on_bad_rows="skip"), batch_size=8, shuffle=True, seed=1)
    got = sorted(int(v) for b in loader for v in b["x"].tolist())
    assert got == [i for i in range(100) if i not in (3, 70, 71)]
    ledger = sorted(loader.stats().bad_row_ledger, key=lambda e: e["row"])
    assert [(e["row"], e["column"]) for e in ledger] == [(3, "a"), (70, "a"), (71, "a")]


def write_many_bad(directory: str, files: int = 40, rows: int = 200) -> list[str]:
    """CSV files where every other row is bad (a column too many)."""
    paths = []
    for f in range(files):
        path = os.path.join(directory, f"many-{f}.csv")
        lines = ["a,b"] + [f"{i},{i}" if i % 2 else f"{i},{i},extra-{f}-{i}-{'x' * 40}" for i in range(rows)]
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_stays_a_few_kb_whatever_rows_were_skipped_and_resumes_exactly(tmp_path: Any, workers: int) -> None:
    paths = write_many_bad(str(tmp_path))  # 4,000 bad rows in 40 files: more (file, reason) pairs than a state keeps
    bad_total = 4000

    def make(max_bad_rows: int | None = None) -> naiad.DataLoader:
        src = naiad.read_csv(paths, on_bad_rows=SkipBadRows(max_rows=max_bad_rows))
        return naiad.DataLoader(src, batch_size=64, shuffle=True, seed=2, shuffle_buffer=500, num_workers=workers)

    whole_loader = make()
    whole = [b["a"].tolist() for b in whole_loader]
    assert whole_loader.stats().bad_row_ledger[:3] and sum(whole_loader.bad_rows.values()) == bad_total
    it = iter(loader := make())
    head = [next(it)["a"].tolist() for _ in range(len(whole) - 10)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    assert len(json.dumps(state)) < 8 * 1024  # it was 226 KB after 2,500 skipped rows
    ledger = state["pipeline"]["bad_rows"]["ledger"]
    assert ledger["total"] == state["pipeline"]["bad_rows"]["skipped"] == sum(n for _, _, n in ledger["counts"])
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b["a"].tolist() for b in resumed] == whole
    assert sum(resumed.bad_rows.values()) == bad_total  # the total is exact
    # max_bad_rows counts the resumed epoch's skips exactly: the same limit ends both runs.
    for limit, fails in ((bad_total, False), (bad_total - 1, True)):
        uninterrupted = make(max_bad_rows=limit)
        later = make(max_bad_rows=limit)
        later.load_state_dict(state)
        for run in (uninterrupted, later):
            if fails:
                with pytest.raises(SourceError, match=f"{bad_total:,} bad rows skipped in epoch 0"):
                    list(run)
            else:
                list(run)


def test_every_skipped_row_goes_to_the_bad_rows_logger(tmp_path: Any, caplog: Any) -> None:
    import logging

    paths = write_many_bad(str(tmp_path), files=2, rows=800)
    loader = naiad.DataLoader(naiad.read_csv(paths, on_bad_rows="skip"), batch_size=32)
    with caplog.at_level(logging.INFO, logger="naiad.bad_rows"):
        list(loader)
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "naiad.bad_rows"]
    assert len(logged) == 800 and {e["file"] for e in logged} == set(paths)
    assert all("Expected 2 columns" in e["reason"] for e in logged)
