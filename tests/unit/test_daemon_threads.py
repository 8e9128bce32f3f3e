"""The threads that run user code never hold the exit, and the waits on them are bounded: the
daemon-thread executor (NOTE [ Daemon threads ] in naiad/parallel/threads.py), the ordered
stage's deadline (NOTE [ Stage deadline ] in naiad/parallel/ahead.py) and the decode pool's
shutdown (NOTE [ Decode threads ] in naiad/media/rows.py). Every blocked call here waits on an
event the test sets when it ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from naiad.errors import WorkerError
from naiad.media import rows
from naiad.parallel.ahead import OrderedStage
from naiad.parallel.threads import DaemonThreads, thread_cores

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set when the test ends: every call blocked on it returns."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


def test_daemon_threads_run_calls_on_named_daemon_threads_started_as_needed() -> None:
    marked: list[str] = []
    pool = DaemonThreads(3, name="test-daemon", initializer=lambda: marked.append(threading.current_thread().name))
    try:
        first = pool.submit(lambda: threading.current_thread())
        thread = first.result(5)
        assert thread.daemon and thread.name == "test-daemon_0"
        assert marked == ["test-daemon_0"]  # the initializer ran first on it
        assert [pool.submit(pow, 2, k).result(5) for k in range(4)] == [1, 2, 4, 8]
    finally:
        pool.shutdown(wait_s=5)
    assert not thread.is_alive()


def test_daemon_threads_deliver_exceptions_and_run_queued_calls_after_shutdown(release: threading.Event) -> None:
    pool = DaemonThreads(1, name="test-daemon")
    blocked = pool.submit(release.wait, 10)
    queued = [pool.submit(pow, 3, k) for k in range(3)]
    failed = pool.submit(int, "not a number")
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(pow, 2, 2)
    release.set()
    assert blocked.result(5) is True
    assert [f.result(5) for f in queued] == [1, 3, 9]  # queued before the shutdown: they ran
    with pytest.raises(ValueError, match="not a number"):
        failed.result(5)


def test_daemon_threads_shutdown_waits_no_longer_than_asked_for_a_stuck_call(release: threading.Event) -> None:
    pool = DaemonThreads(2, name="test-daemon")
    stuck = pool.submit(release.wait)
    t0 = time.monotonic()
    pool.shutdown(wait_s=0.3)
    assert 0.25 < time.monotonic() - t0 < 3
    assert not stuck.done()


def test_the_stage_raises_the_loaders_timeout_error_when_the_head_takes_too_long(release: threading.Event) -> None:
    def fn(x: int) -> int:
        if x == 2:
            release.wait()
        return x

    stage = OrderedStage(iter(range(6)), fn, threads=2, depth=2, name="test-stage", timeout_s=0.5,
                         describe=lambda x: f"the work of item {x}")
    assert [next(stage), next(stage)] == [0, 1]
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=r"^DataLoader timed out after 0.5 seconds") as info:
        next(stage)
    assert time.monotonic() - t0 < 0.5 + 1.5  # the deadline, and the close after it waits for no stuck head
    assert "the work of item 2" in str(info.value) and "test-stage" in str(info.value)
    assert info.value.task == "waiting for the work of item 2"
    with pytest.raises(StopIteration):
        next(stage)


def test_the_stage_does_not_take_the_functions_own_timeout_error_for_its_deadline() -> None:
    def fn(x: int) -> int:
        raise TimeoutError(f"the function's own, item {x}")

    stage = OrderedStage(iter(range(3)), fn, timeout_s=5)
    with pytest.raises(TimeoutError, match="the function's own, item 0") as info:
        next(stage)
    assert not isinstance(info.value, WorkerError)


def test_the_stage_waits_as_long_as_it_takes_without_a_timeout() -> None:
    def fn(x: int) -> int:
        time.sleep(0.3)
        return x

    assert list(OrderedStage(iter(range(3)), fn, timeout_s=None)) == [0, 1, 2]
    assert list(OrderedStage(iter(range(3)), fn, timeout_s=0)) == [0, 1, 2]  # 0: no bound, as the loader's


def test_a_release_of_the_decode_threads_lets_a_running_batch_finish_and_a_new_pool_serve_the_next() -> None:
    started, go = threading.Event(), threading.Event()
    done: list[int] = []
    out: dict[str, object] = {}

    def work(i: int) -> None:
        started.set()
        go.wait(10)
        done.append(i)

    def batch() -> None:
        out["failures"] = rows.run_rows(work, 40, 2)

    caller = threading.Thread(target=batch)
    caller.start()
    try:
        assert started.wait(10)
        rows.release_threads()  # while the batch decodes: its calls were queued first
    finally:
        go.set()
        caller.join(10)
    assert out["failures"] == {} and sorted(done) == list(range(40))
    cores: list[int] = []
    assert rows.run_rows(lambda i: cores.append(thread_cores()), 4, 2) == {}
    assert cores == [1, 1, 1, 1]  # the new pool's threads are marked one core each too
    rows.release_threads()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("naiad-decode_") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name.startswith("naiad-decode_") for t in threading.enumerate())


@pytest.mark.timeout(20)
def test_a_pass_closed_by_the_collector_while_its_thread_queues_a_batch_neither_deadlocks_nor_cuts_it_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cyclic collector runs finalizers in whichever thread allocates: here, one that closes a
    # pass (release_threads) runs while this thread queues a batch's calls under the pool's lock.
    # (A deadlock here ends in pytest-timeout's interrupt, which unwinds the lock's holder.)
    made = rows._executor

    def collected_meanwhile(threads: int) -> DaemonThreads:
        pool = made(threads)
        rows.release_threads()
        return pool

    monkeypatch.setattr(rows, "_executor", collected_meanwhile)
    done: list[int] = []
    assert rows.run_rows(done.append, 50, 2) == {}
    assert sorted(done) == list(range(50))
    assert rows._state.get().pool is None  # released once the batch's calls were queued
    monkeypatch.undo()
    assert rows.run_rows(done.append, 4, 2) == {}  # a new pool serves the next batch
    rows.release_threads()


def test_at_exit_queued_calls_are_dropped_and_a_stuck_thread_is_waited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    import weakref

    from naiad.parallel import threads

    pool = DaemonThreads(1, name="test-daemon")
    stuck = pool.submit(release.wait)
    queued = pool.submit(pow, 2, 3)
    monkeypatch.setattr(threads, "_LIVE", weakref.WeakSet([pool]))  # this pool only
    monkeypatch.setattr(threads, "EXIT_JOIN_S", 0.3)
    t0 = time.monotonic()
    threads._shutdown_at_exit()
    assert 0.25 < time.monotonic() - t0 < 3
    assert queued.cancelled() and not stuck.done() and pool.closed
    release.set()
    assert stuck.result(5) is True
    pool._join(time.monotonic() + 5)
    assert not any(t.is_alive() for t in pool._threads)
