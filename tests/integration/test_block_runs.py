"""Block runs (NOTE [ Block runs ] in naiad/stream/plan.py): where the shuffle buffer holds most of the
rows, the epoch permutes runs of consecutive blocks. Every row is still delivered once, the
order still mixes, and a resume, an elastic resume and the coverage check's dry run follow it."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

import naiad
from naiad.parallel import WorkerPool
from naiad.stream.batches import StreamOptions, plan_for
from naiad.stream.plan import GroupTask
from naiad.stream.reads import make_handler_factory
from naiad.tools.coverage import Topology, planned_batches
from tests.conftest_stream import ids_of, open_numbered, run_epoch, run_legs, write_numbered

pytestmark = pytest.mark.timeout(120)

ROWS = 3000
BIG = 2900  # holds 97% of the rows: runs
SMALL = 100  # holds 3%: single blocks


def _source(tmp: str, fmt: str) -> naiad.Source:
    """Two files of numbered rows in blocks of a few rows each (hundreds of blocks)."""
    kw = {"index_dir": False} if fmt in ("csv", "jsonl") else {}
    return open_numbered(write_numbered(tmp, fmt, [ROWS // 2, ROWS - ROWS // 2]), fmt, **kw)


def _options(buffer: int, batch_size: int = 64, world_size: int = 1, rank: int = 0) -> StreamOptions:
    return StreamOptions(batch_size=batch_size, shuffle=True, seed=3, shuffle_buffer=buffer,
                         rank=rank, world_size=world_size)


def _followers(source: naiad.Source, buffer: int) -> float:
    """The share of the plan's reads whose block comes right after the one before, in file order."""
    plan = plan_for(source, _options(buffer), 0)
    reads = [r for t in plan.tasks for r in (t.reads if isinstance(t, GroupTask) else (t,))]
    index = {b: i for i, b in enumerate(source.blocks())}
    at = np.array([index[r.block] for r in reads])
    return float(np.mean(np.diff(at) == 1))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet", "npy"])
def test_a_buffer_that_holds_most_rows_permutes_runs_and_still_mixes(fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(tmp, fmt)
        assert len(src.blocks()) >= 200
        assert _followers(src, BIG) > 0.9  # runs of consecutive blocks
        assert _followers(src, SMALL) < 0.1  # a small buffer: the single blocks its order needs
        for buffer in (BIG, SMALL):
            batches = [ids_of(b) for b in run_epoch(src, _options(buffer))]
            ids = np.concatenate(batches)
            assert np.array_equal(np.sort(ids), np.arange(ROWS))  # every row once
            assert abs(np.corrcoef(np.arange(ROWS), ids)[0, 1]) < 0.08  # 1/sqrt(3000) = 0.018
            spans = [(b.max() - b.min()) / ROWS for b in batches[:-1]]
            assert np.median(spans) > 0.9


def test_runs_follow_each_rank_s_share() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(tmp, "csv")
        got = [np.concatenate([ids_of(b) for b in run_epoch(src, _options(BIG // 2, 32, 2, rank))]) for rank in (0, 1)]
        assert np.array_equal(np.sort(np.concatenate(got)), np.arange(ROWS))
        for ids in got:  # each rank's rows come from all over the files
            assert ids.max() - ids.min() > 0.8 * ROWS


def _resumed(src: naiad.Source, legs: list[tuple[int, int, int, int | None]]) -> list[np.ndarray]:
    """The ids each leg delivers: ``(world_size, batch_size, buffer, stop after)``; rank 0's JSON
    state starts the next leg (``run_legs``)."""
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    try:
        return run_legs(src, pool, 0, True, 3, False, legs)[0]
    finally:
        pool.close()


def test_a_resume_in_runs_continues_exactly() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(tmp, "jsonl")
        whole = np.concatenate(_resumed(src, [(1, 64, BIG, None)]))
        first, rest = _resumed(src, [(1, 64, BIG, 20), (1, 64, BIG, None)])
        assert np.array_equal(np.concatenate([first, rest]), whole)


@pytest.mark.parametrize("then", [(2, 32, SMALL), (3, 50, BIG)])
def test_an_elastic_resume_keeps_the_epoch_s_runs(then: tuple[int, int, int]) -> None:
    # The new topology's buffer or world size would take other runs; the epoch keeps its first
    # leg's order, so the rows no old rank delivered are delivered once.
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(tmp, "csv")
        first, rest = _resumed(src, [(1, 64, BIG, 20), (*then, None)])
        ids = np.concatenate([first, rest])
        assert len(first) == 20 * 64
        assert np.array_equal(np.sort(ids), np.arange(ROWS))


def test_the_coverage_dry_run_plans_the_same_runs() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = _source(tmp, "csv")
        planned = planned_batches(src, Topology(1, batch_size=64, shuffle_buffer=BIG), 0, seed=3)
        loader = naiad.DataLoader(src, batch_size=64, shuffle=True, seed=3, shuffle_buffer=BIG)
        got = [ids_of(b) for b in loader]
        assert len(got) == len(planned)
        assert all(np.array_equal(a, b) for a, b in zip(got, planned, strict=True))
