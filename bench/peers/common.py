"""What every peer adapter shares: the table's columns and reading them with PyArrow.

Adapters run in other virtual environments (bench/peers/requirements*.txt), so this module needs
only NumPy and PyArrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

FEATURES = [f"f{i}" for i in range(9)]
ID = "id"
SEED = 0


def read_columns(parquet: str) -> tuple[np.ndarray, np.ndarray]:
    """The whole table as (features float32 (n, 9), row ids int64 (n,))."""
    table = pq.read_table(parquet)
    x = np.stack([table[name].to_numpy() for name in FEATURES], axis=1).astype(np.float32, copy=False)
    return x, table[ID].to_numpy().astype(np.int64, copy=False)


def row_ranges(rows: int, step: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of ``step`` rows covering ``rows`` (the last may be short)."""
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]
