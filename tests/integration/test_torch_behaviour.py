"""torch's DataLoader behaviour where a drop-in must match (issue 12, part 2), differentially:
the workers and the loader's surface. ``get_worker_info()`` in ``worker_init_fn``, seeds set
there and the draws inside workers, the loader generic like torch's, ``in_order=False`` routing
work around a slow worker, an IterableDataset that yields more than its len(), arguments that do
not pickle and a worker that cannot start, and DataPipes sharded per worker.

Each test runs the same dataset with the same arguments through ``torch.utils.data.DataLoader``
and ``naiad.DataLoader`` and compares what a user sees: the batches, ``get_worker_info()``,
random draws, warnings and error messages. What happens after a batch raises, dead workers,
timeouts and errors that pickle: tests/integration/test_torch_behaviour_errors.py; the sections
are numbered as one list across both.
"""

from __future__ import annotations

import math
import random
import time
import typing
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset

import naiad
from naiad.errors import WorkerError
from naiad.parallel import get_worker_context, worker_rng
from tests.helpers import FailsAt, assert_same_batches, child_pids, settle_workers, shm_entries

LOADERS = [TorchDataLoader, naiad.DataLoader]


# --------------------------------------------------------------------------------------------
# 2. get_worker_info() in worker_init_fn.


class RangeIterable(IterableDataset):
    """torch's IterableDataset documentation example: split in worker_init_fn."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def split_range(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = int(math.ceil((overall_end - overall_start) / float(info.num_workers)))
    dataset.start = overall_start + info.id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", [None, "spawn"])
def test_torch_docs_worker_init_fn_split_works(context: str | None) -> None:
    results = []
    for loader_class in LOADERS:
        loader = loader_class(RangeIterable(3, 17), num_workers=2, worker_init_fn=split_range,
                              multiprocessing_context=context)
        results.append(sorted(int(x) for x in loader))
    assert results[0] == results[1] == list(range(3, 17))


class InfoRecorder(Dataset):
    """Each sample: the index and what get_worker_info() said in worker_init_fn."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, *_SEEN_AT_INIT], dtype=torch.int64)


_SEEN_AT_INIT: list[int] = []


def record_info(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    _SEEN_AT_INIT[:] = [worker_id, info.id, info.num_workers, info.seed, torch.initial_seed()]


@pytest.mark.timeout(120)
def test_worker_info_in_worker_init_fn_equals_torchs() -> None:
    outs = []
    for loader_class in LOADERS:
        torch.manual_seed(11)  # the same base seed drawn by both
        outs.append(list(loader_class(InfoRecorder(), batch_size=2, num_workers=2, worker_init_fn=record_info)))
    assert_same_batches(outs[0], outs[1])


def test_thread_workers_answer_get_worker_context_in_worker_init_fn() -> None:
    # get_worker_info() reads one process-wide variable, so it cannot tell threads apart
    # (docs/WORKERS.md); naiad's own context answers per thread.
    seen = []

    def init(worker_id: int) -> None:
        context = get_worker_context()
        seen.append((worker_id, None if context is None else context.worker_id))
        assert torch.utils.data.get_worker_info() is None

    list(naiad.DataLoader(FailsAt(8, ()), batch_size=2, num_workers=2, worker_mode="thread", worker_init_fn=init))
    assert sorted(seen) == [(0, 0), (1, 1)]


# --------------------------------------------------------------------------------------------
# 3. Seeds set in worker_init_fn stand.


class Draws(Dataset):
    """Each sample: the index and one draw from every generator a user might use."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, random.random(), float(np.random.rand()), float(torch.rand(()))], dtype=torch.float64)


def seed_everything(worker_id: int) -> None:
    random.seed(100 + worker_id)
    np.random.seed(100 + worker_id)
    torch.manual_seed(100 + worker_id)


def note_worker(worker_id: int) -> None:
    pass  # draws nothing, seeds nothing: the generators stay as the worker was seeded


@pytest.mark.timeout(180)
@pytest.mark.parametrize("init", [seed_everything, note_worker])
@pytest.mark.parametrize("persistent", [False, True])
def test_with_a_worker_init_fn_worker_draws_equal_torchs(init: Callable[[int], None], persistent: bool) -> None:
    outs = []
    for loader_class in LOADERS:
        torch.manual_seed(3)
        loader = loader_class(Draws(), batch_size=2, num_workers=2, worker_init_fn=init, persistent_workers=persistent)
        outs.append([torch.cat(list(loader)) for _ in range(2)])  # two epochs
    torch_epochs, naiad_epochs = outs
    for a, b in zip(torch_epochs, naiad_epochs, strict=True):
        assert torch.equal(a, b)
    if init is seed_everything and not persistent:
        assert torch.equal(naiad_epochs[0], naiad_epochs[1])  # the user's seeds, every epoch


class RngDraws(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> float:
        return worker_rng().random()


@pytest.mark.timeout(120)
def test_worker_rng_stays_per_task_with_a_worker_init_fn() -> None:
    runs = [
        torch.cat(list(naiad.DataLoader(RngDraws(), batch_size=2, seed=5, num_workers=w, worker_init_fn=seed_everything)))
        for w in (1, 2)
    ]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.timeout(120)
def test_without_a_worker_init_fn_draws_follow_the_task() -> None:
    # naiad's own rule (docs/WORKERS.md): the same draws for any worker count.
    runs = [torch.cat(list(naiad.DataLoader(Draws(), batch_size=2, seed=5, num_workers=w))) for w in (1, 2)]
    assert torch.equal(runs[0], runs[1])


# --------------------------------------------------------------------------------------------
# 4. Generic like torch's.

T = typing.TypeVar("T")


def test_the_loader_is_generic_like_torchs() -> None:
    assert typing.get_origin(naiad.DataLoader[int]) is naiad.DataLoader
    assert typing.get_args(naiad.DataLoader[torch.Tensor]) == typing.get_args(TorchDataLoader[torch.Tensor])

    def annotated(loader: naiad.DataLoader[torch.Tensor]) -> list[torch.Tensor]:
        return list(loader)

    assert typing.get_type_hints(annotated)["loader"] == naiad.DataLoader[torch.Tensor]

    class Mine(naiad.DataLoader[T]):
        pass

    assert isinstance(Mine[int](torch.arange(4), batch_size=2), TorchDataLoader)


# --------------------------------------------------------------------------------------------
# 6. in_order=False routes work around a slow worker.


class OneSlow(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> int:
        if i == 0:
            time.sleep(1.0)
        return i


def _after_the_slow_one(loader: Any) -> int:
    got = [int(b) for b in loader]
    assert sorted(got) == list(range(20))
    return len(got) - 1 - got.index(0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_out_of_order_work_flows_around_a_slow_batch(mode: str) -> None:
    # torch: only the batch queued behind the slow one on its worker arrives after it (1 of 19).
    # Before naiad dispatched to the least busy worker, half the batches queued behind it. The
    # margin is generous: a loaded machine may delay a batch, never queue 9 behind a sleep.
    expected = _after_the_slow_one(TorchDataLoader(OneSlow(), batch_size=1, num_workers=2, in_order=False))
    got = _after_the_slow_one(naiad.DataLoader(OneSlow(), batch_size=1, num_workers=2, in_order=False, worker_mode=mode))
    assert got <= max(expected, 1) + 3, (got, expected)


# --------------------------------------------------------------------------------------------
# 7. A replicated IterableDataset longer than its len(); a worker that cannot start.


class Replicated(IterableDataset):
    """Not split by worker: every worker yields all 5 rows, but len() says 5."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(5))

    def __len__(self) -> int:
        return 5

    def __repr__(self) -> str:
        return "Replicated()"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_yielding_more_than_the_reported_length_warns_as_torch_does(workers: int) -> None:
    messages = []
    for loader_class in LOADERS:
        loader = loader_class(Replicated(), num_workers=workers)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert len(loader) == 5
            rows = [int(x) for x in loader]
        messages.append([str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)])
        assert len(rows) == 5 * max(1, workers)
        with warnings.catch_warnings(record=True) as caught:  # len() not asked: no warning
            warnings.simplefilter("always")
            list(loader_class(Replicated(), num_workers=workers))
        assert not [w for w in caught if "Length of IterableDataset" in str(w.message)]
    assert messages[0] == messages[1] and len(messages[0]) == (5 if workers else 0)


def test_an_unpicklable_argument_names_itself_and_the_fixes() -> None:
    lam: Callable[[list[Any]], Any] = lambda samples: samples  # noqa: E731
    errors = []
    for loader_class in LOADERS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(Exception) as info:
                list(loader_class(FailsAt(4, ()), num_workers=2, multiprocessing_context="spawn", collate_fn=lam))
        errors.append((info.value, [str(w.message) for w in caught]))
    (torch_err, torch_warnings), (naiad_err, _) = errors
    assert type(naiad_err) is type(torch_err)
    assert any("pickle" in w for w in torch_warnings)
    hint = "\n".join(getattr(naiad_err, "__notes__", []))
    for words in ("`collate_fn`", "pickle", "WorkerLocal", "top level", "worker_mode='thread'"):
        assert words in hint, words


@pytest.mark.timeout(120)
def test_an_unpicklable_worker_init_fn_under_forkserver_warns_as_torch_does() -> None:
    # torch's test_worker_init_fn_forkserver: a local worker_init_fn cannot reach a forkserver
    # worker; torch raises the pickling error and warns first with words its tests look for.
    from multiprocessing import forkserver, resource_tracker

    def local_init_fn(worker_id: int) -> None:  # local: does not pickle
        torch.manual_seed(12345)

    forkserver.ensure_running()  # started once per process: not a worker
    resource_tracker.ensure_running()
    before, shm = child_pids(), shm_entries()
    raised = []
    for loader_class in LOADERS:
        loader = loader_class(
            FailsAt(4, ()), batch_size=2, num_workers=2, worker_init_fn=local_init_fn,
            multiprocessing_context="forkserver",
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(Exception) as info:
                next(iter(loader))
        raised.append(type(info.value))
        opening = "Got pickle error when attempting to start a worker Process"
        messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert any(m.startswith(opening) for m in messages), (loader_class, messages)
        del loader, info
    assert raised[0] is raised[1]
    naiad_warning = next(m for m in messages if m.startswith("Got pickle error"))
    assert "`worker_init_fn`" in naiad_warning and "forkserver" in naiad_warning
    settle_workers(before, shm)


class BreaksWhenUnpickled(Dataset):
    def __init__(self) -> None:
        self.rows = 4

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("cannot be rebuilt here")


@pytest.mark.timeout(60)
def test_a_worker_that_dies_while_starting_says_so() -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # spawn starts it once per process: not a worker
    before, shm = child_pids(), shm_entries()
    with pytest.raises(RuntimeError) as info:  # torch: "DataLoader worker ... exited unexpectedly"
        list(naiad.DataLoader(BreaksWhenUnpickled(), num_workers=1, multiprocessing_context="spawn"))
    assert isinstance(info.value, WorkerError) and "while starting" in str(info.value)
    assert "unpickle" in str(info.value)
    del info
    settle_workers(before, shm)


# --------------------------------------------------------------------------------------------
# 8. DataPipes are sharded per worker.


def _datapipe(shuffle: bool) -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    pipe = IterableWrapper(range(10))
    return (pipe.shuffle() if shuffle else pipe).sharding_filter()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sharded_datapipe_yields_each_sample_once_as_in_torch(workers: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.utils.data.datapipes is deprecated
        outs = [[int(x) for x in loader_class(_datapipe(False), num_workers=workers)] for loader_class in LOADERS]
        assert outs[0] == outs[1] == list(range(10))
        for loader_class in LOADERS:  # shuffled before the sharding: still each sample once
            loader = loader_class(_datapipe(True), batch_size=2, num_workers=workers, persistent_workers=workers > 0)
            epochs = [[int(x) for b in loader for x in b] for _ in range(2)]
            assert all(sorted(e) == list(range(10)) for e in epochs)


@pytest.mark.timeout(120)
def test_a_sharded_datapipe_under_spawn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = naiad.DataLoader(_datapipe(True), num_workers=2, multiprocessing_context="spawn")
        assert sorted(int(x) for x in loader) == list(range(10))

