"""WorkerPool inline and with threads: contexts, epochs, seeding helpers (no processes)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch

from naiad.errors import ConfigError
from naiad.parallel import Pinned, WorkerContext, WorkerPool, get_worker_context, worker_rng
from naiad.parallel.context import epoch_seed_sequence, seed_globals
from naiad.parallel.passes import MAX_BUNDLE, PassOptions, bundle_size
from naiad.parallel.workers import WorkerSet


def context_factory(context: WorkerContext) -> Any:
    def handle(x: int) -> tuple[int, Any, float]:
        ctx = get_worker_context()
        return x, (ctx.mode, ctx.worker_id) if ctx else None, float(worker_rng().random())

    return handle


def test_inline_handler_sees_an_inline_context_only_while_it_runs() -> None:
    pool = WorkerPool(context_factory, num_workers=0, base_seed=3)
    out = list(pool.imap(range(3)))
    assert [c for _, c, _ in out] == [("inline", 0)] * 3
    assert get_worker_context() is None


def test_passes_count_epochs_unless_named() -> None:
    pool = WorkerPool(context_factory, num_workers=0, base_seed=3)
    first = [r for _, _, r in pool.imap(range(2))]
    second = [r for _, _, r in pool.imap(range(2))]
    named = [r for _, _, r in pool.imap(range(2), epoch=0)]
    assert first == named != second
    assert first == list(np.random.default_rng(epoch_seed_sequence(3, 0, 0, 0)).random(2))


def test_thread_workers_get_their_own_streams_and_pinned_tasks_go_where_told() -> None:
    with WorkerPool(context_factory, num_workers=2, mode="thread", base_seed=3) as pool:
        out = list(pool.imap([Pinned(1, 0), Pinned(1, 1), Pinned(0, 2)], epoch=5))
    assert [c for _, c, _ in out] == [("thread", 1), ("thread", 1), ("thread", 0)]
    w1 = np.random.default_rng(epoch_seed_sequence(3, 5, 0, 1)).random(2)
    assert [r for _, _, r in out[:2]] == list(w1)


def test_rank_is_a_key_of_the_seed_sequence() -> None:
    a = WorkerPool(context_factory, num_workers=0, base_seed=3, rank=0)
    b = WorkerPool(context_factory, num_workers=0, base_seed=3, rank=1)
    assert list(a.imap([0], epoch=0)) != list(b.imap([0], epoch=0))


def test_seed_globals_is_deterministic_and_keeps_generators_apart() -> None:
    def draw() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    seed_globals(epoch_seed_sequence(1, 2, 0, 3))
    a = draw()
    seed_globals(epoch_seed_sequence(1, 2, 0, 3))
    assert draw() == a
    seed_globals(epoch_seed_sequence(1, 3, 0, 3))
    assert draw() != a


def test_negative_base_seeds_are_accepted() -> None:
    assert epoch_seed_sequence(-5, 0, 0, 0).entropy == [2**64 - 5, 0, 0, 0]


def test_worker_rng_outside_workers_follows_numpys_global_seed() -> None:
    np.random.seed(4)
    a = worker_rng().random()
    np.random.seed(4)
    assert worker_rng().random() == a


def test_init_inline_false_keeps_worker_init_fn_for_real_workers() -> None:
    calls: list[int] = []
    WorkerPool(context_factory, num_workers=0, worker_init_fn=calls.append, init_inline=False)
    assert calls == []
    WorkerPool(context_factory, num_workers=0, worker_init_fn=calls.append)
    assert calls == [0]


def test_closed_pool_refuses_work() -> None:
    pool = WorkerPool(context_factory, num_workers=0)
    pool.close()
    with pytest.raises(ConfigError, match="closed"):
        pool.imap([1])


@pytest.mark.parametrize(("bundle", "took", "takes", "size"), [
    (True, None, True, 1),  # no task timed yet: the first batch is not held back
    (True, 2e-3, True, 1),  # a task of a millisecond or more goes alone
    (True, 250e-6, True, 4),  # BUNDLE_S of tasks
    (True, 1e-6, True, MAX_BUNDLE),
    (True, 0.0, True, MAX_BUNDLE),
    (False, 1e-6, True, 1),  # the pass did not allow bundles
    (True, 1e-6, False, 1),  # threads take no bundles
])
def test_bundle_size_follows_the_measured_task_time(bundle: bool, took: float | None, takes: bool, size: int) -> None:
    options = PassOptions(prefetch=2, in_order=True, key=(0, 0), bundle=bundle)
    workers = cast(WorkerSet, SimpleNamespace(task_seconds=took, takes_bundles=takes))
    assert bundle_size(options, workers) == size
