"""Ray Data: ``read_parquet`` over the Parquet shards, ``iter_torch_batches`` with a local shuffle buffer.

``ray.init`` is part of opening the loader (every new training process pays it); the files are
read in a shuffled order (``shuffle="files"``) and rows mixed in a buffer of
``local_shuffle_buffer_size`` rows, the shuffle Ray's docs recommend over a full ``random_shuffle``
for speed.
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch
from common import SEED


def versions() -> str:
    """ray's version."""
    return f"ray {ray.__version__}, torch {torch.__version__}"


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """``opts["num_cpus"]``, ``opts["buffer_size"]``."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=opts["num_cpus"], include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_parquet(paths["shards"], shuffle="files")
    return ds.iter_torch_batches(
        batch_size=batch_size, local_shuffle_buffer_size=opts["buffer_size"], local_shuffle_seed=SEED,
    )


def batch_ids(batch: Any) -> Any:
    """The id column of a dict batch."""
    return batch["id"].numpy()


def close() -> None:
    """Stop the local Ray cluster this process started."""
    ray.shutdown()
