"""Worker restarts (``max_worker_restarts``): a killed worker is replaced, the tasks it owed run
again, and the epoch is exactly the uninterrupted one; a task that kills its worker every time
and a spent budget are WorkerErrors; nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset, TensorDataset, get_worker_info

import naiad
from naiad.parallel import WorkerContext, WorkerPool
from naiad.parallel.restart import RestartBudget
from tests.helpers import assert_same_batches, child_pids, settle_workers, shm_entries

pytestmark = pytest.mark.timeout(60)

N = 96


class SelfKilling(Dataset):
    """A per-sample dataset whose worker ends itself at index ``i`` while ``flags/i`` exists.

    The flag is removed first, so the replayed task succeeds; without ``remove`` it kills every
    time. ``how``: "kill" (SIGKILL), "exit" (os._exit(3)) or "segv" (SIGSEGV).
    """

    def __init__(self, n: int, flags: Path, how: str = "kill", remove: bool = True) -> None:
        self.n, self.flags, self.how, self.remove = n, str(flags), how, remove

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        flag = os.path.join(self.flags, str(i))
        if os.path.exists(flag) and get_worker_info() is not None:
            if self.remove:
                os.unlink(flag)
            if self.how == "exit":
                os._exit(3)
            if self.how == "segv":
                import faulthandler

                faulthandler.disable()  # pytest's handler would print the worker's stack
                os.kill(os.getpid(), signal.SIGSEGV)
            os.kill(os.getpid(), signal.SIGKILL)
        # A draw from the global generator: a replayed task must draw the same numbers.
        return {"i": i, "x": np.full(3, i, np.float32), "noise": float(np.random.rand())}


class SelfKillingStream(IterableDataset):
    """Each worker walks its share of 0..n-1 (torch's split), killing itself as SelfKilling."""

    def __init__(self, n: int, flags: Path) -> None:
        self.n, self.flags = n, str(flags)

    def __iter__(self) -> Any:
        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, self.n, k):
            flag = os.path.join(self.flags, str(i))
            if os.path.exists(flag) and info is not None:
                os.unlink(flag)
                os.kill(os.getpid(), signal.SIGKILL)
            yield np.float32(i + np.random.rand())


def _flag(flags: Path, *indices: int) -> None:
    flags.mkdir(exist_ok=True)
    for i in indices:
        (flags / str(i)).touch()


@pytest.fixture(scope="module")
def csv_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("restart") / "rows.csv"
    rows = "\n".join(f"{i},{i * 0.5},{i % 7}" for i in range(N * 4))
    path.write_text("id,x,y\n" + rows + "\n")
    return path


def _loader(kind: str, workers: int, shuffle: bool, csv_path: Path, flags: Path, restarts: int) -> naiad.DataLoader:
    common: dict[str, Any] = {"num_workers": workers, "max_worker_restarts": restarts}
    if kind == "tensors":
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(N * 3, 4, generator=g), torch.arange(N * 3))
        return naiad.DataLoader(ds, batch_size=8, shuffle=shuffle, seed=5, **common)
    if kind == "samples":
        return naiad.DataLoader(SelfKilling(N, flags), batch_size=4, shuffle=shuffle, seed=5, **common)
    source = naiad.read_csv(str(csv_path), block_bytes=256)
    return naiad.DataLoader(source, batch_size=16, shuffle=shuffle, seed=5, shuffle_buffer=64,
                            worker_mode="process", **common)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["tensors", "samples", "csv"]),
    workers=st.integers(1, 3),
    shuffle=st.booleans(),
    gaps=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2)), min_size=1, max_size=3),
    # One index: two in one batch would end that batch's worker twice (tested on its own below).
    self_kill=st.lists(st.integers(0, N - 1), max_size=1),
)
def test_killed_workers_are_replaced_and_the_epoch_is_the_uninterrupted_one(
    kind: str, workers: int, shuffle: bool, gaps: list[tuple[int, int]], self_kill: list[int],
    csv_path: Path, tmp_path: Path,
) -> None:
    # Kills from outside, after batch k of the loop, at least 2 x workers batches apart (a
    # worker holds at most 2 tasks), so no task is running at two of them: that is the case
    # of a task that kills its worker every time, tested below. The per-sample dataset kills
    # its own worker instead, at the drawn indices, when there are any.
    kills, k = [], -1
    for gap, worker in gaps:
        k += 2 * workers + gap
        kills.append((k, worker))
    if kind == "samples" and self_kill:
        kills = []
    flags = tmp_path / f"flags-{time.monotonic_ns()}"
    flags.mkdir()
    expected = list(_loader(kind, workers, shuffle, csv_path, flags, 0))  # nothing killed
    before, shm = child_pids(), shm_entries()
    if kind == "samples":
        _flag(flags, *self_kill)  # and the dataset kills its own worker at these indices
    loader = _loader(kind, workers, shuffle, csv_path, flags, restarts=8)
    it = iter(loader)
    got, at = [], dict(kills)  # batch number in the loop -> which worker to kill after it
    for k, batch in enumerate(it):
        got.append(batch)
        if k in at:
            pids = it._pool.worker_pids  # type: ignore[attr-defined]
            try:
                os.kill(pids[at[k] % len(pids)], signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass  # it had ended already: a pass that is over
    assert_same_batches(expected, got)  # same values, same order, each batch once
    info = loader.stats().workers
    assert info["restarts"] == len(info["restart_log"]) <= len(at) + len(self_kill)
    assert all(e["exitcode"] == -signal.SIGKILL for e in info["restart_log"])
    del it, loader
    settle_workers(before, shm)


@pytest.mark.parametrize(("how", "code"), [("exit", 3), ("segv", -signal.SIGSEGV), ("kill", -signal.SIGKILL)])
@pytest.mark.parametrize("in_order", [True, False])
def test_restarts_are_counted_with_exit_code_and_task(how: str, code: int, in_order: bool, tmp_path: Path) -> None:
    before, shm = child_pids(), shm_entries()
    ds = SelfKilling(N, tmp_path, how=how)
    expected = list(naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=1))
    _flag(tmp_path, 21, 70)
    loader = naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=1, num_workers=2, in_order=in_order,
                              max_worker_restarts=2)
    got = list(loader)
    if in_order:
        assert_same_batches(expected, got)
    else:  # as completed: the same batches, each once
        assert sorted(b["i"].tolist() for b in got) == sorted(b["i"].tolist() for b in expected)
    info = loader.stats().workers
    assert info["restarts"] == 2 and info["max_restarts"] == 2
    log = info["restart_log"]
    assert [e["exitcode"] for e in log] == [code, code]
    assert sorted(("21" in e["task"], "70" in e["task"]) for e in log) == [(False, True), (True, False)]
    assert all(e["task"].startswith("while loading batch") and e["epoch"] == 0 for e in log)
    assert f"workers restarted: 2 (exit codes {code}, {code})" in str(loader.stats())
    settle_workers(before, shm)


def test_a_task_that_kills_its_worker_every_time_is_named(tmp_path: Path) -> None:
    before, shm = child_pids(), shm_entries()
    _flag(tmp_path, 37)
    loader = naiad.DataLoader(SelfKilling(N, tmp_path, remove=False), batch_size=4, num_workers=2,
                              max_worker_restarts=10)
    with pytest.raises(naiad.WorkerError) as info:
        list(loader)
    err = info.value
    # Index 37 is in batch 9 (indices 36..39): it ran at two deaths and is not sent a third time.
    assert "batch 9" in str(err) and "37" in str(err) and "2 deaths" in str(err)
    assert err.exitcode == -signal.SIGKILL and "batch 9" in err.task
    assert loader.stats().workers["restarts"] == 1
    settle_workers(before, shm)


def test_a_spent_budget_is_a_worker_error(tmp_path: Path) -> None:
    before, shm = child_pids(), shm_entries()
    _flag(tmp_path, 5, 40, 80)
    loader = naiad.DataLoader(SelfKilling(N, tmp_path), batch_size=4, num_workers=2, max_worker_restarts=2)
    with pytest.raises(naiad.WorkerError, match=r"max_worker_restarts=2") as info:
        list(loader)
    assert "batch 20" in str(info.value) and "80" in str(info.value)  # the third death
    assert loader.stats().workers["restarts"] == 2
    settle_workers(before, shm)


def test_without_restarts_a_death_is_a_worker_error_as_before(tmp_path: Path) -> None:
    _flag(tmp_path, 9)
    loader = naiad.DataLoader(SelfKilling(N, tmp_path), batch_size=4, num_workers=2)
    with pytest.raises(naiad.WorkerError, match=r"killed by signal SIGKILL while loading batch 2") as info:
        list(loader)
    assert "max_worker_restarts" not in str(info.value) and loader.stats().workers["restarts"] == 0


def test_iterable_dataset_worker_walks_its_iterator_again(tmp_path: Path) -> None:
    before, shm = child_pids(), shm_entries()
    ds = SelfKillingStream(N, tmp_path)
    expected = list(naiad.DataLoader(ds, batch_size=4, num_workers=3, seed=2))
    _flag(tmp_path, 31, 62, 90)
    loader = naiad.DataLoader(ds, batch_size=4, num_workers=3, seed=2, max_worker_restarts=3)
    assert_same_batches(expected, list(loader))
    assert loader.stats().workers["restarts"] == 3
    settle_workers(before, shm)


def test_persistent_worker_killed_between_epochs_is_replaced(tmp_path: Path) -> None:
    before, shm = child_pids(), shm_entries()
    ds = SelfKilling(N, tmp_path)
    loader = naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2, persistent_workers=True,
                              max_worker_restarts=1)
    reference = naiad.DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=1)
    assert_same_batches(list(reference), list(loader))
    pool = loader._pools.kept
    assert pool is not None
    os.kill(pool.worker_pids[0], signal.SIGKILL)  # idle, between epochs
    assert_same_batches(list(reference), list(loader))
    assert loader.stats().workers["restart_log"][0]["task"] == "while idle"
    loader.close()
    settle_workers(before, shm)


def slow_square(context: WorkerContext) -> Any:
    def handle(x: int) -> tuple[int, int]:
        time.sleep(0.002)
        return x * x, os.getpid()

    return handle


def test_resized_pool_replaces_a_killed_worker_and_keeps_every_result() -> None:
    before, shm = child_pids(), shm_entries()
    budget = RestartBudget(2)
    pool = WorkerPool(slow_square, num_workers=2, restarts=budget)
    got = []
    for k, (value, _) in enumerate(pool.imap(range(200))):
        got.append(value)
        if k == 20:
            pool.resize(3)
        if k in (40, 120):
            os.kill(pool.worker_pids[-1], signal.SIGKILL)
        if k == 80:
            pool.resize(1)
    pool.close()
    assert got == [x * x for x in range(200)]
    assert budget.count == 2 and [e["exitcode"] for e in budget.log] == [-signal.SIGKILL] * 2
    settle_workers(before, shm)  # what was in /dev/shm before is not this test's


def test_batches_in_shared_memory_survive_a_killed_worker() -> None:
    # 4 MiB per batch: the results cross through shared memory (NOTE [ Batch transport ]),
    # which a receiver can only take while its sender lives; what a dead worker held is replayed.
    before, shm = child_pids(), shm_entries()
    rows = 1 << 20
    ds = TensorDataset(torch.arange(12 * rows, dtype=torch.float32).reshape(12, rows))
    loader = naiad.DataLoader(ds, batch_size=1, num_workers=2, max_worker_restarts=4)
    it = iter(loader)
    got = []
    for k, (x,) in enumerate(it):
        got.append(float(x[0, 0]) / rows)
        if k in (1, 5):
            os.kill(it._pool.worker_pids[k % 2], signal.SIGKILL)  # type: ignore[attr-defined]
    assert got == list(range(12))
    assert loader.stats().workers["restarts"] == 2
    del it, loader, x
    settle_workers(before, shm)


def test_max_worker_restarts_must_be_a_count() -> None:
    ds = TensorDataset(torch.arange(4))
    for bad in (-1, 1.5, True):
        with pytest.raises(naiad.ConfigError, match="max_worker_restarts"):
            naiad.DataLoader(ds, max_worker_restarts=bad)  # type: ignore[arg-type]
