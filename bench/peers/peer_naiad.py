"""naiad: streaming Parquet or CSV from disk, and the drop-in over the same ``TensorDataset``.

Runs in the interpreter that runs bench/bench_peers.py, with naiad from this checkout's src/.
"""

from __future__ import annotations

from typing import Any

import torch
from common import SEED, read_columns
from torch.utils.data import TensorDataset

import naiad


def versions() -> str:
    """naiad's and torch's versions."""
    return f"naiad {getattr(naiad, '__version__', '?')}, torch {torch.__version__}"


def convert(paths: dict[str, Any], opts: dict[str, Any]) -> None:
    """``naiad convert`` of the Parquet table into ``paths["out"]``, with its defaults (row groups
    of 1/4096 of the rows, plain float pages; no ``--shuffle``: rows stay in file order)."""
    from naiad.tools.convert import convert as naiad_convert

    naiad_convert(paths["parquet"], paths["out"].rstrip("/") + "/")


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """``opts["source"]``: "parquet", "csv" or "tensors"; ``opts["loader_args"]``: extra keywords."""
    extra = dict(opts.get("loader_args") or {})
    if opts["source"] == "tensors":
        x, ids = read_columns(paths["parquet"])
        data: Any = TensorDataset(torch.from_numpy(x), torch.from_numpy(ids))
    elif opts["source"] == "csv":
        data = naiad.read_csv(paths["csv"])
    elif opts["source"] == "converted":
        data = naiad.read_parquet(paths["out"].rstrip("/") + "/*.parquet")
    else:
        data = naiad.read_parquet(paths["parquet"])
    return naiad.DataLoader(data, batch_size=batch_size, shuffle=True, seed=SEED, **extra)


def batch_ids(batch: Any) -> Any:
    """The id column of a batch (a dict of columns, or an ``(x, id)`` pair)."""
    return (batch["id"] if isinstance(batch, dict) else batch[1]).numpy()
