"""LitData: ``optimize`` the rows into its chunks, then ``StreamingDataset`` + ``StreamingDataLoader``.

``optimize`` calls a function per input (here a range of rows) that yields one sample per row, as
its docs show; ``StreamingDataset(shuffle=True)`` shuffles the chunk order and the rows within the
chunks each worker holds.
"""

from __future__ import annotations

from typing import Any

import litdata
import numpy as np
import pyarrow.parquet as pq
import torch
from common import FEATURES, ID, SEED


def versions() -> str:
    """litdata's version."""
    return f"litdata {litdata.__version__}, torch {torch.__version__}"


def rows_of(task: tuple[str, int]) -> Any:
    """One sample per row of a Parquet row group: {"x": float32 (9,), "id": int}."""
    path, group = task
    table = pq.ParquetFile(path).read_row_group(group)
    x = np.stack([table[name].to_numpy() for name in FEATURES], axis=1).astype(np.float32)
    ids = table[ID].to_numpy()
    for i in range(len(ids)):
        yield {"x": x[i], "id": int(ids[i])}


def convert(paths: dict[str, Any], opts: dict[str, Any]) -> None:
    """``optimize`` with ``opts["num_workers"]`` workers and chunks of ``opts["chunk_bytes"]``."""
    groups = pq.ParquetFile(paths["parquet"]).metadata.num_row_groups
    tasks = [(paths["parquet"], group) for group in range(groups)]
    litdata.optimize(
        fn=rows_of, inputs=tasks, output_dir=paths["out"], chunk_bytes=opts["chunk_bytes"],
        num_workers=opts["num_workers"], mode="overwrite", verbose=False,
    )


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """A ``StreamingDataLoader`` with ``opts["num_workers"]`` workers."""
    ds = litdata.StreamingDataset(paths["out"], shuffle=True, seed=SEED)
    return litdata.StreamingDataLoader(ds, batch_size=batch_size, num_workers=opts["num_workers"])


def batch_ids(batch: Any) -> Any:
    """The id column of a dict batch."""
    return batch["id"].numpy()
