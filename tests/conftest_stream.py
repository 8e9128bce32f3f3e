"""Helpers shared by the streaming tests: small files of numbered rows in every format."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from naiad import sources
from naiad.parallel import WorkerPool
from naiad.stream.batches import StreamOptions, iter_batches
from naiad.stream.reads import make_handler_factory

FORMATS = ("csv", "jsonl", "text", "parquet", "arrow", "npy")


def write_numbered(directory: str, fmt: str, sizes: Sequence[int], *, chunk_rows: int = 7) -> list[str]:
    """One file per entry of ``sizes``; row ``i`` overall has ``id == i`` (text: the line ``"i"``)."""
    paths = []
    start = 0
    for k, n in enumerate(sizes):
        ids = np.arange(start, start + n, dtype=np.int64)
        start += n
        path = os.path.join(directory, f"part-{k:03d}.{fmt}")
        if fmt == "csv":
            with open(path, "w") as f:
                f.write("id,value\n")
                f.writelines(f"{i},{i * 0.5}\n" for i in ids)
        elif fmt == "jsonl":
            with open(path, "w") as f:
                f.writelines(f'{{"id": {i}, "value": {i * 0.5}}}\n' for i in ids)
        elif fmt == "text":
            with open(path, "w") as f:
                f.writelines(f"{i}\n" for i in ids)
        elif fmt == "parquet":
            table = pa.table({"id": ids, "value": ids * 0.5})
            pq.write_table(table, path, row_group_size=chunk_rows)
        elif fmt == "arrow":
            table = pa.table({"id": ids, "value": ids * 0.5})
            with pa.ipc.new_file(path, table.schema) as w:
                for batch in table.to_batches(max_chunksize=chunk_rows):
                    w.write_batch(batch)
                if n == 0:
                    w.write_table(table)
        elif fmt == "npy":
            np.save(path, ids)
        paths.append(path)
    return paths


def open_numbered(paths: list[str], fmt: str, *, small_blocks: bool = True, **kw: object) -> sources.Source:
    """The reader for ``fmt`` over ``paths``, with tiny blocks so that files have many."""
    text_kw = {"block_bytes": 40} if small_blocks else {}
    if fmt == "csv":
        return sources.read_csv(paths, **text_kw, **kw)  # type: ignore[arg-type]
    if fmt == "jsonl":
        return sources.read_jsonl(paths, **text_kw, **kw)  # type: ignore[arg-type]
    if fmt == "text":
        return sources.read_text(paths, column="id", **text_kw, **kw)  # type: ignore[arg-type]
    if fmt == "parquet":
        return sources.read_parquet(paths, **kw)  # type: ignore[arg-type]
    if fmt == "arrow":
        return sources.read_arrow(paths, **kw)  # type: ignore[arg-type]
    return sources.read_npy(paths, column="id", block_rows=5 if small_blocks else 1 << 16, **kw)  # type: ignore[arg-type]


def ids_of(batch: dict) -> np.ndarray:
    col = batch["id"]
    if isinstance(col, list):
        return np.array([int(v) for v in col], dtype=np.int64)
    return col.numpy().astype(np.int64)


def run_epoch(
    source: sources.Source,
    options: StreamOptions,
    *,
    epoch: int = 0,
    num_workers: int = 0,
    mode: str = "process",
    pool: WorkerPool | None = None,
) -> list[dict]:
    """Every batch of one epoch, driven through a WorkerPool as the loader does."""
    own = pool is None
    if pool is None:
        pool = WorkerPool(make_handler_factory(source), num_workers=num_workers, mode=mode)  # type: ignore[arg-type]
    try:
        imap = functools.partial(pool.imap, prefetch=2, in_order=True)
        return list(iter_batches(source, options, epoch=epoch, imap=imap))
    finally:
        if own:
            pool.close()


def run_legs(src: sources.Source, pool: WorkerPool, epoch: int, shuffle: bool, seed: int, drop_last: bool,
             legs: Sequence[tuple[int, int, int, int | None]]) -> tuple[list[np.ndarray], list[list[int]]]:
    """Run an epoch through ``legs`` = [(world_size, batch_size, buffer, stop_after or None)]:
    each leg's ranks stop after ``stop_after`` batches, rank 0's JSON state starts the next leg.
    Returns the ids delivered per leg (all ranks), and the batch counts per rank per leg."""
    state = None
    delivered, counts = [], []
    for world_size, batch_size, buffer, stop in legs:
        ids, per_rank = [], []
        saved = None
        for rank in range(world_size):
            opts = StreamOptions(batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer=buffer,
                                 drop_last=drop_last, rank=rank, world_size=world_size)
            stream = iter_batches(src, opts, epoch=epoch, imap=pool.imap, state=state)
            start = n = stream.batches_yielded  # where a resume on the same topology starts
            for batch in stream:
                if stop is not None and n - start == stop:
                    break
                ids.append(ids_of(batch))
                n += 1
            per_rank.append(n - start)
            if rank == 0 and stop is not None:
                saved = json.loads(json.dumps(stream.get_state(batches_yielded=n)))
            stream.close()
        delivered.append(np.concatenate(ids) if ids else np.zeros(0, np.int64))
        counts.append(per_rank)
        state = saved
    return delivered, counts


class GroupSpy:
    """The blocks each parse of a read group of ``cls`` covers (its ``_read_group``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
        self.blocks: list[Any] = []
        original = cls._read_group

        def spied(source: Any, parts: Any, use_threads: bool) -> Any:
            self.blocks += [block for block, _, _, _ in parts]
            return original(source, parts, use_threads)

        monkeypatch.setattr(cls, "_read_group", spied)


def two_ranks_then_three(make: Callable[[int, int], Any], before: int) -> tuple[list[Any], list[int]]:
    """An epoch on two ranks for ``before`` batches each, then resumed from rank 0's state (through
    JSON) on three ranks to its end: an elastic resume. ``make(rank, world_size)`` makes a rank's
    loader. Returns every batch delivered, the two ranks' first, and the new ranks' batch counts."""
    delivered: list[Any] = []
    state = None
    for rank in range(2):
        loader = make(rank, 2)
        it = iter(loader)
        delivered += [next(it) for _ in range(before)]
        if rank == 0:
            state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    counts = []
    for rank in range(3):
        loader = make(rank, 3)
        loader.load_state_dict(state)
        try:
            batches = list(loader)
        finally:
            loader.close()
        counts.append(len(batches))
        delivered += batches
    return delivered, counts
