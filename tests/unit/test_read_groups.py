"""Read groups: consecutive small reads of the plan done as one task (NOTE [ Read groups ])."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naiad
from naiad.sources import Block
from naiad.stream.plan import GroupTask, ReadTask, group_tasks
from naiad.testing import check_resume


def reads_strategy() -> st.SearchStrategy[list[ReadTask]]:
    def build(spec: list[tuple[int, int, int]]) -> list[ReadTask]:
        out = []
        for i, (rows, lo, width) in enumerate(spec):
            lo = min(lo, rows - 1)
            hi = min(rows, lo + width)
            out.append(ReadTask(Block(f"f{i % 3}", i * 1000, i * 1000 + rows * 10, rows, 1), lo, hi))
        return out

    return st.lists(st.tuples(st.integers(1, 50), st.integers(0, 49), st.integers(1, 50)), max_size=30).map(build)


@settings(max_examples=200, deadline=None)
@given(reads_strategy(), st.integers(1, 120), st.integers(1, 2000))
def test_groups_keep_the_reads_in_order_within_limits(reads: list[ReadTask], max_rows: int, max_bytes: int) -> None:
    tasks = group_tasks(reads, max_rows, max_bytes)
    flat = [r for t in tasks for r in (t.reads if isinstance(t, GroupTask) else (t,))]
    assert flat == reads
    for t in tasks:
        if isinstance(t, GroupTask):
            assert len(t.reads) > 1 and t.rows <= max_rows
            assert sum(r.rows * 10 for r in t.reads) <= max_bytes
    # Greedy: a group ends only where the next read would take it past a bound.
    for t, after in pairwise(tasks):
        mine = t.reads if isinstance(t, GroupTask) else (t,)
        nxt = (after.reads if isinstance(after, GroupTask) else (after,))[0]
        assert sum(r.rows for r in mine) + nxt.rows > max_rows or sum(r.rows * 10 for r in (*mine, nxt)) > max_bytes


@settings(max_examples=200, deadline=None)
@given(reads_strategy(), st.data())
def test_parts_and_without_first_address_the_groups_rows(reads: list[ReadTask], data: st.DataObject) -> None:
    if len(reads) < 2:
        return
    group = GroupTask(tuple(reads))
    rows = [(r.block.path, r.block.start, int(n)) for r in reads for n in r.row_numbers()]
    k = data.draw(st.integers(0, group.rows - 1))
    rest = group.without_first(k)
    assert [(r.block.path, r.block.start, int(n)) for r in rest.reads for n in r.row_numbers()] == rows[k:]
    picked = np.array(sorted(data.draw(st.sets(st.integers(0, group.rows - 1), min_size=1))), np.int64)
    parts = group.parts(picked)
    assert [(r.block.path, r.block.start, int(n)) for r in parts for n in r.row_numbers()] == [rows[i] for i in picked]


def write_csvs(folder: Path, sizes: list[int], *, last_newline: bool = True) -> list[Path]:
    paths, start = [], 0
    for i, n in enumerate(sizes):
        body = "".join(f"{j},{j * 0.25},w{j % 7}\n" for j in range(start, start + n))
        if not last_newline:
            body = body.rstrip("\n")
        p = folder / f"part-{i}.csv"
        p.write_text("id,x,s\n" + body)
        paths.append(p)
        start += n
    return paths


def ids_of(loader: naiad.DataLoader) -> np.ndarray:
    return np.concatenate([b["id"].numpy() for b in loader])


def test_groups_span_files_without_a_final_newline(tmp_path: Path) -> None:
    paths = write_csvs(tmp_path, [300, 1, 250, 90], last_newline=False)
    source = naiad.read_csv([str(p) for p in paths], block_bytes=300)
    loader = naiad.DataLoader(source, batch_size=32, shuffle=True, seed=1, shuffle_buffer=400)
    tasks = loader._pipeline.open_pass(0, 0, None).stream.plan.tasks  # the plan, not its data
    assert any(isinstance(t, GroupTask) and len({r.block.path for r in t.reads}) > 1 for t in tasks)
    got = ids_of(loader)
    assert sorted(got.tolist()) == list(range(641))
    unshuffled = naiad.DataLoader(source, batch_size=50, shuffle_buffer=400)
    assert ids_of(unshuffled).tolist() == list(range(641))


def test_a_group_reads_what_its_parts_read(tmp_path: Path) -> None:
    (path,) = write_csvs(tmp_path, [500])
    source = naiad.read_csv(path, block_bytes=200)
    blocks = source.blocks()[:6]
    parts = [(b, 1, b.rows, None) for b in blocks[:3]] + [(b, 0, b.rows, np.array([0, 2])) for b in blocks[3:]]
    group = source.read_group(parts)
    one_by_one = [source.read_block(b, lo, hi) if take is None else source.read_rows(b, lo + take) for b, lo, hi, take in parts]
    assert group.columns["id"].tolist() == [v for d in one_by_one for v in d.columns["id"].tolist()]
    assert group.columns["s"] == [v for d in one_by_one for v in d.columns["s"]]


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_line_formats_group_too(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"d.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(f'{{"id": {i}}}\n' for i in range(700)))
        source: naiad.Source = naiad.read_jsonl(path, block_bytes=120)
    else:
        path.write_text("".join(f"{i}\n" if i % 50 else "\n" for i in range(700)))
        source = naiad.read_text(path, block_bytes=120)
    loader = naiad.DataLoader(source, batch_size=16, shuffle=True, seed=0, shuffle_buffer=300)
    batches = list(loader)
    if fmt == "jsonl":
        assert sorted(np.concatenate([b["id"].numpy() for b in batches]).tolist()) == list(range(700))
    else:
        lines = [x for b in batches for x in b["text"]]
        assert sorted(lines) == sorted(f"{i}" if i % 50 else "" for i in range(700))


def test_a_bad_row_in_a_group_is_named_exactly(tmp_path: Path) -> None:
    (path,) = write_csvs(tmp_path, [400])
    lines = path.read_text().splitlines(keepends=True)
    lines[237] = "236,not-a-number,w\n"  # file line 238
    path.write_text("".join(lines))
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=200), batch_size=64, shuffle_buffer=400)
    with pytest.raises(naiad.SourceError, match=r"line 238"):
        list(loader)
    skipping = naiad.DataLoader(naiad.read_csv(path, block_bytes=200, on_bad_rows="skip"), batch_size=64, shuffle_buffer=400)
    got = ids_of(skipping)
    assert sorted(got.tolist()) == [i for i in range(400) if i != 236]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_with_groups(tmp_path: Path, workers: int) -> None:
    paths = write_csvs(tmp_path, [900, 37, 600])
    files = [str(p) for p in paths]

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_csv(files, block_bytes=250), batch_size=40, shuffle=True, seed=5,
                                shuffle_buffer=500, num_workers=workers)

    check_resume(make, epochs=2, positions=[0.0, 0.3, 0.61, 1.0])


def write_parquets(tmp_path: Path, sizes: list[int], group_rows: int, null_at: int | None = None) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, first = [], 0
    for k, n in enumerate(sizes):
        ids = pa.array(range(first, first + n), pa.int64(), mask=np.arange(first, first + n) == null_at)
        table = pa.table({"id": ids, "x": pa.array(np.arange(first, first + n) * 0.5, pa.float32())})
        path = str(tmp_path / f"p{k}.parquet")
        pq.write_table(table, path, row_group_size=group_rows)
        out.append(path)
        first += n
    return out


def test_parquet_group_reads_row_groups_of_several_files_in_plan_order(tmp_path: Path) -> None:
    source = naiad.read_parquet(write_parquets(tmp_path, [130, 75], group_rows=20))
    blocks = source.blocks()
    picked = [blocks[9], blocks[2], blocks[7], blocks[2], blocks[0]]  # two files, out of order, one twice
    parts = [(b, 3 if i == 1 else 0, b.rows - (4 if i == 2 else 0), None) for i, b in enumerate(picked)]
    group = source.read_group(parts)
    one_by_one = [source.read_block(b, lo, hi) for b, lo, hi, _ in parts]
    for name in ("id", "x"):
        assert group.columns[name].tolist() == [v for d in one_by_one for v in d.columns[name].tolist()]


def test_parquet_group_with_a_missing_integer_names_the_row(tmp_path: Path) -> None:
    paths = write_parquets(tmp_path, [100], group_rows=10, null_at=57)
    loader = naiad.DataLoader(naiad.read_parquet(paths), batch_size=8, shuffle=True, seed=1, shuffle_buffer=200)
    with pytest.raises(naiad.SourceError, match=r"row 57"):
        list(loader)
    skipping = naiad.DataLoader(naiad.read_parquet(paths, on_bad_rows="skip"), batch_size=8, shuffle=True, seed=1,
                                shuffle_buffer=200)
    assert sorted(ids_of(skipping).tolist()) == [i for i in range(100) if i != 57]


def write_arrow(tmp_path: Path, batch_rows: list[int], name: str = "a.arrow") -> str:
    import pyarrow as pa

    path, first = str(tmp_path / name), 0
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    with pa.ipc.new_file(path, schema) as writer:
        for n in batch_rows:
            ids = np.arange(first, first + n)
            writer.write_batch(pa.record_batch([pa.array(ids), pa.array([f"r{i}" for i in ids])], schema=schema))
            first += n
    return path


def test_big_record_batches_become_slices_read_without_copying_the_rest(tmp_path: Path) -> None:
    path = write_arrow(tmp_path, [5000, 300, 2500])
    source = naiad.read_arrow(path, block_rows=1000)
    blocks = source.blocks()
    assert [b.rows for b in blocks] == [1000] * 5 + [300] + [833, 833, 834]
    assert [b.first_line for b in blocks][:7] == [0, 1000, 2000, 3000, 4000, 5000, 5300]
    for b in (blocks[3], blocks[6], blocks[8]):
        got = source.read_block(b, 10, 20).columns
        assert got["id"].tolist() == list(range(b.first_line + 10, b.first_line + 20))
        assert got["s"] == [f"r{i}" for i in range(b.first_line + 10, b.first_line + 20)]
    parts = [(blocks[7], 0, blocks[7].rows, None), (blocks[1], 5, 900, None), (blocks[5], 0, 300, np.array([3, 7]))]
    group = source.read_group(parts)
    assert group.columns["id"].tolist() == (list(range(6133, 6966)) + list(range(1005, 1900)) + [5003, 5007])
    assert naiad.read_arrow(path).blocks() == naiad.read_arrow(path, block_rows=None).blocks()
    with pytest.raises(naiad.ConfigError, match="block_rows"):
        naiad.read_arrow(path, block_rows=0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_arrow_slices_shuffle_every_row_once_and_resume(tmp_path: Path, workers: int) -> None:
    path = write_arrow(tmp_path, [3000, 1, 1700])

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_arrow(path, block_rows=128), batch_size=50, shuffle=True, seed=3,
                                shuffle_buffer=600, num_workers=workers)

    assert sorted(ids_of(make()).tolist()) == list(range(4701))
    check_resume(make, epochs=2, positions=[0.0, 0.45, 1.0])


def test_a_compressed_file_read_whole_is_never_grouped() -> None:
    small = [ReadTask(Block(f"s{i}", 0, 100, 10, 1), 0, 10) for i in range(3)]
    whole = [ReadTask(Block(f"w{i}.csv.gz", 0, -1, 10, 1), 0, 10) for i in range(2)]
    tasks = group_tasks([small[0], whole[0], whole[1], small[1], small[2]], max_rows=1000)
    assert [t if isinstance(t, ReadTask) else t.reads for t in tasks] == [
        small[0], whole[0], whole[1], (small[1], small[2])]
