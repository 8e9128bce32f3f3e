"""Ragged columns (NOTE [ Ragged columns ] in sources/columns.py): a column whose rows are lists of
numbers of any length (a tokenizer's ``input_ids``) reaches the batch as a list of 1-D tensors,
each row's own values, through the shuffle buffer, process workers and a resume; a row NumPy
cannot hold (a null row, a missing integer) is a bad row named by file, row and column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

import naiad
from naiad.errors import SourceError
from naiad.sources.columns import missing_values, table_to_columns
from naiad.stream.batching import ragged_tensors, to_torch
from naiad.stream.options import (
    BUFFER_BYTES_BUDGET,
    DEFAULT_SHUFFLE_BUFFER_ROWS,
    MIN_SAMPLE_BUFFER_ROWS,
    default_buffer_rows,
)
from naiad.testing import check_resume

ROWS = 300


def values(k: int, kind: str) -> list[Any]:
    """Row ``k``'s list: its own length (empty for every 7th row) and values."""
    n = 0 if k % 7 == 0 else 1 + k * 5 % 23
    if kind == "bool":
        return [(k + i) % 3 == 0 for i in range(n)]
    if kind.startswith("float"):
        return [k + i / 4 for i in range(n)]
    return [k * (200 if kind == "uint16" else 1000) + i for i in range(n)]


TYPES = {"int32": pa.list_(pa.int32()), "int64": pa.large_list(pa.int64()), "float32": pa.list_(pa.float32()),
         "bool": pa.list_(pa.bool_()), "uint16": pa.list_(pa.uint16())}
TORCH = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32, "bool": torch.bool, "uint16": torch.uint16}


def write(path: Path, fmt: str, kind: str = "int32", rows: list[Any] | None = None) -> str:
    rows = [values(k, kind) for k in range(ROWS)] if rows is None else rows
    table = pa.table({"k": pa.array(range(len(rows)), pa.int64()), "ids": pa.array(rows, TYPES[kind])})
    out = str(path / f"d.{fmt}")
    if fmt == "parquet":
        pq.write_table(table, out, row_group_size=64)
    elif fmt == "arrow":
        feather.write_feather(table, out, chunksize=64, compression="uncompressed")
    else:
        with open(out, "w") as f:
            f.writelines(json.dumps({"k": k, "ids": r}) + "\n" for k, r in enumerate(rows))
    return out


def read(path: str, **kwargs: Any) -> Any:
    reader = {"parquet": naiad.read_parquet, "arrow": naiad.read_arrow, "jsonl": naiad.read_jsonl}[path.rsplit(".", 1)[1]]
    return reader(path, **kwargs)


def rows_of(loader: Any) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for batch in loader:
        assert isinstance(batch["ids"], list) and len(batch["ids"]) == len(batch["k"])
        for k, row in zip(batch["k"].tolist(), batch["ids"], strict=True):
            assert k not in out, f"row {k} twice"
            out[k] = row
    return out


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
@pytest.mark.parametrize("kind", list(TYPES))
def test_ragged_rows_arrive_as_tensors_of_their_own_values(tmp_path: Path, fmt: str, kind: str) -> None:
    if fmt == "jsonl" and kind != "int32":
        pytest.skip("JSON has one integer type and one float type")
    path = write(tmp_path, fmt, kind)
    got = rows_of(naiad.DataLoader(read(path), batch_size=32, shuffle=True, seed=3))
    assert sorted(got) == list(range(ROWS))
    want_dtype = torch.int64 if fmt == "jsonl" else TORCH[kind]
    for k, row in got.items():
        assert row.dtype == want_dtype and row.ndim == 1
        assert row.tolist() == values(k, kind)


def test_ragged_rows_cross_process_workers_exactly(tmp_path: Path) -> None:
    path = write(tmp_path, "parquet")
    loader = naiad.DataLoader(read(path), batch_size=16, shuffle=True, seed=1, num_workers=2, worker_mode="process")
    got = rows_of(loader)
    assert sorted(got) == list(range(ROWS))
    assert all(row.tolist() == values(k, "int32") for k, row in got.items())


def test_a_ragged_stream_resumes_exactly(tmp_path: Path) -> None:
    path = write(tmp_path, "parquet")
    report = check_resume(lambda: naiad.DataLoader(read(path), batch_size=24, shuffle=True, seed=5,
                                                   shuffle_buffer=100), epochs=1)
    assert report.batches_per_epoch == (13,) and report.batches_compared > 13


def test_a_batch_owns_its_values_and_views_nothing_of_the_file(tmp_path: Path) -> None:
    table = pa.table({"ids": pa.array([values(k, "int32") for k in range(40)], TYPES["int32"])}).slice(5, 20)
    column = table_to_columns(table)["ids"]  # each row a view of the slice's values, from its offset
    assert column.dtype == object and [r.tolist() for r in column] == [values(k, "int32") for k in range(5, 25)]
    rows = ragged_tensors(column[::-1].tolist())
    assert [r.tolist() for r in rows] == [values(k, "int32") for k in range(24, 4, -1)]
    rows[1][:] = -1  # one copy of the batch's values: writable, and no other row or the file changes
    assert rows[0].tolist() == values(24, "int32") and column[-2].tolist() == values(23, "int32")
    assert ragged_tensors(column[:0].tolist()) == []


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_a_row_numpy_cannot_hold_is_a_bad_row_named(tmp_path: Path, fmt: str) -> None:
    rows: list[Any] = [values(k, "int32") for k in range(ROWS)]
    rows[70], rows[131] = None, [1, None, 3]
    path = write(tmp_path, fmt, rows=rows)
    with pytest.raises(SourceError, match=r"missing value in list column 'ids'") as info:
        list(naiad.DataLoader(read(path), batch_size=32))
    text = str(info.value)
    assert path in text and ("line 71" in text if fmt == "jsonl" else "row 70" in text)
    loader = naiad.DataLoader(read(path, on_bad_rows="skip"), batch_size=32, shuffle=True, seed=2)
    got = rows_of(loader)
    assert sorted(got) == [k for k in range(ROWS) if k not in (70, 131)]
    assert all(row.tolist() == rows[k] for k, row in got.items())
    assert loader.stats().bad_rows[path] == 2


def test_a_missing_float_is_nan_and_the_row_is_kept(tmp_path: Path) -> None:
    rows: list[Any] = [values(k, "float32") for k in range(ROWS)]
    rows[8] = [1.5, None, 2.5]
    got = rows_of(naiad.DataLoader(read(write(tmp_path, "parquet", "float32", rows)), batch_size=32))
    assert len(got) == ROWS
    np.testing.assert_array_equal(got[8].numpy(), np.array([1.5, np.nan, 2.5], np.float32))


def test_missing_values_marks_only_what_numpy_cannot_hold() -> None:
    ints = pa.array([[1], None, [2, None], [], [3]], pa.list_(pa.int32()))
    assert missing_values(ints).tolist() == [False, True, True, False, False]
    assert missing_values(ints.slice(2)).tolist() == [True, False, False]
    assert missing_values(pa.chunked_array([ints.slice(0, 2), ints.slice(2)])).tolist() == [False, True, True, False, False]
    assert missing_values(pa.array([[1.0, None], []], pa.list_(pa.float64()))) is None  # NaN
    assert missing_values(pa.array([[1], [2]], pa.list_(pa.int8()))) is None
    assert missing_values(pa.array([["a"], None], pa.list_(pa.string()))) is None  # a list of Python values
    assert missing_values(pa.array([1, None], pa.int64())).tolist() == [False, True]


def test_pack_xy_names_a_ragged_column_it_cannot_pack(tmp_path: Path) -> None:
    loader = naiad.DataLoader(read(write(tmp_path, "parquet")), batch_size=8, transform=naiad.pack_xy(label="k"))
    with pytest.raises(naiad.errors.ConfigError, match=r"column 'ids' is not one tensor \(rows of unequal length\)"):
        next(iter(loader))


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_the_default_buffer_counts_ragged_rows_at_their_bytes(tmp_path: Path, fmt: str) -> None:
    """Rows of 8,192 token ids (32 KiB) would make the 131,072-row default 4 GiB: the buffer is
    sized by the file's bytes per row instead, within the same budget."""
    rows = [list(range(k, k + 8192)) for k in range(300)]
    src = read(write(tmp_path, fmt, "int32", rows))
    assert 32 << 10 <= src.sample_bytes() < 40 << 10
    buffer = default_buffer_rows(src)
    assert MIN_SAMPLE_BUFFER_ROWS <= buffer < DEFAULT_SHUFFLE_BUFFER_ROWS and buffer * (32 << 10) <= BUFFER_BYTES_BUDGET
    (tmp_path / "small").mkdir()
    small = read(write(tmp_path / "small", fmt, "int32", [[k] for k in range(300)]))  # a few bytes a row: the usual floor
    assert default_buffer_rows(small) == DEFAULT_SHUFFLE_BUFFER_ROWS


def test_object_columns_of_other_arrays_keep_their_rows() -> None:
    """A worker-side transform may leave arrays of any shape in a column: each row is still its own."""
    def column(*rows: Any) -> np.ndarray:
        out = np.empty(len(rows), object)
        out[:] = list(rows)
        return out

    images = column(np.ones((2, 3), np.uint8), np.zeros((4, 3), np.uint8))  # alike past the first axis
    got = to_torch({"c": images})["c"]
    assert [tuple(t.shape) for t in got] == [(2, 3), (4, 3)] and got[0].dtype == torch.uint8
    for rows in [column(np.ones((2, 3)), np.ones((2, 5))),  # unlike past it: the arrays as they are
                 column(np.array(["a", "bc"]), np.array(["d"])),  # not numbers
                 column(np.array([1, 2]), [3, 4])]:  # not all arrays
        got = to_torch({"c": rows})["c"]
        assert len(got) == 2 and all(g is r for g, r in zip(got, rows, strict=True))
    assert to_torch({"c": column(b"x", b"yz")})["c"] == [b"x", b"yz"]
