"""Faults in workers: crashes and errors are reported at once, named, and leave nothing behind.

Complements tests/integration/test_loader_workers.py (SIGKILL, Ctrl-C, timeouts, break/del).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, TensorDataset

import naiad
from naiad.parallel import WorkerContext, WorkerPool
from tests.helpers import (
    INTERRUPTIBLE,
    assert_same_batches,
    child_pids,
    settle_workers,
    shm_entries,
    started,
    wait_gone,
)

pytestmark = pytest.mark.timeout(60)


class Crashing(Dataset):
    """Row ``at`` ends its process: ``exit`` (os._exit(3)), ``segv`` (SIGSEGV) or ``raise``."""

    def __init__(self, n: int, at: int, how: str) -> None:
        self.n, self.at, self.how = n, at, how

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.at:
            if self.how == "exit":
                os._exit(3)
            if self.how == "segv":
                faulthandler.disable()  # pytest's handler would print the worker's stack
                os.kill(os.getpid(), signal.SIGSEGV)
            raise ValueError(f"bad row {i}")
        return np.full(4, i, np.float32)


@pytest.mark.parametrize(
    ("how", "exitcode", "words"),
    [("exit", 3, "exited with code 3"), ("segv", -signal.SIGSEGV, "killed by signal SIGSEGV")],
)
def test_worker_crash_raises_worker_error_naming_worker_code_and_batch(how: str, exitcode: int, words: str) -> None:
    before, shm = child_pids(), shm_entries()
    loader = naiad.DataLoader(Crashing(64, at=21, how=how), batch_size=4, num_workers=2)
    t0 = time.monotonic()
    with pytest.raises(naiad.WorkerError) as info:
        list(loader)
    assert time.monotonic() - t0 < 5
    err = info.value
    # Row 21 is in batch 5, which went to worker 1 (batches alternate between the two).
    assert err.worker_id == 1 and err.exitcode == exitcode
    assert words in str(err) and "batch 5" in str(err) and "21" in str(err)
    settle_workers(before, shm)


def test_thread_worker_error_keeps_type_and_names_worker_and_index() -> None:
    loader = naiad.DataLoader(Crashing(64, at=21, how="raise"), batch_size=4, num_workers=2, worker_mode="thread")
    with pytest.raises(ValueError, match="bad row 21") as info:
        list(loader)
    notes = "\n".join(info.value.__notes__)
    assert "dataset[21]" in notes and "worker 1" in notes and "batch 5" in notes


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_out_of_order_error_is_raised_and_names_the_index(mode: str) -> None:
    before, shm = child_pids(), shm_entries()
    loader = naiad.DataLoader(Crashing(64, at=21, how="raise"), batch_size=4, num_workers=2, worker_mode=mode, in_order=False)
    seen = 0
    with pytest.raises(ValueError, match="bad row 21") as info:
        for _ in loader:
            seen += 1
    assert seen < 16 and "dataset[21]" in "\n".join(info.value.__notes__)
    # The pass goes on after a batch's exception (as torch's); the traceback holds its
    # iterator, so the workers stop once the exception is let go.
    del info
    settle_workers(before, shm)


def test_out_of_order_crash_is_a_worker_error() -> None:
    before, shm = child_pids(), shm_entries()
    loader = naiad.DataLoader(Crashing(64, at=21, how="exit"), batch_size=4, num_workers=2, in_order=False)
    with pytest.raises(naiad.WorkerError, match="exited with code 3"):
        list(loader)
    settle_workers(before, shm)


def test_persistent_workers_after_a_break_give_a_full_correct_next_epoch() -> None:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(300, 4, generator=g), torch.arange(300))
    loader = naiad.DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)
    for k, _ in enumerate(loader):
        if k == 3:
            break
    pids = set(loader._pools.kept.worker_pids)  # type: ignore[union-attr]
    assert_same_batches(list(TorchDataLoader(ds, batch_size=16)), list(loader))
    assert set(loader._pools.kept.worker_pids) == pids  # type: ignore[union-attr]
    loader.close()


def test_persistent_workers_after_an_error_give_a_full_next_epoch() -> None:
    class FailsOnce(Dataset):
        def __init__(self) -> None:
            self.path = f"/tmp/naiad-fails-once-{os.getpid()}"

        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> int:
            if i == 13 and not os.path.exists(self.path):
                open(self.path, "w").close()
                raise KeyError(i)
            return i

    ds = FailsOnce()
    try:
        loader = naiad.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
        with pytest.raises(KeyError):
            list(loader)
        assert torch.cat(list(loader)).tolist() == list(range(40))
        loader.close()
    finally:
        if os.path.exists(ds.path):
            os.remove(ds.path)


def big_factory(context: WorkerContext) -> Any:
    def handle(k: int) -> dict[str, Any]:
        if k == 3 and context.worker_id == 1:
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        # Large enough for shared memory, small enough to be quick.
        return {"x": np.full((1 << 20,), k, np.float64), "t": torch.full((1 << 20,), float(k))}

    return handle


def test_killed_worker_with_shared_memory_batches_leaves_no_segment() -> None:
    before, shm = child_pids(), shm_entries()
    pool = WorkerPool(big_factory, num_workers=2)
    with pytest.raises(naiad.WorkerError, match="SIGKILL"):
        for k, batch in enumerate(pool.imap(range(12))):
            assert float(batch["x"][0]) == k and float(batch["t"][-1]) == k
    pool.close()
    del pool, batch
    settle_workers(before, shm)


def test_worker_local_factory_error_is_a_start_up_error() -> None:
    def broken() -> Any:
        raise OSError("cannot open /data/shard-7")

    ds = naiad.dataset.worker.WorkerLocal(broken, length=10)
    with pytest.raises(OSError, match="shard-7") as info:
        list(naiad.DataLoader(ds, batch_size=2, num_workers=2))
    assert "while starting" in "\n".join(info.value.__notes__)


CTRL_C_SCRIPT = INTERRUPTIBLE + """
import sys
sys.path.insert(0, {root!r})
from naiad.parallel import WorkerPool
from tests.integration.test_workers_faults import slow_factory
pool = WorkerPool(slow_factory, num_workers={workers}, mode={mode!r})
it = pool.imap(range(10**6))
next(it)
pool.resize({resize})  # a pool whose size changed mid-pass stops as cleanly
next(it)
print("running", flush=True)
for _ in it:
    pass
"""


def slow_factory(context: WorkerContext) -> Any:
    def handle(x: int) -> int:
        time.sleep(0.001)
        return x

    return handle


@pytest.mark.parametrize(("mode", "workers", "resize"), [("thread", 2, 2), ("process", 0, 2), ("process", 2, 1)])
def test_ctrl_c_stops_threads_and_resized_pools_cleanly(mode: str, workers: int, resize: int) -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = CTRL_C_SCRIPT.format(root=root, mode=mode, workers=workers, resize=resize)
    with started([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 cwd=root) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err and err.count("Traceback") == 1, err
        wait_gone(children, 10, "a worker outlived the interrupted process")


@pytest.mark.timeout(60)
def test_a_thread_pool_closed_from_its_own_worker_thread_shuts_down() -> None:
    """The cyclic garbage collector can collect a loader in one of its own read-ahead threads;
    closing the pool there must not try to join that thread (RuntimeError), and every thread
    still ends."""
    import threading

    holder: dict[str, WorkerPool] = {}

    def factory(ctx: WorkerContext) -> Any:
        def handle(x: int) -> int:
            if x == 3:
                holder["pool"].close()
            return x * 2
        return handle

    pool = WorkerPool(factory, num_workers=2, mode="thread")
    holder["pool"] = pool
    before = set(threading.enumerate())
    results = list(pool.imap(range(4), prefetch=1))
    assert results == [0, 2, 4, 6]
    started = [t for t in threading.enumerate() if t not in before]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(t.is_alive() for t in started):
        time.sleep(0.05)
    assert not [t.name for t in started if t.is_alive()]
    pool.close()
