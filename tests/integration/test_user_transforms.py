"""A user's own transform placed by the declared protocol (NOTE [ Transform placement ] in
transforms.py), through real loaders: declaring ``Placement("workers")`` (no column, no key) it
runs in a map-style dataset's worker processes and on a stream's decode stage; declaring
``Placement("reads")`` it runs in a stream's reads, in the read pool's processes; a plain
callable runs in the training loop. Each gives the batches the same transform gives in the
loop."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

import naiad

pytestmark = pytest.mark.timeout(120)

ROWS = 200


def double(batch: dict[str, Any]) -> dict[str, Any]:
    """What every transform here computes: ``y = 2 * x``, a plain function (runs in the loop)."""
    return {"x": batch["x"], "y": batch["x"] * 2}


class Where:
    """``double``, and where it ran: the process and whether on the main thread. Picklable."""

    def __init__(self, runs: str = "workers", decoded_row_bytes: int | None = None) -> None:
        self.runs = runs
        self.decoded_row_bytes = decoded_row_bytes

    def placement(self) -> naiad.Placement:
        return naiad.Placement(self.runs, decoded_row_bytes=self.decoded_row_bytes)  # type: ignore[arg-type]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        rows = len(batch["x"])
        main = threading.current_thread() is threading.main_thread()
        return {**double(batch), "pid": torch.full((rows,), os.getpid()), "main": torch.full((rows,), main)}


class Dict:
    """A map-style dataset of dicts (torch's per-sample path, collated by default)."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor(float(i))}


def data(batches: list[dict[str, Any]]) -> list[tuple[list[float], list[float]]]:
    return [(b["x"].tolist(), b["y"].tolist()) for b in batches]


@pytest.fixture
def table() -> pa.Table:
    return pa.table({"x": np.arange(ROWS, dtype=np.float64)})


def test_user_worker_transform_runs_in_map_worker_processes() -> None:
    loader = naiad.DataLoader(Dict(), batch_size=16, shuffle=True, seed=3, num_workers=2, transform=Where())
    in_loop = naiad.DataLoader(Dict(), batch_size=16, shuffle=True, seed=3, num_workers=2, transform=double)
    batches = list(loader)
    assert data(batches) == data(list(in_loop))
    pids = {int(p) for b in batches for p in b["pid"]}
    assert os.getpid() not in pids and len(pids) >= 1


def test_user_worker_transform_runs_on_the_stream_stage(tmp_path: Path, table: pa.Table) -> None:
    path = tmp_path / "x.csv"
    pacsv.write_csv(table, path)
    kwargs: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 3, "num_workers": 2}
    batches = list(naiad.DataLoader(naiad.read_csv(str(path)), transform=Where(), **kwargs))
    assert data(batches) == data(list(naiad.DataLoader(naiad.read_csv(str(path)), transform=double, **kwargs)))
    # The stage is threads of the loop's process, a few batches ahead of the loop.
    assert all(not b["main"].any() for b in batches)


@pytest.mark.parametrize("where", [Where("reads"), Where("workers", decoded_row_bytes=24)], ids=["reads", "small"])
def test_user_reads_transform_runs_in_the_stream_reads(tmp_path: Path, table: pa.Table, where: Where) -> None:
    # Placed in the reads, or small and of one shape (no column declared either way).
    path = tmp_path / "x.parquet"
    pq.write_table(table, path, row_group_size=25)
    kwargs: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 3, "num_workers": 2}
    loader = naiad.DataLoader(naiad.read_parquet(str(path)), transform=where, **kwargs)
    assert loader.worker_mode == "process"  # a transform in the reads: processes by default
    batches = list(loader)
    assert data(batches) == data(list(naiad.DataLoader(naiad.read_parquet(str(path)), transform=double, **kwargs)))
    pids = {int(p) for b in batches for p in b["pid"]}
    assert os.getpid() not in pids


def test_plain_callable_runs_in_the_loop() -> None:
    seen: list[tuple[int, bool]] = []

    def record(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append((os.getpid(), threading.current_thread() is threading.main_thread()))
        return double(batch)

    batches = list(naiad.DataLoader(Dict(), batch_size=16, num_workers=2, transform=record))
    assert len(seen) == len(batches) == -(-ROWS // 16)
    assert set(seen) == {(os.getpid(), True)}


class OldStyle:
    """A transform in naiad's old duck-typed spelling (``runs_in_workers = True``). Picklable."""

    runs_in_workers = True

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {**double(batch), "pid": torch.full((len(batch["x"]),), os.getpid())}


def test_old_runs_in_workers_attribute_still_runs_in_workers_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="placement"):
        loader = naiad.DataLoader(Dict(), batch_size=16, num_workers=2, transform=OldStyle())
    batches = list(loader)
    assert data(batches) == data(list(naiad.DataLoader(Dict(), batch_size=16, transform=double)))
    assert os.getpid() not in {int(p) for b in batches for p in b["pid"]}
