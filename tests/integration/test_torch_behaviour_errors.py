"""torch's DataLoader behaviour where a drop-in must match (issue 12, part 2), differentially:
what a user sees when something fails. After a batch raises (in the dataset or in collate_fn,
map-style or iterable, 0 or more workers, processes or threads, in order or not) the iterator
carries on with the next batch, and a resume continues after it; a dead worker and a
KeyboardInterrupt end the pass; a timeout raises torch's error and message; every naiad error
pickles and crosses a process boundary.

Each test runs the same dataset with the same arguments through ``torch.utils.data.DataLoader``
and ``naiad.DataLoader`` and compares what a user sees: the batches, the exceptions and what
comes after them, and error messages. The rest (workers, seeds, warnings, DataPipes) is in
tests/integration/test_torch_behaviour.py; the sections are numbered as one list across both.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset

import naiad
from naiad.errors import ConfigError, NaiadError, SourceError, StateError, WorkerError
from naiad.parallel import WorkerContext, WorkerPool
from tests.helpers import FailsAt, child_pids, settle_workers, shm_entries


def _outcomes(it: Iterator[Any], catch: type[BaseException] = ValueError) -> list[Any]:
    """Every batch as a list, and "ERR: <message>" for each batch that raised, to the end.

    The message is the first line of the dataset's own: torch puts the worker's traceback into
    the message after it ("Caught ValueError in DataLoader worker process 1. Original
    Traceback ... ValueError: bad row 3"), naiad into a note (a deliberate difference).
    """
    out: list[Any] = []
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return out
        except catch as exc:
            text = str(exc)
            if text.startswith("Caught "):  # torch's worker exception: the original is the last line
                text = text.rstrip().splitlines()[-1].split(": ", 1)[1]
            out.append(f"ERR: {text}")
            continue
        out.append(batch.tolist() if isinstance(batch, torch.Tensor) else batch)


# --------------------------------------------------------------------------------------------
# 1. After a batch raises, the iterator carries on with the next batch.


class IterFailsAt(IterableDataset):
    """Yields 0..n-1, split across workers by get_worker_info(); raises at ``bad``."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if i == self.bad:
                raise ValueError(f"bad row {i}")
            yield i


class IterFailsEvery(IterableDataset):
    """An iterator *object* (not a generator) that raises at multiples of 5 and goes on."""

    def __iter__(self) -> Iterator[int]:
        return _Flaky()


class _Flaky:
    def __init__(self) -> None:
        self.i = -1

    def __iter__(self) -> _Flaky:
        return self

    def __next__(self) -> int:
        self.i += 1
        if self.i >= 12:
            raise StopIteration
        if self.i % 5 == 4:
            raise ValueError(f"flaky {self.i}")
        return self.i


def failing_collate(samples: list[int]) -> torch.Tensor:
    if 6 in samples:
        raise ValueError("cannot collate 6")
    return torch.tensor(samples)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["dataset", "collate"])
def test_a_failed_batch_is_skipped_and_the_epoch_goes_on_as_in_torch(workers: int, kind: str) -> None:
    before, shm = child_pids(), shm_entries()
    ds = FailsAt(20, bad=(3, 13)) if kind == "dataset" else FailsAt(20, bad=())
    collate = failing_collate if kind == "collate" else None
    expected = _outcomes(iter(TorchDataLoader(ds, batch_size=2, num_workers=workers, collate_fn=collate)))
    assert any(str(o).startswith("ERR") for o in expected) and expected[-1] == [18, 19]
    for mode in ("process", "thread") if workers else ("process",):
        loader = naiad.DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=collate, worker_mode=mode)
        assert _outcomes(iter(loader)) == expected, mode
    settle_workers(before, shm)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_failed_batch_out_of_order_is_skipped_and_every_other_batch_arrives(mode: str) -> None:
    ds = FailsAt(40, bad=(9,))
    expected = _outcomes(iter(TorchDataLoader(ds, batch_size=4, num_workers=2, in_order=False)))
    got = _outcomes(iter(naiad.DataLoader(ds, batch_size=4, num_workers=2, worker_mode=mode, in_order=False)))
    assert sorted(map(str, got)) == sorted(map(str, expected))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset", ["generator", "iterator"])
def test_an_iterable_dataset_goes_on_after_an_error_as_torch_does(workers: int, dataset: str) -> None:
    # A generator that raised is finished (that worker's share ends); an iterator object goes on.
    ds: IterableDataset = IterFailsAt(20, bad=6) if dataset == "generator" else IterFailsEvery()
    for batch_size in (None, 2):
        expected = _outcomes(iter(TorchDataLoader(ds, batch_size=batch_size, num_workers=workers)))
        got = _outcomes(iter(naiad.DataLoader(ds, batch_size=batch_size, num_workers=workers)))
        assert got == expected, batch_size


def test_a_failed_batch_is_not_delivered_and_a_resume_continues_after_it() -> None:
    ds = FailsAt(20, bad=(6,))
    loader = naiad.DataLoader(ds, batch_size=2, shuffle=True, seed=4)
    it = iter(loader)
    uninterrupted = _outcomes(iter(naiad.DataLoader(ds, batch_size=2, shuffle=True, seed=4)))
    seen: list[Any] = []
    while len(seen) < 6:  # up to and past the failed batch, whichever it is
        try:
            seen.append(next(it).tolist())
        except ValueError as exc:
            seen.append(f"ERR: {exc}")
    assert seen == uninterrupted[:6] and "ERR: bad row 6" in uninterrupted
    state = loader.state_dict()
    assert state["batches_yielded"] == 6  # the failed batch's place is passed
    resumed = naiad.DataLoader(ds, batch_size=2, shuffle=True, seed=4)
    resumed.load_state_dict(state)
    assert _outcomes(iter(resumed)) == uninterrupted[6:]


@pytest.mark.timeout(120)
def test_a_dead_worker_ends_the_pass() -> None:
    class Exits(Dataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int) -> int:
            if i == 5:
                os._exit(3)
            return i

    before, shm = child_pids(), shm_entries()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        list(TorchDataLoader(Exits(), batch_size=2, num_workers=2))
    it = iter(naiad.DataLoader(Exits(), batch_size=2, num_workers=2))
    # torch's words first, then naiad's: which worker, how it ended, what it was loading.
    with pytest.raises(WorkerError, match=r"^DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. "
                       r"naiad worker 0 \(pid \d+\) exited with code 3 while loading batch 2"):
        list(it)
    with pytest.raises(StopIteration):
        next(it)
    del it
    settle_workers(before, shm)


def test_keyboard_interrupt_ends_the_pass() -> None:
    class Interrupts(Dataset):
        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> int:
            if i == 3:
                raise KeyboardInterrupt
            return i

    it = iter(naiad.DataLoader(Interrupts(), batch_size=2))
    assert next(it).tolist() == [0, 1]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


# --------------------------------------------------------------------------------------------
# 5. Timeouts and picklable errors.


class Slow(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        time.sleep(5)
        return i


@pytest.mark.timeout(120)
def test_a_timeout_raises_torchs_runtime_error_and_message() -> None:
    errors = []
    for loader_class, mode in ((TorchDataLoader, None), (naiad.DataLoader, "process"), (naiad.DataLoader, "thread")):
        kwargs = {} if mode is None else {"worker_mode": mode}
        with pytest.raises(RuntimeError) as info:
            list(loader_class(Slow(), batch_size=2, num_workers=1, timeout=0.5, **kwargs))
        errors.append(info.value)
    expected = str(errors[0])
    assert expected == "DataLoader timed out after 0.5 seconds"
    for err in errors[1:]:
        assert isinstance(err, WorkerError) and str(err).startswith(expected)
        assert "worker 0" in str(err) and "batch 0" in str(err)
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is WorkerError and str(again) == str(err) and again.task == err.task


@pytest.mark.parametrize(
    "error",
    [
        NaiadError("something went wrong"),
        ConfigError("`shuffle_buffer` must be >= 1, got 0."),
        SourceError("expected 3 columns, found 2", path="/data/a.csv", line=17, column="x"),
        WorkerError("naiad worker 1 (pid 9) killed by signal SIGKILL", worker_id=1, exitcode=-9, task="batch 4"),
        StateError("loader state 'seed': stored 1, current 2"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_naiad_error_survives_pickling(error: NaiadError) -> None:
    error.add_note("naiad: a note")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)  # attributes and notes
    # torch's ExceptionWrapper (and code like it) rebuilds an exception from its type and message.
    assert str(type(error)(str(error))) == str(error)


def raises_worker_error(context: WorkerContext) -> Callable[[int], int]:
    def handle(x: int) -> int:
        raise WorkerError(f"inner loader's worker died at {x}", worker_id=3, exitcode=-9, task=f"task {x}")

    return handle


@pytest.mark.timeout(60)
def test_a_worker_error_crosses_a_process_boundary() -> None:
    with WorkerPool(raises_worker_error, num_workers=1) as pool, pytest.raises(WorkerError) as info:
        list(pool.imap([7]))
    err = info.value
    assert str(err) == "inner loader's worker died at 7"
    assert (err.worker_id, err.exitcode, err.task) == (3, -9, "task 7")
