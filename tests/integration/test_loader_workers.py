"""naiad.DataLoader with worker processes and threads: same batches, errors, clean teardown."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import naiad
from tests.helpers import (
    INTERRUPTIBLE,
    assert_same_batches,
    child_pids,
    shm_entries,
    started,
    wait_gone,
)

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SlowDataset(Dataset):
    def __init__(self, n: int, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.n, self.delay_s, self.fail_at = n, delay_s, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.fail_at:
            raise KeyError(f"row {i} is missing")
        if self.delay_s:
            time.sleep(self.delay_s)
        return {"i": i, "x": np.full(3, i, np.float32), "tag": f"t{i}"}


class ShardedIterable(IterableDataset):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes  # rows each worker yields

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w = 0 if info is None else info.id
        for j in range(self.sizes[w]):
            yield torch.tensor([w, j])


def tensor_dataset(n: int = 1000) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g))


@pytest.mark.parametrize("dataset", [tensor_dataset(), SlowDataset(53)], ids=["gather", "items"])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_workers_yield_torch_batches(dataset: Any, mode: str) -> None:
    torch.manual_seed(3)
    expected = list(TorchDataLoader(dataset, batch_size=16, shuffle=True))
    torch.manual_seed(3)
    got = list(naiad.DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, worker_mode=mode))
    assert_same_batches(expected, got)


def test_iterable_dataset_workers_interleave_like_torch() -> None:
    ds = ShardedIterable([5, 17])
    for kwargs in (dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)):
        expected = list(TorchDataLoader(ds, num_workers=2, **kwargs))
        got = list(naiad.DataLoader(ds, num_workers=2, **kwargs))
        assert_same_batches(expected, got)


def test_persistent_workers_keep_processes_and_order() -> None:
    ds = tensor_dataset(200)
    loader = naiad.DataLoader(ds, batch_size=32, shuffle=True, seed=7, num_workers=2, persistent_workers=True)
    first = list(loader)
    pids = set(loader._pools.kept.worker_pids)  # type: ignore[union-attr]
    second = list(loader)
    assert set(loader._pools.kept.worker_pids) == pids  # type: ignore[union-attr]
    # Different epochs, different orders; each a permutation.
    for epoch in (first, second):
        rows = torch.cat([b[0] for b in epoch])
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, ds.tensors[0].tolist()))
    assert len(first) == len(second) == 7
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(first, second, strict=True))
    del loader
    gc.collect()


def test_seed_order_is_independent_of_workers_and_reproducible() -> None:
    ds = tensor_dataset(500)

    def run(**kw: Any) -> list[Any]:
        return list(naiad.DataLoader(ds, batch_size=50, shuffle=True, seed=11, **kw))

    serial = run()
    assert_same_batches(serial, run(num_workers=2))
    assert_same_batches(serial, run(num_workers=2, worker_mode="thread"))
    assert_same_batches(serial, run())


def test_seed_epochs_are_permutations_and_differ() -> None:
    ds = naiad.ArrayDataset(np.arange(1000))
    loader = naiad.DataLoader(ds, batch_size=100, shuffle=True, seed=1)
    epochs = [torch.cat([b[0] for b in loader]).numpy() for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(1000))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    loader.set_epoch(1)
    assert np.array_equal(torch.cat([b[0] for b in loader]).numpy(), epochs[1])
    # Unshuffled order untouched by the seed; shuffled order not the identity.
    assert not np.array_equal(epochs[0], np.arange(1000))


def test_seed_and_generator_conflict_is_a_config_error() -> None:
    with pytest.raises(naiad.ConfigError, match="generator"):
        naiad.DataLoader(tensor_dataset(10), shuffle=True, seed=1, generator=torch.Generator())


def test_generator_shuffle_matches_torch_with_workers() -> None:
    ds = tensor_dataset(300)
    expected = list(TorchDataLoader(ds, batch_size=30, shuffle=True, generator=torch.Generator().manual_seed(9)))
    got = list(
        naiad.DataLoader(ds, batch_size=30, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(9))
    )
    assert_same_batches(expected, got)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_error_keeps_type_and_names_index(num_workers: int) -> None:
    loader = naiad.DataLoader(SlowDataset(40, fail_at=13), batch_size=4, num_workers=num_workers)
    with pytest.raises(KeyError, match="row 13 is missing") as info:
        list(loader)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "dataset[13]" in notes
    if num_workers:
        assert "worker" in notes and "batch 3" in notes


def test_collate_error_names_indices() -> None:
    def bad_collate(samples: list[Any]) -> Any:
        raise ValueError("cannot stack")

    with pytest.raises(ValueError, match="cannot stack") as info:
        next(iter(naiad.DataLoader(SlowDataset(10), batch_size=3, collate_fn=bad_collate, num_workers=2)))
    assert "collate_fn" in "\n".join(info.value.__notes__) and "[0, 1, 2]" in "\n".join(info.value.__notes__)


def test_worker_init_fn_error_is_reported() -> None:
    def init(worker_id: int) -> None:
        raise RuntimeError(f"init failed in {worker_id}")

    with pytest.raises(RuntimeError, match="init failed"):
        list(naiad.DataLoader(tensor_dataset(10), num_workers=2, worker_init_fn=init))


def _assert_workers_gone(before: set[int], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (child_pids() - before), f"workers left behind: {child_pids() - before}"


@pytest.mark.parametrize("how", ["break", "exception", "del", "exhaust"])
def test_no_worker_or_shared_memory_left_behind(how: str) -> None:
    before, shm_before = child_pids(), shm_entries()
    loader = naiad.DataLoader(SlowDataset(400, fail_at=200), batch_size=8, num_workers=2)
    it = iter(loader)
    if how == "break":
        for i, _ in enumerate(it):
            if i == 3:
                break
        it.close()
        del it
    elif how == "exception":
        with pytest.raises(KeyError):
            list(it)
        # As with torch, a batch's exception leaves the pass going; dropping it stops it.
        assert next(it) is not None
        del it
    elif how == "del":
        next(it)
        del it
    else:
        list(naiad.DataLoader(SlowDataset(40), batch_size=8, num_workers=2))
        next(it)
        del it
    gc.collect()
    _assert_workers_gone(before)
    assert shm_entries() <= shm_before


def test_break_in_for_loop_then_gc_stops_workers() -> None:
    before = child_pids()

    def consume() -> None:
        for i, _ in enumerate(naiad.DataLoader(SlowDataset(400), batch_size=8, num_workers=2)):
            if i == 2:
                break

    consume()
    gc.collect()
    _assert_workers_gone(before)


def test_killed_worker_raises_worker_error_quickly() -> None:
    before = child_pids()
    loader = naiad.DataLoader(SlowDataset(2000, delay_s=0.002), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    victim = sorted(child_pids() - before)[0]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(naiad.WorkerError) as info:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 5
    err = info.value
    assert err.exitcode == -signal.SIGKILL and "SIGKILL" in str(err) and str(victim) in str(err)
    assert isinstance(err, RuntimeError)  # what torch raises, so existing handlers still catch it
    del it
    gc.collect()
    _assert_workers_gone(before)


def test_timeout_raises_instead_of_hanging() -> None:
    loader = naiad.DataLoader(SlowDataset(10, delay_s=3.0), batch_size=2, num_workers=1, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(naiad.WorkerError, match="timeout"):
        next(iter(loader))
    assert time.monotonic() - t0 < 3


CTRL_C_SCRIPT = INTERRUPTIBLE + textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    import naiad
    from tests.integration.test_loader_workers import SlowDataset
    loader = naiad.DataLoader(SlowDataset(100000, delay_s=0.001), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    import psutil
    print(" ".join(str(p.pid) for p in psutil.Process().children()), flush=True)
    for batch in it:
        pass
    """
)


def test_ctrl_c_stops_cleanly_without_orphans() -> None:
    with started([sys.executable, "-c", CTRL_C_SCRIPT.format(root=ROOT)], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) >= 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        assert err.count("Traceback") == 1, err  # the main process's only: workers stay quiet
        wait_gone(workers, 10, "worker outlived the interrupted training process")


def test_workers_exit_when_parent_is_killed() -> None:
    script = CTRL_C_SCRIPT.format(root=ROOT)
    with started([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        proc.kill()
        proc.wait(timeout=10)
        wait_gone(workers, 15, "orphaned worker kept running")


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_other_start_methods(context: str) -> None:
    ds = tensor_dataset(100)
    expected = list(TorchDataLoader(ds, batch_size=25))
    got = list(naiad.DataLoader(ds, batch_size=25, num_workers=2, multiprocessing_context=context))
    assert_same_batches(expected, got)


def test_persistent_workers_two_epochs_match_torch_global_seed() -> None:
    ds = tensor_dataset(120)
    kwargs: dict[str, Any] = dict(batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
    torch.manual_seed(21)
    tl = TorchDataLoader(ds, **kwargs)
    expected = [list(tl), list(tl)]
    torch.manual_seed(21)
    nl = naiad.DataLoader(ds, **kwargs)
    got = [list(nl), list(nl)]
    assert_same_batches(expected[0], got[0])
    assert_same_batches(expected[1], got[1])


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_in_order_false_yields_every_batch_once(mode: str) -> None:
    ds = SlowDataset(60, delay_s=0.001)
    got = list(naiad.DataLoader(ds, batch_size=4, num_workers=2, in_order=False, worker_mode=mode))
    ids = sorted(int(i) for b in got for i in b["i"])
    assert ids == list(range(60))


@pytest.mark.parametrize("how", ["break", "exception"])
def test_device_prefetch_over_workers_leaves_nothing_behind(how: str) -> None:
    import threading

    before, threads_before = child_pids(), {t.ident for t in threading.enumerate()}
    loader = naiad.DataLoader(SlowDataset(400, fail_at=100), batch_size=8, num_workers=2, device="cpu")
    if how == "break":
        for i, _ in enumerate(loader):
            if i == 3:
                break
    else:
        with pytest.raises(KeyError, match="row 100"):
            list(loader)
    gc.collect()
    _assert_workers_gone(before)
    deadline = time.monotonic() + 10
    while {t.ident for t in threading.enumerate() if t.name == "naiad-prefetch"} - threads_before:
        assert time.monotonic() < deadline, "prefetch thread left running"
        time.sleep(0.05)
