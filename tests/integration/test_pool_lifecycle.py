"""The life of a worker pool across passes and loaders: two passes over one kept pool, a process
that raises while it holds a pass, workers that go with their loader, a worker that cannot be
told to stop (NOTE [ Passes sharing a pool ] in naiad/parallel/pool.py, NOTE [ Two passes at
once ] in naiad/loader.py, NOTE [ Exit with tasks in flight ] in naiad/parallel/backend.py).

Every loader here has a `timeout`, so a pass that would wait forever for a result fails instead.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import torch.multiprocessing
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

import naiad
from naiad.parallel import RestartBudget, WorkerContext, WorkerPool
from tests.helpers import child_pids

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20  # a pass that waits this long for one result has lost it


class SlowItems(Dataset):
    """Item ``i`` is ``i``, after ``delay_s`` of sleep (the issue's 5 ms items)."""

    def __init__(self, n: int, delay_s: float = 0.005) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay_s)
        return i


class SplitRange(IterableDataset):
    """0..n-1, split between the workers as torch's documentation does, 5 ms an item."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            time.sleep(0.005)
            yield i


def as_lists(batches: Any) -> list[list[int]]:
    return [b.tolist() for b in batches]


def two_passes_at_once(loader: Any) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The issue's sequence: the first batch of one pass, a whole second pass, then the rest of
    the first."""
    it1 = iter(loader)
    first = as_lists([next(it1)])
    second = as_lists(loader)
    rest = as_lists(it1)
    return first, second, rest


def _kill_tree(pids: list[int]) -> None:
    """SIGKILL the processes ``pids`` and everything they started."""
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            victims = [*proc.children(recursive=True), proc]
        except psutil.NoSuchProcess:
            continue
        for v in victims:
            try:
                v.kill()
            except psutil.NoSuchProcess:
                pass


def _wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """The pids of ``pids`` still running (not zombies) after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = pids & child_pids()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = pids & child_pids()
    return left


# -- two passes over one kept pool ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_persistent_workers_new_pass_ends_the_one_before_as_torch(mode: str) -> None:
    ds = SlowItems(40)
    expected = two_passes_at_once(TorchDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True))
    # torch resets its one persistent iterator at iter(): the whole epoch goes to the second pass,
    # and the first has nothing more.
    assert expected == ([[0, 1, 2, 3]], [list(range(i, i + 4)) for i in range(0, 40, 4)], [])
    loader = naiad.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, worker_mode=mode,
                              timeout=TIMEOUT_S)
    try:
        assert two_passes_at_once(loader) == expected
        pool = loader._pools.kept
        assert pool is not None
        pids = pool.worker_pids
        # The kept workers go on serving the passes that follow.
        assert as_lists(loader) == expected[1]
        assert loader._pools.kept is pool and pool.worker_pids == pids
    finally:
        loader.close()


def test_persistent_workers_new_pass_ends_an_iterable_dataset_walk_as_torch() -> None:
    ds = SplitRange(24)
    expected = two_passes_at_once(TorchDataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True))
    assert expected[2] == [] and sorted(sum(expected[1], [])) == list(range(24))
    loader = naiad.DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True, timeout=TIMEOUT_S)
    try:
        assert two_passes_at_once(loader) == expected
        assert as_lists(loader) == expected[1]
    finally:
        loader.close()


def test_passes_over_a_tuned_pool_are_independent() -> None:
    # num_workers="auto" keeps its pool across passes but was not asked to persist: like torch's
    # iterators without persistent workers, each pass delivers its whole epoch.
    ds = SlowItems(400, delay_s=0.002)  # 8 ms a batch, the loop waits: the tuner takes workers
    loader = naiad.DataLoader(ds, batch_size=4, num_workers="auto", shuffle=True, seed=3, timeout=TIMEOUT_S)
    try:
        list(loader)  # epoch 0: the tuner moves off 0 workers
        assert loader.stats().workers["num_workers"] > 0
        first, second, rest = two_passes_at_once(loader)  # epochs 1 and 2
    finally:
        loader.close()
    reference = naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    reference.set_epoch(1)
    assert first + rest == as_lists(reference)
    assert second == as_lists(reference)


def make_csv(path: Path, n: int = 5000) -> str:
    path.write_text("id,x\n" + "".join(f"{i},{i % 17}.5\n" for i in range(n)))
    return str(path)


def stream_ids(batches: Any) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def test_passes_over_a_stream_read_ahead_are_independent(tmp_path: Path) -> None:
    # The read-ahead threads of a stream left at num_workers=0 are kept across passes; the passes
    # stay independent, as torch's num_workers=0 iterators are.
    path = make_csv(tmp_path / "d.csv")

    def make(read_ahead: int) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_csv(path, block_bytes=2000), batch_size=100, shuffle=True, seed=4,
                                shuffle_buffer=700, read_ahead=read_ahead, timeout=TIMEOUT_S)

    loader = make(2)
    try:
        it1 = iter(loader)
        first = stream_ids([next(it1)])
        second = stream_ids(loader)
        rest = stream_ids(it1)
        assert loader.stats().workers["read_ahead"] == 2
    finally:
        loader.close()
    reference = make(0)
    assert first + rest == stream_ids(reference)
    assert second == stream_ids(reference)


def _slow_square_factory(context: WorkerContext) -> Callable[[int], int]:
    def square(x: int) -> int:
        time.sleep(0.005)
        return x * x

    return square


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_two_passes_over_one_pool_each_receive_their_own_results(mode: str) -> None:
    with WorkerPool(_slow_square_factory, num_workers=2, mode=mode, timeout_s=TIMEOUT_S) as pool:
        a = pool.imap(range(20))
        first = next(a)
        b = pool.imap(range(100, 130))
        assert next(b) == 100 * 100
        assert next(a) == 1  # each in turn, while the other's results are in flight
        assert list(b) == [x * x for x in range(101, 130)]
        assert [first, 1, *a] == [x * x for x in range(20)]


def test_a_pass_waiting_on_a_worker_that_died_during_another_pass_raises() -> None:
    with WorkerPool(_slow_square_factory, num_workers=2, timeout_s=None) as pool:
        a = pool.imap(range(40))
        next(a)  # worker 1 owes `a` results from now on
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        with pytest.raises(naiad.WorkerError, match="worker 1"):
            list(pool.imap(range(100, 140)))  # this pass sees the death
        t0 = time.monotonic()
        with pytest.raises(naiad.WorkerError, match="worker 1"):
            list(a)  # and the other pass, which waited on that worker, is told, not left waiting
        assert time.monotonic() - t0 < 10


def test_a_worker_replaced_during_another_pass_owes_both_passes() -> None:
    with WorkerPool(_slow_square_factory, num_workers=2, restarts=RestartBudget(2), timeout_s=TIMEOUT_S) as pool:
        a = pool.imap(range(40))
        next(a)
        b = pool.imap(range(100, 140))
        next(b)  # both passes have tasks with worker 1
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        assert [100 * 100, *b] == [x * x for x in range(100, 140)]
        assert [0, *a] == [x * x for x in range(40)]
        assert pool.restarts.count == 1


# -- a process that raises while it holds a pass ---------------------------------------------------


class EmptyItems(Dataset):
    """Empty tensors, one of them slow: torch's EmptyTensorDataset of test_large_sampler_indices."""

    def __init__(self, n: int, slow_at: int) -> None:
        self.n, self.slow_at = n, slow_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.slow_at:
            time.sleep(2.0)
        return torch.empty(0)


def _raise_mid_pass(rank: int, persistent: bool) -> None:
    """A DDP rank as torch.multiprocessing.spawn starts it, raising inside its loop. Batches of
    40,960 indices make tasks of 320 KB, so the task queue's feeder thread is blocked writing to
    a busy worker when the exception ends the process (pytorch#48666)."""
    sys.stderr = open(os.devnull, "w")  # the traceback is expected
    loader = naiad.DataLoader(EmptyItems(10_000_000, slow_at=50_000), batch_size=40960, num_workers=1,
                              prefetch_factor=4, persistent_workers=persistent)
    for batch in loader:
        assert batch.numel() == 0
        raise RuntimeError("raised mid-pass")


@pytest.mark.parametrize("persistent", [True, False])
def test_a_spawned_process_that_raises_mid_pass_exits(persistent: bool) -> None:
    context = torch.multiprocessing.spawn(_raise_mid_pass, args=(persistent,), nprocs=1, join=False,
                                          start_method="spawn")
    pids = [p.pid for p in context.processes]
    try:
        deadline = time.monotonic() + 60
        ended = False
        with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="raised mid-pass"):
            while not ended and time.monotonic() < deadline:
                ended = context.join(timeout=1)
        assert not any(p.is_alive() for p in context.processes), "the process hung in its exit handlers"
    finally:
        _kill_tree(pids)


# -- workers go with their loader ------------------------------------------------------------------


def _naiad_worker_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("naiad-worker-")}


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_dropping_a_persistent_loader_stops_its_workers_without_the_cyclic_collector(mode: str) -> None:
    before_pids, before_threads = child_pids(), _naiad_worker_threads()
    gc.collect()
    gc.disable()
    try:
        loader = naiad.DataLoader(SlowItems(40, delay_s=0.0), batch_size=4, num_workers=2, persistent_workers=True,
                                  worker_mode=mode, timeout=TIMEOUT_S)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert len(as_lists(loader)) == 10
        it = iter(loader)
        next(it)
        workers = child_pids() - before_pids
        threads = _naiad_worker_threads() - before_threads
        assert len(workers if mode == "process" else threads) == 2
        del it, loader
        # Reference counting alone: the collector is off.
        assert not _wait_gone(workers, timeout_s=5.0), "process workers outlived their loader"
        for t in threads:
            t.join(timeout=5.0)
        assert not any(t.is_alive() for t in threads), "thread workers outlived their loader"
    finally:
        gc.enable()


@pytest.mark.parametrize("persistent", [True, False])
def test_iterator_workers_can_be_joined_after_the_iterator_goes(persistent: bool) -> None:
    # torch's test_partial_workers: the loader is a temporary, the test keeps
    # `iterator._workers` (torch's private list of worker processes), breaks, drops the iterator.
    gc.disable()
    try:
        it = iter(naiad.DataLoader(SlowItems(100, delay_s=0.0), batch_size=2, num_workers=4,
                                   persistent_workers=persistent))
        workers = it._workers
        assert len(workers) == 4 and all(w.is_alive() for w in workers)
        for i, _ in enumerate(it):
            if i == 10:
                break
        del it
        for w in workers:
            w.join(5.0)
            assert not w.is_alive(), "worker not stopped"
    finally:
        gc.enable()


def test_iterator_workers_of_an_exhausted_iterable_pass_exit_cleanly() -> None:
    # torch's test_iterable_style_dataset: after an exhausted pass, the workers leave with code 0.
    loader = naiad.DataLoader(SplitRange(20), batch_size=None, num_workers=3, persistent_workers=True)
    it = iter(loader)
    assert sorted(it) == list(range(20))
    workers = it._workers
    del it, loader
    try:
        for w in workers:
            w.join(5.0)
            assert not w.is_alive() and w.exitcode == 0
    finally:
        for w in workers:
            w.terminate()


def test_a_pass_outlives_its_dropped_persistent_loader() -> None:
    ds = TensorDataset(torch.arange(40))
    it = iter(naiad.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, timeout=TIMEOUT_S))
    gc.collect()  # the loader is gone; its pass holds the workers
    assert [b.tolist() for (b,) in it] == [list(range(i, i + 4)) for i in range(0, 40, 4)]


@pytest.mark.parametrize("load_after_iter", [False, True])
def test_a_resume_reaches_a_pass_whose_loader_was_dropped(load_after_iter: bool) -> None:
    def make() -> naiad.DataLoader:
        return naiad.DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True, seed=5)

    first = make()
    it = iter(first)
    head = [next(it)[0].tolist() for _ in range(3)]
    state = first.state_dict()
    tail = [b.tolist() for (b,) in it]
    loader = make()
    if load_after_iter:
        resumed = iter(loader)
        loader.load_state_dict(state)
    else:
        loader.load_state_dict(state)
        resumed = iter(loader)
    del loader
    assert len(head) == 3 and [b.tolist() for (b,) in resumed] == tail


# -- a worker that cannot be told to stop ----------------------------------------------------------


class RefusingQueue:
    """A task queue whose every put fails, as when no thread can be started for its feeder."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def put(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    def put_nowait(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _square_factory(context: WorkerContext) -> Callable[[int], int]:
    return lambda x: x * x


def _ignore_sigterm(worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_a_retired_worker_whose_stop_message_fails_is_terminated() -> None:
    with WorkerPool(_square_factory, num_workers=2, timeout_s=TIMEOUT_S) as pool:
        assert list(pool.imap(range(8))) == [x * x for x in range(8)]
        backend = pool._workers.backend
        assert backend is not None
        victim = backend.procs[1]  # type: ignore[union-attr]
        backend.channels[1] = RefusingQueue(backend.channels[1])
        pool.resize(1)
        victim.join(5.0)
        assert not victim.is_alive(), "a retired worker that could not be told kept running"
        # Its end is a retirement, not a death: the pool goes on.
        assert list(pool.imap(range(8))) == [x * x for x in range(8)]


def test_close_ends_a_worker_whose_stop_message_fails_and_that_ignores_sigterm() -> None:
    pool = WorkerPool(_square_factory, num_workers=1, worker_init_fn=_ignore_sigterm)
    try:
        assert list(pool.imap(range(4))) == [0, 1, 4, 9]
        backend = pool._workers.backend
        assert backend is not None
        victim = backend.procs[0]  # type: ignore[union-attr]
        backend.channels[0] = RefusingQueue(backend.channels[0])
        t0 = time.monotonic()
        pool.close()  # ask (fails), wait, terminate (ignored), kill
        assert time.monotonic() - t0 < 10
        assert not victim.is_alive() and victim.exitcode == -signal.SIGKILL
    finally:
        pool.close()
        _kill_tree([w.pid for w in pool.worker_handles if w.pid is not None])


def test_worker_handles_are_usable_after_close() -> None:
    pool = WorkerPool(_square_factory, num_workers=2)
    assert list(pool.imap(range(4))) == [0, 1, 4, 9]
    handles = pool.worker_handles
    pool.close()
    assert [h.exitcode for h in handles] == [0, 0] and not any(h.is_alive() for h in handles)
    assert np.all([h.pid for h in handles])
