"""The epoch plan: a pure function; exactly once over ranks; equal batch counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.errors import ConfigError
from naiad.order.ranks import batch_sizes, rank_bounds
from naiad.sources import Block
from naiad.stream.plan import (
    RUNS_MIN,
    block_order,
    block_permutation,
    block_runs,
    make_plan,
)


def _blocks(rows: list[int]) -> list[Block]:
    return [Block(f"f{i}", 0, r, r, 1) for i, r in enumerate(rows)]


def _global_ids(blocks: list[Block], plan) -> np.ndarray:
    offset = {b.path: k for k, b in enumerate(blocks)}
    starts = np.concatenate(([0], np.cumsum([b.rows for b in blocks])))
    return np.concatenate([np.arange(t.lo, t.hi) + starts[offset[t.block.path]] for t in plan.tasks] or [np.zeros(0, int)])


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.integers(1, 40), max_size=12),
    world_size=st.integers(1, 6),
    batch_size=st.integers(1, 9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    run=st.integers(1, 4),
)
def test_ranks_partition_rows_and_yield_equal_batch_counts(rows, world_size, batch_size, shuffle, drop_last, seed, epoch, run):
    blocks = _blocks(rows)
    plans = [
        make_plan(blocks, seed=seed, epoch=epoch, shuffle=shuffle, rank=r, world_size=world_size,
                  batch_size=batch_size, drop_last=drop_last, run=run)
        for r in range(world_size)
    ]
    ids = np.concatenate([_global_ids(blocks, p) for p in plans])
    assert sorted(ids.tolist()) == list(range(sum(rows)))  # every row once, over all ranks
    assert len({p.num_batches for p in plans}) == 1  # DDP never waits for a stopped rank
    counts = [p.rows for p in plans]
    assert max(counts) - min(counts) <= 1
    for p in plans:
        assert (p.batch_sizes <= batch_size).all()
        if drop_last:
            assert (p.batch_sizes == batch_size).all()
            assert p.batch_sizes.sum() <= p.rows
        else:
            assert p.batch_sizes.sum() == p.rows
            if p.rows >= p.num_batches:
                assert (p.batch_sizes >= 1).all()


def test_plan_depends_only_on_seed_epoch_and_topology():
    blocks = _blocks([5] * 50)
    kw = dict(shuffle=True, rank=1, world_size=3, batch_size=4, drop_last=False)
    a = make_plan(blocks, seed=7, epoch=2, **kw)
    b = make_plan(blocks, seed=7, epoch=2, **kw)
    c = make_plan(blocks, seed=7, epoch=3, **kw)
    assert a.tasks == b.tasks
    assert a.tasks != c.tasks


def test_block_permutation_is_new_each_epoch_and_identity_without_shuffle():
    perms = {tuple(block_permutation(30, seed=1, epoch=e, shuffle=True)) for e in range(5)}
    assert len(perms) == 5
    assert block_permutation(5, seed=1, epoch=3, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_block_permutation_golden():
    # Frozen: an accidental change of the epoch order must be seen.
    assert block_permutation(8, seed=0, epoch=0, shuffle=True).tolist() == GOLDEN_PERMUTATION


GOLDEN_PERMUTATION = [3, 6, 7, 1, 2, 5, 0, 4]


@given(st.integers(0, 3000), st.integers(0, 2**32), st.integers(0, 50))
@settings(max_examples=60, deadline=None)
def test_the_block_order_is_stratified(k: int, seed: int, epoch: int) -> None:
    # NOTE [ Stratified block order ]: every block once, and every stratum of consecutive blocks
    # spread evenly over the epoch: its share of any prefix is its share of all blocks, +-3.
    order = block_permutation(k, seed=seed, epoch=epoch, shuffle=True)
    assert sorted(order.tolist()) == list(range(k))
    strata = max(1, round(k**0.5))
    bounds = (np.arange(strata + 1) * k) // strata
    stratum_of = np.searchsorted(bounds, order, side="right") - 1
    seen = np.cumsum(stratum_of[:, None] == np.arange(strata)[None, :], axis=0)  # per prefix, per stratum
    expected = np.arange(1, k + 1)[:, None] * np.diff(bounds)[None, :] / max(k, 1)
    assert k == 0 or np.abs(seen - expected).max() <= 3


def test_the_block_order_leaves_no_trend_over_the_epoch() -> None:
    for k in (206, 2288):
        stratified = [np.corrcoef(np.arange(k), block_permutation(k, seed=s, epoch=0, shuffle=True))[0, 1] for s in range(30)]
        uniform = [np.corrcoef(np.arange(k), np.random.default_rng(s).permutation(k))[0, 1] for s in range(30)]
        assert max(map(abs, stratified)) < max(map(abs, uniform)) / 4
    assert max(abs(np.corrcoef(np.arange(2288), block_permutation(2288, seed=s, epoch=1, shuffle=True))[0, 1])
               for s in range(30)) < 0.005


def test_block_runs_follow_the_rows_the_buffer_leaves_out() -> None:
    # NOTE [ Block runs ]: 135,135 rows in 297 blocks; the default buffer holds 97% of them.
    assert block_runs(297, 135_135, 131_072) == 297 // RUNS_MIN
    assert block_runs(297, 135_135, 100_000) == 1  # a quarter left out: 277 units wanted
    assert block_runs(297, 135_135, 8_192) == 1
    assert block_runs(297, 135_135, 0) == 1  # not shuffled
    assert block_runs(2_288, 2_027_027, 131_072) == 1  # 150 MB of CSV: the buffer holds 6%
    assert block_runs(297, 100_000, 131_072) == 297 // RUNS_MIN  # every row in the buffer
    assert block_runs(297, 135_135, 131_072, world_size=2) == 297 // (2 * RUNS_MIN)  # per rank
    assert block_runs(20, 1_000, 1_000) == 1  # too few blocks to join


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 400), run=st.integers(1, 40), seed=st.integers(0, 2**32), epoch=st.integers(0, 9))
def test_block_order_permutes_runs_of_consecutive_blocks(n: int, run: int, seed: int, epoch: int) -> None:
    order = block_order(n, seed=seed, epoch=epoch, shuffle=True, run=run)
    assert sorted(order.tolist()) == list(range(n))
    runs = n // run
    if runs <= 1:  # nothing to join: the single blocks' order
        assert np.array_equal(order, block_permutation(n, seed=seed, epoch=epoch, shuffle=True))
        return
    bounds = (np.arange(runs + 1) * n) // runs
    breaks = np.flatnonzero(np.diff(order) != 1) + 1
    starts = order[np.concatenate(([0], breaks))]
    # Every run starts at a boundary and is read whole, in file order (two runs may follow
    # each other in file order too: then they read as one).
    assert set(starts.tolist()) <= set(bounds[:-1].tolist())
    assert len(starts) <= runs
    assert np.array_equal(block_order(n, seed=seed, epoch=epoch, shuffle=False, run=run), np.arange(n))


def test_batch_sizes_short_rank_makes_smaller_last_batches():
    assert batch_sizes(8, 3, 4).tolist() == [4, 2, 2]
    assert batch_sizes(9, 3, 4).tolist() == [4, 4, 1]
    assert batch_sizes(12, 3, 4).tolist() == [4, 4, 4]
    assert batch_sizes(1, 2, 4).tolist() == [1, 0]
    assert batch_sizes(3, 3, 1).tolist() == [1, 1, 1]


def test_rank_bounds_sizes_differ_by_at_most_one():
    assert np.diff(rank_bounds(10, 4)).tolist() == [2, 3, 2, 3]


def test_plan_rejects_a_rank_outside_the_world():
    with pytest.raises(ConfigError, match="rank"):
        make_plan(_blocks([3]), seed=0, epoch=0, shuffle=False, rank=2, world_size=2, batch_size=1, drop_last=False)


def test_no_rows_means_no_batches():
    plan = make_plan([], seed=0, epoch=0, shuffle=True, rank=0, world_size=2, batch_size=4, drop_last=False)
    assert plan.num_batches == 0 and plan.tasks == []
