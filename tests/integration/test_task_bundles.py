"""Task bundles (NOTE [ Task bundles ]): small tasks go to a process worker several to a message,
and each is still answered alone: in order, exactly once, its own exception, its own pickling
failure, replayed alone after its worker dies.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.parallel import WorkerContext, WorkerPool, passes
from naiad.parallel.backend import ProcessBackend
from naiad.parallel.passes import MAX_BUNDLE
from naiad.parallel.restart import RestartBudget

pytestmark = pytest.mark.timeout(90)


def batch(k: int) -> dict[str, Any]:
    return {"k": k, "x": np.full(64, k, np.int64), "t": torch.full((8,), float(k))}


def _batches(context: WorkerContext) -> Any:
    return batch


def _failing(context: WorkerContext) -> Any:
    def handle(k: int) -> Any:
        if k % 10 == 3:
            raise ValueError(f"task {k} fails")
        out = batch(k)
        if k % 10 == 5:
            out["bad"] = lambda: None  # does not pickle: only this task may fail for it
        return out

    return handle


def _killing(flags: str) -> Any:
    def factory(context: WorkerContext) -> Any:
        def handle(k: int) -> Any:
            flag = os.path.join(flags, str(k))
            if os.path.exists(flag):
                os.unlink(flag)
                os.kill(os.getpid(), signal.SIGKILL)  # in the middle of a bundle
            return batch(k)

        return handle

    return factory


@pytest.fixture
def bundles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each bundle the training process sends. A bundle's size follows the task time
    its worker measures (tested alone in test_pool_inline.py), and on a loaded machine these tasks
    of microseconds can take more than ``BUNDLE_S / MAX_BUNDLE``: a budget no task here reaches
    makes every bundle after the first, timed task a full one."""
    monkeypatch.setattr(passes, "BUNDLE_S", 1.0)
    sizes: list[int] = []
    submit = ProcessBackend.submit_bundle

    def counted(self: ProcessBackend, worker_id: int, tasks: list[Any]) -> None:
        sizes.append(len(tasks))
        submit(self, worker_id, tasks)

    monkeypatch.setattr(ProcessBackend, "submit_bundle", counted)
    return sizes


def assert_batch(got: Any, k: int) -> None:
    assert got["k"] == k
    np.testing.assert_array_equal(got["x"], np.full(64, k, np.int64))
    assert torch.equal(got["t"], torch.full((8,), float(k)))


def test_small_tasks_travel_in_bundles_each_answered_once(bundles: list[int]) -> None:
    with WorkerPool(_batches, num_workers=2) as pool:
        got = list(pool.imap(range(600), bundle=True))
    for k, one in enumerate(got):
        assert_batch(one, k)
    assert bundles and max(bundles) == MAX_BUNDLE
    assert sum(bundles) > 600 // 2


def _seed(worker_id: int) -> None:
    np.random.seed(worker_id)


def test_no_bundles_where_the_worker_matters_or_for_threads(bundles: list[int]) -> None:
    def run(pool: WorkerPool, **kwargs: Any) -> None:
        got = [b["k"] for b in pool.imap(range(300), **kwargs)]
        assert sorted(got) == list(range(300))
        if kwargs.get("in_order", True):
            assert got == list(range(300))

    with WorkerPool(_batches, num_workers=2) as pool:
        run(pool)  # the pass did not allow them
        run(pool, bundle=True, in_order=False)  # a slow task must hold back no other
    with WorkerPool(_batches, num_workers=2, mode="thread") as pool:
        run(pool, bundle=True)
    with WorkerPool(_batches, num_workers=2, worker_init_fn=_seed) as pool:
        # The user's seeds own the generators: per-task draws would follow the worker.
        run(pool, bundle=True, task_seed=lambda k: (k,))
        assert bundles == []
        run(pool, bundle=True)  # no draws at all (no task seed): bundles again
    assert max(bundles) > 1


def test_a_task_fails_alone_inside_a_bundle(bundles: list[int]) -> None:
    delivered, failed = [], []
    with WorkerPool(_failing, num_workers=2) as pool:
        results = pool.imap(range(400), bundle=True)
        for k in range(400):
            try:
                got = next(results)
            except ValueError as exc:
                assert str(exc) == f"task {k} fails" and k % 10 == 3
                assert any("raised in worker" in note for note in exc.__notes__)
                failed.append(k)
            except Exception as exc:  # noqa: BLE001 - the result that did not pickle
                assert k % 10 == 5 and "pickle" in str(exc).lower(), exc
                failed.append(k)
            else:
                assert_batch(got, k)
                delivered.append(k)
        with pytest.raises(StopIteration):
            next(results)
    assert failed == [k for k in range(400) if k % 10 in (3, 5)]
    assert delivered == [k for k in range(400) if k % 10 not in (3, 5)]
    assert max(bundles) > 1


def test_a_worker_killed_in_a_bundle_is_replaced_and_each_task_answered_once(
    tmp_path: Path, bundles: list[int]
) -> None:
    for k in (150, 377):
        (tmp_path / str(k)).touch()
    with WorkerPool(_killing(str(tmp_path)), num_workers=2, restarts=RestartBudget(2)) as pool:
        got = [b["k"] for b in pool.imap(range(500), bundle=True)]
        assert pool.restarts.count == 2
    assert got == list(range(500))
    assert max(bundles) > 1


def test_a_loader_resumes_exactly_with_bundled_batches(bundles: list[int]) -> None:
    data = naiad.ArrayDataset({"x": np.arange(20_000 * 4, dtype=np.int32).reshape(20_000, 4),
                               "y": np.arange(20_000) % 7})

    def loader() -> naiad.DataLoader:
        return naiad.DataLoader(data, batch_size=16, shuffle=True, seed=3, num_workers=2)

    whole = [b["x"].clone() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it)["x"].clone() for _ in range(413)]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    rest = [b["x"].clone() for b in again]
    assert len(head) + len(rest) == len(whole)
    for a, b in zip(head + rest, whole, strict=True):
        assert torch.equal(a, b)
    assert max(bundles) > 1


def test_a_death_inside_a_bundle_names_the_task_it_died_on(tmp_path: Path, bundles: list[int]) -> None:
    (tmp_path / "205").touch()  # well after the first bundles went out
    with WorkerPool(_killing(str(tmp_path)), num_workers=2, describe=lambda k: f"task {k}") as pool:
        with pytest.raises(naiad.WorkerError, match="killed by signal") as info:
            list(pool.imap(range(400), bundle=True))
    assert "while loading task 205" in str(info.value), str(info.value)
    assert max(bundles) > 1


def test_bundles_with_spawned_workers(bundles: list[int]) -> None:
    with WorkerPool(_batches, num_workers=2, multiprocessing_context="spawn") as pool:
        for k, got in enumerate(pool.imap(range(300), bundle=True)):
            assert_batch(got, k)
    assert max(bundles) > 1
