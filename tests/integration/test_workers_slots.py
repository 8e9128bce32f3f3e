"""Batch slots (NOTE [ Batch transport ]): a process worker's batches cross through shared memory
it reuses, never written while the training process still views it, and nothing outlives a kill.

The task channel (NOTE [ Task channel ]) is tested here too: tasks go out without ever blocking,
even when a worker's socket is full both ways.
"""

from __future__ import annotations

import collections
import gc
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset

import naiad
from naiad.parallel import WorkerContext, WorkerPool, slots
from tests.helpers import child_pids, settle_workers, shm_entries

pytestmark = pytest.mark.timeout(90)


def batch(k: int, rows: int = 1) -> dict[str, Any]:
    return {
        "x": torch.full((rows, 1000), float(k), dtype=torch.float32),
        "bf16": torch.full((7,), float(k), dtype=torch.bfloat16),
        "n": np.full(500, k, np.int64),
        "strided": np.arange(2000, dtype=np.int32).reshape(40, 50).T + k,
        "k": k,
    }


def _batches(context: WorkerContext) -> Any:
    return batch


def _growing(context: WorkerContext) -> Any:
    return lambda k: batch(k, rows=1 + 3 * k)


def _unpicklable_every_other(context: WorkerContext) -> Any:
    def handle(k: int) -> Any:
        out = batch(k)
        if k % 2:
            out["bad"] = lambda: None  # the result does not pickle, after its arrays took a slot
        return out

    return handle


def assert_batch(got: Any, k: int, rows: int = 1) -> None:
    want = batch(k, rows)
    assert got["k"] == k
    for name in ("x", "bf16"):
        assert torch.equal(got[name], want[name]) and got[name].dtype == want[name].dtype
    np.testing.assert_array_equal(got["n"], want["n"])
    np.testing.assert_array_equal(got["strided"], want["strided"])


def over_a_slot(array: Any) -> bool:
    """Whether ``array``'s memory lies in a worker's batch slot mapped here."""
    ptr = array.data_ptr() if isinstance(array, torch.Tensor) else array.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:naiad-batch" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= ptr < hi:
                    return True
    return False


def slots_since(before: dict[str, int]) -> int:
    return slots.memory()["slots"] - before["slots"]


def test_batches_cross_over_slots_exactly() -> None:
    shm, before = shm_entries(), slots.memory()
    with WorkerPool(_batches, num_workers=2) as pool:
        for k, got in enumerate(pool.imap(range(30))):
            assert_batch(got, k)
            assert over_a_slot(got["x"]) and over_a_slot(got["n"]) and over_a_slot(got["strided"])
            got["x"][0, 0] = -1.0  # a batch is the loop's to write
        assert slots_since(before) >= 2
    assert slots.memory() == before  # the pool's close forgets them
    assert shm_entries() <= shm


def test_a_held_batch_is_never_overwritten() -> None:
    # More batches held than a worker may have slots: the rest cross the old way, and none of
    # the held ones changes while the workers go on.
    held, before = [], slots.memory()
    with WorkerPool(_batches, num_workers=2) as pool:
        for got in pool.imap(range(4 * slots.MAX_SLOTS), prefetch=4):
            held.append(got)
        assert slots_since(before) <= 2 * slots.MAX_SLOTS
        for k, got in enumerate(held):
            assert_batch(got, k)
        assert sum(over_a_slot(g["x"]) for g in held) >= slots.MAX_SLOTS


def test_released_batches_free_their_slots_for_reuse() -> None:
    before = slots.memory()
    with WorkerPool(_batches, num_workers=2) as pool:
        for k, got in enumerate(pool.imap(range(300), prefetch=2)):
            assert_batch(got, k)
            assert over_a_slot(got["x"]), f"batch {k} did not come over a slot"
        # in flight per worker (2), the one the loop holds, the one arriving
        assert slots_since(before) <= 2 * 5


def test_a_bigger_batch_grows_its_slot() -> None:
    before = slots.memory()
    with WorkerPool(_growing, num_workers=1) as pool:
        for k, got in enumerate(pool.imap(range(40))):
            assert_batch(got, k, rows=1 + 3 * k)
            assert over_a_slot(got["x"])
        assert slots_since(before) <= slots.MAX_SLOTS


def test_a_result_that_does_not_pickle_gives_its_slot_back() -> None:
    with WorkerPool(_unpicklable_every_other, num_workers=1) as pool:
        results = pool.imap(range(60), prefetch=2)
        for k in range(60):
            if k % 2:
                with pytest.raises(Exception, match="pickle"):
                    next(results)
                continue
            got = next(results)
            assert_batch(got, k)
            assert over_a_slot(got["x"]), f"batch {k}: the slots were all held by failed results"
            del got


def test_the_owner_check_keeps_a_forked_child_from_freeing_a_slot() -> None:
    class Gone:
        pass

    for owner, want in ((os.getpid() + 1, 1), (os.getpid(), 0)):  # another process's copy; ours
        m, obj = slots._SlotMap(mmap.mmap(-1, 4096), 4096), Gone()
        m.flag[0] = 1
        ref = weakref.ref(obj, slots._GONE.append)
        slots._OUT[id(ref)] = (ref, weakref.ref(m), owner)
        del obj
        slots.collect()
        assert m.flag[0] == want and id(ref) not in slots._OUT


def batch_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:naiad-batch" in line for line in f)


def test_a_batch_dropped_after_its_pool_closed_takes_its_slot_mapping_with_it() -> None:
    # Nothing but the batch's arrays holds a slot of a closed pool: no later wait is needed.
    gc.collect()
    before = batch_mappings()
    with WorkerPool(_batches, num_workers=2) as pool:
        kept = collections.deque(pool.imap(range(40)), maxlen=3)
    assert all(over_a_slot(got["x"]) for got in kept)
    assert batch_mappings() > before
    del kept
    assert batch_mappings() <= before


def test_a_batch_dies_without_running_python_code() -> None:
    # A Ctrl-C is raised in whatever Python code runs when it lands; in code run by a dying
    # object it is printed and lost (NOTE [ Slot release ]). Nothing of naiad's may run there.
    with WorkerPool(_batches, num_workers=1) as pool:
        results = pool.imap(range(10))
        got = next(results)
        assert over_a_slot(got["x"])
        calls: list[str] = []
        sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
        try:
            del got
        finally:
            sys.setprofile(None)
        assert calls == [] and slots._GONE  # it died, and nothing ran
        gone = list(slots._GONE)
        assert [next(results)["k"] for _ in range(2)] == [1, 2]
        # Its slot went back when the next task went out.
        assert not any(slots._OUT.get(id(ref), (None,))[0] is ref for ref in gone)


def _big_tasks(context: WorkerContext) -> Any:
    return lambda payload: bytes(payload[:1]) * (4 << 20)  # bytes: pickled through the socket


def test_big_tasks_and_big_results_never_deadlock() -> None:
    # Both directions of a worker's socket fill: the training process must keep reading
    # results while its tasks wait for room (NOTE [ Task channel ]).
    payloads = [bytes([i]) * (6 << 20) for i in range(12)]
    with WorkerPool(_big_tasks, num_workers=2, timeout_s=60) as pool:
        for i, got in enumerate(pool.imap(payloads, prefetch=4)):
            assert len(got) == 4 << 20 and got[:1] == bytes([i])


class Tensors(Dataset[Any]):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((3, 32, 32), i % 251, dtype=torch.uint8), "i": i}


def test_a_loader_reports_its_slots_and_every_row_comes_once() -> None:
    loader = naiad.DataLoader(Tensors(), batch_size=16, shuffle=True, num_workers=2, persistent_workers=True)
    seen = []
    for b in loader:
        seen += b["i"].tolist()
        assert torch.equal(b["x"][:, 0, 0, 0], (b["i"] % 251).to(torch.uint8))
    assert sorted(seen) == list(range(400))
    info = loader.stats().workers["batch_slots"]
    assert info["slots"] >= 2 and info["bytes"] >= 2 * 16 * 3 * 32 * 32


_KILLED_LOOP = textwrap.dedent("""
    import sys, torch, naiad
    from torch.utils.data import Dataset
    class D(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i): return torch.full((64, 1024), i % 100, dtype=torch.uint8)
    held = []
    for b in naiad.DataLoader(D(), batch_size=8, num_workers=2):
        held.append(b)
        if len(held) == 20:
            print("holding", flush=True)
            sys.stdin.readline()
""")


def test_nothing_outlives_a_killed_training_process() -> None:
    shm = shm_entries()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "workers outlived the training process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for p in psutil.Process().children(recursive=True):
            if p.pid != proc.pid and p.ppid() == 1:
                p.kill()
    assert shm_entries() <= shm


class KilledOnce(Dataset[Any]):
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 77 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((256,), i, dtype=torch.int64)


def test_a_killed_worker_is_replaced_and_every_batch_is_exact(tmp_path: Any) -> None:
    before, shm = child_pids(), shm_entries()
    loader = naiad.DataLoader(KilledOnce(str(tmp_path / "killed")), batch_size=10, num_workers=2,
                              max_worker_restarts=1)
    rows = []
    held = []
    for b in loader:
        held.append(b)
        rows += b[:, 0].tolist()
        assert torch.equal(b, b[:, :1].expand(-1, 256))
    assert rows == list(range(200))
    assert [int(b[0, 0]) for b in held] == list(range(0, 200, 10))  # held ones unchanged
    assert loader.stats().workers["restarts"] == 1
    del loader, held
    time.sleep(0.1)
    settle_workers(before, shm)


def test_gathered_columns_are_built_in_the_slot_and_equal_the_loops() -> None:
    # ArrayDataset and token windows build their columns in the slot the batch crosses in
    # (slots.batch_array): the batches are torch's, bit for bit, and arrive without a copy.
    rng = np.random.default_rng(0)
    data = naiad.ArrayDataset({"image": rng.integers(0, 255, (1000, 28, 28), dtype=np.uint8),
                               "label": np.arange(1000)})
    kw: dict[str, Any] = {"batch_size": 64, "shuffle": True, "seed": 3}
    want = list(naiad.DataLoader(data, **kw))
    got = list(naiad.DataLoader(data, num_workers=2, **kw))
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w["image"], g["image"]) and torch.equal(w["label"], g["label"])
    assert sum(over_a_slot(g["image"]) for g in got) >= len(got) - 2 * slots.MAX_SLOTS


def test_an_index_out_of_range_raises_as_numpy_does_in_a_worker() -> None:
    data = naiad.ArrayDataset(np.arange(10))
    loader = naiad.DataLoader(data, batch_sampler=[[0, 1], [3, 10]], num_workers=1)
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1]
    with pytest.raises(IndexError, match="index 10 is out of bounds for axis 0 with size 10"):
        next(it)


def _fallback_then_unpicklable(context: WorkerContext) -> Any:
    def handle(k: int) -> Any:
        if k == 1:  # no arrays: no slot taken; and the result does not pickle
            return {"bad": lambda: None}
        return batch(k)

    return handle


def test_a_failed_result_never_frees_the_slot_of_a_batch_sent_before_it() -> None:
    with WorkerPool(_fallback_then_unpicklable, num_workers=1) as pool:
        results = pool.imap(range(3), prefetch=1)
        first = next(results)
        with pytest.raises(Exception, match="pickle"):
            next(results)
        third = next(results)  # had the failure freed batch 0's slot, this would be written over it
        assert_batch(first, 0)
        assert_batch(third, 2)
