"""The default shuffle buffer (``stream.default_buffer_rows``): room for two of a columnar
source's biggest blocks, or for every row when the source has few blocks and fits the budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.stream import options as stream  # where default_buffer_rows reads its budget
from naiad.stream.batches import DEFAULT_SHUFFLE_BUFFER_ROWS, FEW_BLOCKS, default_buffer_rows
from naiad.stream.shuffle import shuffle_quality


def parquet(path: Path, rows: int, group: int) -> str:
    pq.write_table(pa.table({"id": np.arange(rows, dtype=np.int64), "x": np.zeros(rows, np.float32)}), path,
                   row_group_size=group)
    return str(path)


def test_few_row_groups_that_fit_are_shuffled_whole(tmp_path: Path) -> None:
    path = parquet(tmp_path / "few.parquet", 200_000, 5_000)  # 40 groups
    assert default_buffer_rows(naiad.read_parquet(path)) == 200_000
    loader = naiad.DataLoader(naiad.read_parquet(path), batch_size=1000, shuffle=True, seed=0)
    order = np.concatenate([b["id"].numpy() for b in loader])
    assert np.array_equal(np.sort(order), np.arange(200_000))
    quality = shuffle_quality(order)
    # A full permutation: |corr| has a standard deviation of about 1/sqrt(n) = 0.002 here.
    assert abs(quality["position_correlation"]) < 0.02, quality
    spans = [(b.max() - b.min()) / 200_000 for b in np.split(order, 200)]
    assert np.median(spans) > 0.98


def test_many_row_groups_or_too_many_rows_keep_two_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    many = parquet(tmp_path / "many.parquet", 2 * FEW_BLOCKS * 1000, 1000)
    assert default_buffer_rows(naiad.read_parquet(many)) == DEFAULT_SHUFFLE_BUFFER_ROWS
    few = parquet(tmp_path / "few.parquet", 200_000, 50_000)
    monkeypatch.setattr(stream, "BUFFER_BYTES_BUDGET", 150_000 * 12)  # 12 bytes a row: 150,000 rows fit
    assert default_buffer_rows(naiad.read_parquet(few)) == DEFAULT_SHUFFLE_BUFFER_ROWS  # 2 x 50,000 < 131,072
    big = parquet(tmp_path / "big.parquet", 200_000, 100_000)
    assert default_buffer_rows(naiad.read_parquet(big)) == 150_000  # two groups, capped by the budget
    # Line-based sources keep the fixed default (their blocks are cut small).
    csv = tmp_path / "d.csv"
    csv.write_text("id\n" + "".join(f"{i}\n" for i in range(1000)))
    assert default_buffer_rows(naiad.read_csv(str(csv))) == DEFAULT_SHUFFLE_BUFFER_ROWS
