"""A resumed stream reads the rows it owes to its next batches before the rows its shuffle buffer
held (NOTE [ Owed rows first ] in restore.py), and what it emits stays that of an uninterrupted run."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pytest

from naiad.parallel import WorkerPool
from naiad.stream.batches import StreamOptions, buffer_keys, iter_batches, plan_for
from naiad.stream.plan import RestoreTask
from naiad.stream.reads import make_handler_factory
from naiad.stream.replay import BufferReplay
from naiad.stream.restore import Restoring, split_even
from naiad.stream.shuffle import ShuffleBuffer
from tests.conftest_stream import ids_of, open_numbered, write_numbered


def _state_after(src, opts: StreamOptions, k: int, imap) -> dict[str, Any]:
    stream = iter_batches(src, opts, epoch=1, imap=imap)
    for _ in range(k):
        next(stream)
    state = json.loads(json.dumps(stream.get_state()))
    stream.close()
    return state


def _replay_after(src, opts: StreamOptions, k: int) -> BufferReplay:
    """Where the stream stands after ``k`` batches."""
    plan = plan_for(src, opts, 1)
    buffer = ShuffleBuffer(opts.buffer_rows, buffer_keys(opts.seed, 1, 0, 0))
    return BufferReplay.replay(plan, buffer, int(plan.batch_sizes[:k].sum()))


def _owed_after(src, opts: StreamOptions, k: int) -> int:
    """Rows the exchange in progress still owes after ``k`` batches."""
    return len(_replay_after(src, opts, k).owed)


def _reads(tasks: Iterable[Any]) -> list[list[tuple[Any, ...]]]:
    """Each task's reads as (block, rows): comparable (a read's selected rows are an array)."""
    return [[(r.block, r.row_numbers().tolist()) for r in t.reads] for t in tasks]


def _recording(pool: WorkerPool, pulled: list[Any], tasks: Iterable[Any]) -> Iterator[Any]:
    """``pool.imap(tasks)``, noting in ``pulled`` each task as the pool takes it."""
    def seen() -> Iterator[Any]:
        for t in tasks:
            pulled.append(t)
            yield t
    return pool.imap(seen())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_the_first_batch_after_a_resume_waits_only_for_the_owed_rows(tmp_path, fmt):
    src = open_numbered(write_numbered(str(tmp_path), fmt, [150, 90]), fmt)
    opts = StreamOptions(batch_size=3, shuffle=True, seed=4, shuffle_buffer=40)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    full = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=pool.imap)]
    # Positions whose exchange in progress still owes a batch or more: those start at once.
    ks = [k for k in range(1, len(full) - 1) if _owed_after(src, opts, k) >= 3]
    assert len(ks) >= 5
    for k in ks[:: max(1, len(ks) // 8)]:
        pulled: list[Any] = []
        recording = functools.partial(_recording, pool, pulled)
        stream = iter_batches(src, opts, epoch=1, imap=recording, state=_state_after(src, opts, k, pool.imap))
        first = ids_of(next(stream))
        # Only the reads of the first batch's rows so far (of all the owed rows when they are
        # not many more): none of the other owed rows, none of the held rows, none of the plan.
        # Parquet row groups are decoded whole whatever rows are picked: the groups of the first
        # batch's rows come first, with every row needed from them, and no other group.
        assert pulled and all(isinstance(t, RestoreTask) for t in pulled)
        owed = _owed_after(src, opts, k)
        if fmt != "parquet":
            assert sum(t.rows for t in pulled) == (3 if owed > 6 else owed)
        else:
            replay = _replay_after(src, opts, k)
            early = Restoring(plan_for(src, opts, 1), replay, 10, 3, in_steps=False).steps[0]
            assert _reads(pulled) == _reads(early.tasks)
            assert (early.dest < len(replay.owed)).sum() >= min(owed, 3)
        rest = [first] + [ids_of(b) for b in stream]
        assert [a.tolist() for a in rest] == [b.tolist() for b in full[k:]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_workers,mode", [(0, "process"), (2, "thread"), (2, "process")])
def test_a_resume_at_every_position_continues_exactly(tmp_path, num_workers, mode):
    # Every position: owed rows that fill several batches, fewer than a batch, none at all (the
    # exchange just ended), inside the final flush, and small buffers whose chunks are bigger.
    src = open_numbered(write_numbered(str(tmp_path), "csv", [97, 64]), "csv")
    pool = WorkerPool(make_handler_factory(src), num_workers=num_workers, mode=mode)  # type: ignore[arg-type]
    imap = functools.partial(pool.imap, prefetch=2, in_order=True)
    try:
        for buffer in (24, 5):
            opts = StreamOptions(batch_size=4, shuffle=True, seed=11, shuffle_buffer=buffer)
            full = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=imap)]
            assert sorted(np.concatenate(full).tolist()) == list(range(161))
            step = 1 if num_workers == 0 else 3
            owed = set()
            for k in range(0, len(full) + 1, step):
                owed.add(min(_owed_after(src, opts, k), 4) if k else -1)
                rest = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=imap, state=_state_after(src, opts, k, imap))]
                assert [a.tolist() for a in rest] == [b.tolist() for b in full[k:]], (buffer, k)
            if num_workers == 0 and buffer == 24:
                assert {0, 4} <= owed and owed & {1, 2, 3}  # the positions this test is about
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_resume_inside_an_elastic_leg_continues_exactly(tmp_path):
    # A state of 2 ranks loaded on 3, then saved again mid-leg and resumed on the same 3: the
    # second resume replays the new leg's buffer and reads its owed rows first.
    src = open_numbered(write_numbered(str(tmp_path), "csv", [120, 77]), "csv")
    pool = WorkerPool(make_handler_factory(src), num_workers=0)

    def opts(world_size: int, rank: int) -> StreamOptions:
        return StreamOptions(batch_size=5, shuffle=True, seed=3, shuffle_buffer=30, rank=rank, world_size=world_size)

    first = _state_after(src, opts(2, 0), 6, pool.imap)
    for rank in range(3):
        whole = [ids_of(b) for b in iter_batches(src, opts(3, rank), epoch=1, imap=pool.imap, state=first)]
        for k in (1, 4, len(whole) - 1):
            stream = iter_batches(src, opts(3, rank), epoch=1, imap=pool.imap, state=first)
            for _ in range(k):
                next(stream)
            again = json.loads(json.dumps(stream.get_state()))
            stream.close()
            rest = [ids_of(b) for b in iter_batches(src, opts(3, rank), epoch=1, imap=pool.imap, state=again)]
            assert [a.tolist() for a in rest] == [b.tolist() for b in whole[k:]], (rank, k)


def test_restore_tasks_come_owed_then_held_then_the_plan(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [200]), "csv")
    opts = StreamOptions(batch_size=4, shuffle=True, seed=2, shuffle_buffer=48)
    plan = plan_for(src, opts, 1)
    k = next(k for k in range(20, len(plan.batch_sizes)) if _owed_after(src, opts, k) >= 6)
    buffer = ShuffleBuffer(opts.buffer_rows, buffer_keys(opts.seed, 1, 0, 0))
    replay = BufferReplay.replay(plan, buffer, int(plan.batch_sizes[:k].sum()))
    restoring = Restoring(plan, replay, 12, 1)
    assert [len(s.tasks) for s in restoring.steps] == [1, 4]  # the first batch's row, the other owed rows
    assert not restoring.restores(5)  # the held rows' reads are not known yet
    tasks = list(restoring.tasks())
    first, owed, held = restoring.steps
    n_owed = len(replay.owed)
    assert first.dest.tolist() == [0] and sorted(owed.dest.tolist()) == list(range(1, n_owed))
    assert sorted(held.dest.tolist()) == list(range(n_owed, n_owed + len(replay.held)))
    assert (first.ready, owed.ready, held.ready) == (1, n_owed, n_owed)
    assert len(held.tasks) >= 4  # 48 held rows, a cost of 12 a task
    assert tasks[:9] == [*first.tasks, *owed.tasks, *held.tasks][:9] and tasks == restoring.issued
    assert sum(t.rows for t in held.tasks) == len(replay.held)
    n = len(first.tasks) + len(owed.tasks) + len(held.tasks)
    assert [restoring.restores(i) for i in range(len(tasks))] == [i < n for i in range(len(tasks))]


def test_split_even_keeps_reads_whole_and_in_order(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [60]), "csv")
    reads = plan_for(src, StreamOptions(batch_size=2), 0).tasks
    flat = [r for t in reads for r in getattr(t, "reads", (t,))]
    for pieces in (1, 2, 4, 100):
        parts = split_even(flat, pieces)
        assert [r for p in parts for r in p] == flat
        assert 1 <= len(parts) <= min(pieces, len(flat))
    assert split_even([], 4) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,chunk_rows", [("parquet", 50_000), ("csv", 0)])
def test_a_buffer_big_enough_for_the_keyed_permutation_resumes_exactly(tmp_path, fmt, chunk_rows):
    # 65,536 slots and more draw from the keyed permutation and are replayed slot by slot
    # (NOTE [ Keyed permutation ]); row groups decoded whole are read first where the first
    # batch's rows are (NOTE [ Owed rows first ]), and the held rows go back through the view.
    from naiad.stream.shuffle import PERMUTATION_MIN_SLOTS

    kw = {"chunk_rows": chunk_rows} if chunk_rows else {}
    src = open_numbered(write_numbered(str(tmp_path), fmt, [260_000, 140_001], **kw), fmt, small_blocks=False)
    opts = StreamOptions(batch_size=4096, shuffle=True, seed=9, shuffle_buffer=PERMUTATION_MIN_SLOTS + 5000)
    pool = WorkerPool(make_handler_factory(src), num_workers=2, mode="thread")
    try:
        full = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=pool.imap)]
        assert sorted(np.concatenate(full).tolist()) == list(range(400_001))
        for k in (1, 17, len(full) // 2, len(full) - 3):
            rest = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=pool.imap, state=_state_after(src, opts, k, pool.imap))]
            assert len(rest) == len(full) - k
            assert all(np.array_equal(a, b) for a, b in zip(rest, full[k:], strict=True)), k
    finally:
        pool.close()
