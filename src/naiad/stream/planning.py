"""This rank's plan for a pass of a stream, and what a state records of it: the plan of an epoch
or of the leg after a resume on another topology (:func:`plan_for`), the blocks moved as one
(:func:`run_for`), the shuffle buffer's seed keys (:func:`buffer_keys`) and the data's
fingerprint (:func:`source_fingerprint`). Pure functions of the source and the options; a plan
is remembered per source (a ``load_state_dict``, the pass after it and ``len()`` all ask)."""

from __future__ import annotations

import hashlib
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from naiad.order.elastic import (
    Leftovers,
    Leg,
    Segments,
    epoch_sequence,
    no_buffer,
    rank_share,
)
from naiad.sources.base import Source
from naiad.stream.early import may_read_early
from naiad.stream.options import StreamOptions
from naiad.stream.plan import (
    TAG_BUFFER,
    RankPlan,
    block_runs,
    group_rows,
    group_tasks,
    make_plan,
    ordered_blocks,
    tasks_for,
)
from naiad.stream.replay import BufferReplay
from naiad.stream.shuffle import ShuffleBuffer

__all__ = ["buffer_keys", "current_leg", "num_batches", "plan_for", "run_for", "source_fingerprint"]


_PER_SOURCE: weakref.WeakKeyDictionary[Source, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()
T = TypeVar("T")


def _per_source(source: Source, key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """``make()``, remembered for ``source`` under ``key`` (a pure function of both: the last
    few results per source, gone with the source)."""
    memo = _PER_SOURCE.setdefault(source, {})
    if key not in memo:
        memo[key] = make()
        if len(memo) > 8:
            memo.pop(next(iter(memo)))
    return cast(T, memo[key])


def plan_for(source: Source, options: StreamOptions, epoch: int, legs: Sequence[Leg] = ()) -> RankPlan:
    """This rank's plan for ``epoch`` (counts the source's rows the first time), or for the leg
    after ``legs`` when the epoch was resumed on another topology (NOTE [ Elastic resume ])."""
    rank, world_size = options.topology()
    source.prepare()  # the row count and the schema, at once
    if not legs:
        # A plan is a pure function of these (its block runs too: of the source, the buffer and
        # the world size): made once per source (a load_state_dict checks the saved one, the
        # pass after it runs it, len() counts its batches).
        buffer = current_leg(options).buffer_rows
        key = ("plan", options.seed, epoch, options.shuffle, rank, world_size, options.batch_size,
               options.drop_last, buffer, len(source.blocks()))
        return _per_source(source, key, lambda: make_plan(
            source.blocks(), seed=options.seed, epoch=epoch, shuffle=options.shuffle, rank=rank,
            world_size=world_size, batch_size=options.batch_size, drop_last=options.drop_last,
            group_rows=group_rows(buffer), run=run_for(source, buffer, world_size),
        ))
    blocks = source.blocks()
    # The epoch's order is its first leg's, whatever topology resumed it (NOTE [ Block runs ]).
    run = run_for(source, legs[0].buffer_rows, legs[0].world_size)
    ordered = ordered_blocks(blocks, seed=options.seed, epoch=epoch, shuffle=options.shuffle, run=run)
    total = sum(b.rows for b in ordered)

    def leftovers_for(i: int) -> Leftovers:
        leg = legs[i]
        if not leg.buffer_rows:
            return no_buffer

        def replay(rank: int, share: Segments, sizes: np.ndarray, delivered: int) -> tuple[np.ndarray, int]:
            plan = RankPlan(group_tasks(tasks_for(ordered, share), group_rows(leg.buffer_rows)), len(share), sizes, total)
            buffer = ShuffleBuffer(leg.buffer_rows, buffer_keys(options.seed, epoch, rank, i))
            restore = BufferReplay.replay(plan, buffer, delivered)
            return np.concatenate((restore.held, restore.owed)), restore.consumed

        return replay

    # The positions the legs left are the same for every new rank: worked out once per source
    # (a job's ranks, a load_state_dict and the pass after it all ask).
    legs_key = ("legs", options.seed, epoch, options.shuffle, tuple(legs), len(blocks), total)
    sequence = _per_source(source, legs_key, lambda: epoch_sequence(total, legs, leftovers_for))
    leg = current_leg(options)
    share, sizes = rank_share(sequence, leg, rank)
    return RankPlan(group_tasks(tasks_for(ordered, share), group_rows(leg.buffer_rows)), len(share), sizes, total)


def run_for(source: Source, buffer_rows: int, world_size: int) -> int:
    """How many consecutive blocks of ``source`` its epoch permutation moves as one
    (``plan.block_runs``): one for a source whose first reads may come before its rows are
    counted (``early.may_read_early``, NOTE [ Early reads ]), in the order of single blocks."""
    if may_read_early(source):
        return 1
    return block_runs(len(source.blocks()), len(source), buffer_rows, world_size)


def current_leg(options: StreamOptions, batches: int = 0) -> Leg:
    """The leg ``options`` run (its topology), with ``batches`` delivered."""
    _, world_size = options.topology()
    return Leg(world_size, options.batch_size, options.drop_last, options.buffer_rows if options.shuffle else 0, batches)


def buffer_keys(seed: int, epoch: int, rank: int, leg: int) -> tuple[int, ...]:
    """The seed keys of the shuffle buffer's draws for one rank in one leg of an epoch."""
    return (seed % 2**64, epoch % 2**64, rank, TAG_BUFFER, leg)


def source_fingerprint(source: Source) -> dict[str, Any]:
    """What identifies the data of a stream in a state: files, rows, columns, blocks (the plan
    permutes them: another ``block_bytes`` is another plan) and a digest of the file names (not
    directories: a job may mount its data elsewhere), row counts and columns."""
    rows_per_file: dict[str, int] = {}
    for b in source.blocks():
        rows_per_file[b.path] = rows_per_file.get(b.path, 0) + b.rows
    digest = hashlib.sha1()
    for path, n in rows_per_file.items():
        digest.update(f"{os.path.basename(path)}\0{n}\n".encode())
    digest.update("\0".join(source.column_names).encode())
    return {
        "files": len(source.paths), "total_rows": sum(rows_per_file.values()),
        "columns": len(source.column_names), "blocks": len(source.blocks()), "digest": digest.hexdigest()[:16],
    }


def num_batches(source: Source, options: StreamOptions) -> int:
    """Batches per epoch on this rank (the same on every rank and every epoch)."""
    return plan_for(source, options, 0).num_batches
