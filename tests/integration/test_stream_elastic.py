"""Elastic resume of a stream: a state saved on one topology continues on another, and the rest
of the epoch delivers every row that no old rank delivered exactly once (NOTE [ Elastic resume ])."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from naiad.parallel import WorkerPool
from naiad.stream.batches import StreamOptions, iter_batches
from naiad.stream.reads import make_handler_factory
from tests.conftest_stream import FORMATS, ids_of, open_numbered, run_legs, write_numbered


def _options(shuffle: bool, seed: int, world_size: int, rank: int, batch_size: int, buffer: int, drop_last: bool) -> StreamOptions:
    return StreamOptions(batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer=buffer,
                         drop_last=drop_last, rank=rank, world_size=world_size)


@pytest.mark.timeout(300)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(FORMATS),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    shuffle=st.booleans(),
    seed=st.integers(0, 100),
    legs=st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(1, 25), st.integers(0, 12)),
        min_size=1, max_size=3,
    ),
)
def test_elastic_resume_delivers_every_remaining_row_exactly_once(fmt, sizes, shuffle, seed, legs):
    with tempfile.TemporaryDirectory() as d:
        src = open_numbered(write_numbered(d, fmt, sizes), fmt)
        pool = WorkerPool(make_handler_factory(src), num_workers=0)
        plan = [(w, b, buf, stop) for w, b, buf, stop in legs] + [(legs[-1][0] % 3 + 1, 5, 7, None)]
        delivered, counts = run_legs(src, pool, 3, shuffle, seed, False, plan)
        everything = np.concatenate(delivered)
        assert sorted(everything.tolist()) == list(range(sum(sizes)))
        for per_rank in counts:
            assert len(set(per_rank)) == 1  # lockstep: the same number of batches on every rank


@pytest.mark.parametrize("fmt", ["csv", "parquet", "text"])
def test_elastic_resume_with_drop_last_never_repeats_and_keeps_full_batches(tmp_path, fmt):
    src = open_numbered(write_numbered(str(tmp_path), fmt, [53, 30]), fmt)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    delivered, counts = run_legs(src, pool, 0, True, 4, True, [(2, 4, 6, 3), (3, 5, 10, None)])
    everything = np.concatenate(delivered)
    assert len(set(everything.tolist())) == len(everything)
    assert len(delivered[1]) % 5 == 0 and len(set(counts[1])) == 1


def test_resuming_on_the_same_topology_from_another_rank_continues_exactly(tmp_path):
    # Lockstep ranks: rank 0's state resumes rank 1 exactly where rank 1 was.
    src = open_numbered(write_numbered(str(tmp_path), "parquet", [60, 25]), "parquet")
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    opts = [_options(True, 1, 2, r, 4, 8, False) for r in range(2)]
    full = [[ids_of(b) for b in iter_batches(src, o, epoch=1, imap=pool.imap)] for o in opts]
    s0 = iter_batches(src, opts[0], epoch=1, imap=pool.imap)
    for _ in range(4):
        next(s0)
    state = json.loads(json.dumps(s0.get_state()))
    rest = [ids_of(b) for b in iter_batches(src, opts[1], epoch=1, imap=pool.imap, state=state)]
    assert [a.tolist() for a in rest] == [b.tolist() for b in full[1][4:]]


def test_elastic_resume_reads_only_a_window_not_the_epoch_again(tmp_path):
    # 2 ranks -> 1 after 10 of 13 batches: the new leg re-reads the buffered rows' blocks and the
    # unread tails, far fewer rows than the epoch.
    src = open_numbered(write_numbered(str(tmp_path), "npy", [500]), "npy")
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    s = iter_batches(src, _options(True, 0, 2, 0, 16, 20, False), epoch=0, imap=pool.imap)
    for _ in range(10):
        next(s)
    state = s.get_state()
    read = []  # the rows of every read the resumed stream asks the pool for

    def counting_imap(tasks: Any) -> Iterator[Any]:
        for columns, bad in pool.imap(tasks):
            read.append(len(next(iter(columns.values()))) if columns else 0)
            yield columns, bad

    resumed = iter_batches(src, _options(True, 0, 1, 0, 16, 20, False), epoch=0, imap=counting_imap, state=state)
    rows = sum(len(ids_of(b)) for b in resumed)
    assert rows == 500 - 2 * 160
    assert 0 < sum(read) < 250
