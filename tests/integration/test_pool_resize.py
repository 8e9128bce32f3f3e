"""WorkerPool.resize during a pass: results stay exact and in order, workers come and go cleanly."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from naiad.errors import ConfigError
from naiad.parallel import Exhausted, WorkerContext, WorkerPool
from tests.helpers import child_pids

pytestmark = pytest.mark.timeout(60)


def square_factory(context: WorkerContext) -> Callable[[Any], Any]:
    def handle(x: int) -> tuple[int, int, int]:
        time.sleep(0.002 if x % 3 else 0.0)  # uneven, so completions interleave
        return x * x, context.worker_id, os.getpid()

    return handle


def walk_factory(context: WorkerContext) -> Callable[[Any], Any]:
    left = [3]

    def handle(_: Any) -> int:
        if not left[0]:
            raise Exhausted
        left[0] -= 1
        return context.worker_id

    return handle


def _wait_gone(pids: set[int], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while child_pids() & pids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (child_pids() & pids), f"workers left behind: {child_pids() & pids}"


@pytest.mark.parametrize("mode", ["process", "thread"])
@pytest.mark.parametrize("in_order", [True, False])
def test_resize_during_a_pass_keeps_every_result(mode: str, in_order: bool) -> None:
    before = child_pids()
    pool = WorkerPool(square_factory, num_workers=0, mode=mode)  # type: ignore[arg-type]
    sizes = {10: 2, 40: 1, 60: 0, 70: 3, 90: 1}
    got, workers_seen = [], set()
    it = pool.imap(range(120), in_order=in_order)
    for k, (value, worker, _) in enumerate(it):
        got.append(value)
        workers_seen.add(worker)
        if k in sizes:
            pool.resize(sizes[k])
    if in_order:
        assert got == [x * x for x in range(120)]
    else:
        assert sorted(got) == [x * x for x in range(120)]
    assert workers_seen == {0, 1, 2}
    assert pool.num_workers == 1 and len(pool.worker_pids) == 1
    pool.close()
    _wait_gone(child_pids() - before)


def test_shrinking_retires_workers_without_an_error_and_they_exit() -> None:
    pool = WorkerPool(square_factory, num_workers=3)
    pids = set(pool.worker_pids)
    assert len(pids) == 3
    it = pool.imap(range(200))
    for k, _ in enumerate(it):
        if k == 5:
            pool.resize(1)
    # The two retired workers left once they owed nothing; the last one is still serving.
    assert len(child_pids() & pids) == 1 and list(pool.imap(range(4)))[3][0] == 9
    pool.close()
    _wait_gone(pids)


def test_growing_back_reuses_worker_ids_and_passes_stay_exact() -> None:
    with WorkerPool(square_factory, num_workers=2) as pool:
        pool.resize(1)
        assert [v for v, _, _ in pool.imap(range(20))] == [x * x for x in range(20)]
        pool.resize(3, prefetch=4)
        out = list(pool.imap(range(30)))
        assert [v for v, _, _ in out] == [x * x for x in range(30)]
        assert {w for _, w, _ in out} == {0, 1, 2} and pool.workers_ready


def test_inline_pool_hands_the_rest_of_the_pass_to_new_workers() -> None:
    with WorkerPool(square_factory, num_workers=0) as pool:
        it = pool.imap(range(50))
        first = [next(it) for _ in range(5)]
        assert {pid for _, _, pid in first} == {os.getpid()}
        pool.resize(2)
        rest = list(it)
        assert [v for v, _, _ in first + rest] == [x * x for x in range(50)]
        assert os.getpid() not in {pid for _, _, pid in rest[10:]}


def test_resize_is_refused_while_workers_walk_their_own_iterators() -> None:
    with WorkerPool(walk_factory, num_workers=2) as pool:
        it = pool.imap_until_exhausted(lambda w: None)
        next(it)
        with pytest.raises(ConfigError, match="imap_until_exhausted"):
            pool.resize(1)
        assert sorted([0] + list(it)) == [0, 0, 0, 1, 1, 1]
        pool.resize(1)  # between passes it is fine


@pytest.mark.parametrize("kwargs", [dict(num_workers=-1), dict(num_workers=1, prefetch=0)])
def test_bad_resize_arguments_are_config_errors(kwargs: dict[str, Any]) -> None:
    with WorkerPool(square_factory, num_workers=0) as pool:
        with pytest.raises(ConfigError):
            pool.resize(**kwargs)


def test_resize_after_close_is_a_config_error() -> None:
    pool = WorkerPool(square_factory, num_workers=1)
    pool.close()
    with pytest.raises(ConfigError, match="closed"):
        pool.resize(2)
    del pool
    gc.collect()
