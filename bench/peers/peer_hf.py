"""Hugging Face ``datasets``: map-style from its Arrow files, and ``streaming=True`` from Parquet.

Map-style: ``Dataset.from_parquet(...).save_to_disk(out)`` once (the conversion), then
``load_from_disk(out)`` under torch's ``DataLoader(shuffle=True)``, which fetches each batch with one
``__getitems__``. Streaming: ``load_dataset("parquet", data_files=..., streaming=True)
.shuffle(seed, buffer_size)`` over the table split into Parquet shards (a single file is a single
shard, and a shard is the unit its workers split; the Hub's datasets come sharded).

Both leave the rows in the library's default (Python) format for torch's ``default_collate`` to
batch: ``with_format("torch")``, as the docs show, made each row a set of tensors and was about 4x
slower on this machine (map-style 7.3k against 31k rows/s over 20k rows, streaming 290 against
1,230 over one 12.5k-row shard, one process); ``opts["format"]`` chooses it.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import datasets
import torch
from common import SEED
from torch.utils.data import DataLoader


def versions() -> str:
    """datasets' version."""
    return f"datasets {datasets.__version__}, torch {torch.__version__}"


def convert(paths: dict[str, Any], opts: dict[str, Any]) -> None:
    """Map-style only: the Parquet file into the Arrow files ``load_from_disk`` maps."""
    cache = os.path.join(paths["out"], "cache")
    datasets.Dataset.from_parquet(paths["parquet"], cache_dir=cache).save_to_disk(os.path.join(paths["out"], "arrow"))


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """``opts["streaming"]``: False for map-style, True for the iterable with a shuffle buffer."""
    generator = torch.Generator().manual_seed(SEED)
    if not opts["streaming"]:
        ds = datasets.load_from_disk(os.path.join(paths["out"], "arrow")).with_format(opts.get("format"))
        return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=opts["num_workers"], generator=generator)
    files = sorted(glob.glob(os.path.join(paths["shards"], "*.parquet")))
    stream = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    stream = stream.shuffle(seed=SEED, buffer_size=opts["buffer_size"]).with_format(opts.get("format"))
    workers = min(opts["num_workers"], stream.num_shards)
    return DataLoader(stream, batch_size=batch_size, num_workers=workers)


def batch_ids(batch: Any) -> Any:
    """The id column of a dict batch."""
    return batch["id"].numpy()
