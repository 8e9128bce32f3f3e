"""Synthetic data for the streaming benchmarks: diabetes-shaped CSV/Parquet and wide float files.

Written with PyArrow in chunks, so making a multi-GB file takes seconds and little memory.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

DIABETES_COLUMNS = [
    "Pregnancies", "Glucose", "BloodPressure", "SkinThickness", "Insulin", "BMI",
    "DiabetesPedigreeFunction", "Age", "Outcome",
]
_CHUNK_ROWS = 1 << 20


def diabetes_chunk(rng: np.random.Generator, n: int) -> pa.Table:
    """``n`` rows shaped like the Pima diabetes data: 8 float features and a 0/1 label."""
    feats = [
        rng.integers(0, 17, n), rng.integers(40, 200, n), rng.integers(30, 120, n),
        rng.integers(0, 60, n), rng.integers(0, 600, n), np.round(rng.uniform(18, 60, n), 1),
        np.round(rng.uniform(0.07, 2.4, n), 3), rng.integers(21, 81, n),
    ]
    cols: dict[str, np.ndarray] = {name: np.asarray(v, np.float64) for name, v in zip(DIABETES_COLUMNS[:-1], feats)}
    cols["Outcome"] = rng.integers(0, 2, n)
    return pa.table(cols)


def write_diabetes_csv(path: str, target_bytes: int, seed: int = 0) -> int:
    """Write a diabetes-shaped CSV of at least ``target_bytes``; returns its row count."""
    rng = np.random.default_rng(seed)
    rows = 0
    with pa.OSFile(path, "wb") as sink:
        writer = None
        while sink.tell() < target_bytes:
            table = diabetes_chunk(rng, _CHUNK_ROWS)
            if writer is None:
                writer = pacsv.CSVWriter(sink, table.schema)
            writer.write_table(table)
            rows += table.num_rows
        if writer is not None:
            writer.close()
    return rows


def csv_to_parquet(csv_path: str, path: str, row_group_rows: int = 1 << 16) -> None:
    """Convert a CSV to Parquet with row groups of ``row_group_rows`` (streaming, bounded memory)."""
    reader = pacsv.open_csv(csv_path, read_options=pacsv.ReadOptions(block_size=64 << 20))
    with pq.ParquetWriter(path, reader.schema) as writer:
        for batch in reader:
            writer.write_table(pa.Table.from_batches([batch]), row_group_size=row_group_rows)


def write_wide(directory: str, rows: int, columns: int = 10, seed: int = 0, chunk_rows: int = 1 << 16) -> dict[str, str]:
    """``rows`` x ``columns`` float32 values as Parquet, Arrow IPC and one (rows, columns) .npy.

    Parquet twice: ``parquet`` in row groups of ``chunk_rows``, uncompressed (dictionary pages:
    a row group's 64 Ki random floats fit one dictionary), and ``parquet_defaults`` as
    ``pq.write_table`` / ``DataFrame.to_parquet`` write it (1 Mi-row groups, snappy, dictionary
    pages that fall back to PLAIN once the dictionary passes 1 MiB).
    """
    rng = np.random.default_rng(seed)
    names = [f"f{i}" for i in range(columns)]
    paths = {fmt: os.path.join(directory, f"wide.{fmt}") for fmt in ("parquet", "arrow", "npy")}
    paths["parquet_defaults"] = os.path.join(directory, "wide-defaults.parquet")
    schema = pa.schema([(n, pa.float32()) for n in names])
    arr = np.lib.format.open_memmap(paths["npy"], mode="w+", dtype=np.float32, shape=(rows, columns))
    with (pq.ParquetWriter(paths["parquet"], schema, compression="none") as pw,
          pq.ParquetWriter(paths["parquet_defaults"], schema) as dw,
          pa.ipc.new_file(paths["arrow"], schema) as aw):
        for lo in range(0, rows, _CHUNK_ROWS):  # _CHUNK_ROWS is PyArrow's default row group size
            n = min(_CHUNK_ROWS, rows - lo)
            block = rng.random((n, columns), dtype=np.float32)
            arr[lo : lo + n] = block
            table = pa.table({name: block[:, i] for i, name in enumerate(names)})
            pw.write_table(table, row_group_size=chunk_rows)
            dw.write_table(table)
            for batch in table.to_batches(max_chunksize=chunk_rows):
                aw.write_batch(batch)
    arr.flush()
    del arr
    return paths
