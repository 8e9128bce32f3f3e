"""WebDataset: tar shards whose samples are chunks of rows, shuffled by shard and by chunk.

Rows this small would cost a tar header (512 bytes) each as separate samples, so each sample holds
a chunk of ``chunk_rows`` rows as two .npy members, the layout WebDataset's docs suggest for small
records. ``opts["rows"]``: True for the row-level shuffle its docs show (unbatched, a row buffer,
batched again, in each worker); False for the block shuffle (a chunk is a batch).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import numpy as np
import torch
import webdataset as wds
from common import SEED, read_columns, row_ranges


def versions() -> str:
    """webdataset's version."""
    return f"webdataset {getattr(wds, '__version__', '?')}, torch {torch.__version__}"


def convert(paths: dict[str, Any], opts: dict[str, Any]) -> None:
    """Write ``opts["shards"]`` tar shards (whole chunks each) of ``opts["chunk_rows"]``-row samples."""
    x, ids = read_columns(paths["parquet"])
    os.makedirs(paths["out"], exist_ok=True)
    chunks = -(-len(ids) // opts["chunk_rows"])
    shard_rows = -(-chunks // opts["shards"]) * opts["chunk_rows"]
    for shard, (lo, hi) in enumerate(row_ranges(len(ids), shard_rows)):
        with wds.TarWriter(os.path.join(paths["out"], f"shard-{shard:05d}.tar")) as sink:
            for c_lo, c_hi in row_ranges(hi - lo, opts["chunk_rows"]):
                a, b = lo + c_lo, lo + c_hi
                sink.write({"__key__": f"{a:010d}", "x.npy": x[a:b], "id.npy": ids[a:b]})


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """A ``WebLoader`` over the shards with ``opts["num_workers"]`` workers."""
    urls = sorted(glob.glob(os.path.join(paths["out"], "*.tar")))
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), detshuffle=True, seed=SEED,
                       workersplitter=wds.split_by_worker)
        .shuffle(opts["chunk_buffer"], seed=SEED)
        .decode()
        .to_tuple("x.npy", "id.npy")
        .map_tuple(torch.from_numpy, torch.from_numpy)
    )
    if opts["rows"]:
        dataset = dataset.unbatched().shuffle(opts["row_buffer"], seed=SEED).batched(batch_size)
    return wds.WebLoader(dataset, batch_size=None, num_workers=opts["num_workers"])


def batch_ids(batch: Any) -> Any:
    """The id tensor of an ``(x, id)`` batch."""
    return np.asarray(batch[1])
