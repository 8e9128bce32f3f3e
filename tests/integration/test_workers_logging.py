"""The ``naiad.workers`` logger over real pools: starts, resizes, retirements and teardown at
INFO/DEBUG, a restart at WARNING, and nothing at the default level in a normal run."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from naiad.errors import WorkerError
from naiad.parallel import RestartBudget, WorkerContext, WorkerPool

pytestmark = pytest.mark.timeout(60)

LOGGER = "naiad.workers"


def slow_square_factory(context: WorkerContext) -> Callable[[Any], Any]:
    def handle(x: int) -> int:
        time.sleep(0.01)
        return x * x

    return handle


def blocking_factory(context: WorkerContext) -> Callable[[Any], Any]:
    def handle(x: int) -> int:
        if x < 0:
            time.sleep(60)  # busy on a task nobody will read: teardown terminates it
        return x

    return handle


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_normal_run_logs_nothing_at_the_default_level(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    with WorkerPool(slow_square_factory, num_workers=2, mode=mode) as pool:  # type: ignore[arg-type]
        assert list(pool.imap(range(10))) == [x * x for x in range(10)]
        pool.resize(1)
        assert list(pool.imap(range(5))) == [x * x for x in range(5)]
    assert [r for r in caplog.records if r.name == LOGGER] == []


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_worker_starts_and_teardown_are_logged(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    pool = WorkerPool(slow_square_factory, num_workers=2, mode=mode)  # type: ignore[arg-type]
    pids = pool.worker_pids
    assert list(pool.imap(range(6))) == [x * x for x in range(6)]
    pool.close()
    started = _messages(caplog, logging.INFO)
    assert started == [f"worker {w}: started, pid {pids[w]}, {mode} mode" for w in (0, 1)]
    how = {w: f"(pid {pids[w]}) returned at teardown, exit code 0" for w in (0, 1)}
    if mode == "thread":
        how = {w: "(a thread) returned at teardown" for w in (0, 1)}
    assert sorted(_messages(caplog, logging.DEBUG)) == [f"naiad-worker-{w} {how[w]}" for w in (0, 1)]


def test_a_restart_is_a_warning_naming_the_worker_its_signal_and_the_budget_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with WorkerPool(slow_square_factory, num_workers=2, restarts=RestartBudget(3)) as pool:
        assert list(pool.imap(range(4))) == [0, 1, 4, 9]  # both ready: a death now is while loading
        it = pool.imap(range(40))
        assert next(it) == 0
        victim = pool.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        assert [0, *it] == [x * x for x in range(40)]
        replacement = pool.worker_pids[1]
    (warning,) = _messages(caplog, logging.WARNING)
    assert warning.startswith(f"worker 1 (pid {victim}) killed by signal SIGKILL while loading task ")
    assert warning.endswith("; started again, 2 of max_worker_restarts=3 left")
    assert f"worker 1: started, pid {replacement}, process mode" in _messages(caplog, logging.INFO)


def test_a_resize_and_a_retired_worker_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with WorkerPool(slow_square_factory, num_workers=2) as pool:
        it = pool.imap(range(30))
        assert next(it) == 0
        pool.resize(1)
        assert [0, *it] == [x * x for x in range(30)]
        info = _messages(caplog, logging.INFO)
        assert "pool resized from 2 to 1 workers (process)" in info
        assert "worker 1: retired, exit code 0" in info


def test_a_worker_terminated_at_teardown_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    pool = WorkerPool(blocking_factory, num_workers=1, timeout_s=0.5)
    pid = pool.worker_pids[0]
    with pytest.raises(WorkerError, match="timed out"):
        next(pool.imap([-1]))  # the worker stays busy on it
    pool.close()
    assert _messages(caplog, logging.INFO)[-1] == (
        f"naiad-worker-0 (pid {pid}) terminated at teardown, exit code {-signal.SIGTERM}"
    )


def test_a_thread_still_running_at_teardown_is_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    release = threading.Event()

    def factory(context: WorkerContext) -> Callable[[Any], Any]:
        return lambda x: release.wait(30)

    pool = WorkerPool(factory, num_workers=1, mode="thread", timeout_s=0.2)
    try:
        with pytest.raises(WorkerError, match="timed out"):
            next(pool.imap([0]))
        pool.close()
        assert _messages(caplog, logging.INFO)[-1].startswith("naiad-worker-0 (a thread) still runs after teardown's")
    finally:
        release.set()
