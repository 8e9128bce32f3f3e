"""torch ``DataLoader`` and torchdata ``StatefulDataLoader`` over a ``TensorDataset`` in memory.

The table is read from the Parquet file into two tensors when the loader is opened (counted in
the time to the first batch: a user of a TensorDataset pays it in every new process).
"""

from __future__ import annotations

from typing import Any

import torch
from common import SEED, read_columns
from torch.utils.data import DataLoader, TensorDataset


def versions() -> str:
    """torch's version, and torchdata's where it is installed."""
    try:
        import torchdata

        return f"torch {torch.__version__}, torchdata {torchdata.__version__}"
    except ImportError:
        return f"torch {torch.__version__}"


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """``opts["loader"]``: "torch" or "torchdata"; ``opts["num_workers"]``."""
    x, ids = read_columns(paths["parquet"])
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(ids))
    generator = torch.Generator().manual_seed(SEED)
    if opts["loader"] == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        cls: Any = StatefulDataLoader
    else:
        cls = DataLoader
    return cls(dataset, batch_size=batch_size, shuffle=True, num_workers=opts["num_workers"], generator=generator)


def batch_ids(batch: Any) -> Any:
    """The id tensor of an ``(x, id)`` batch."""
    return batch[1].numpy()
