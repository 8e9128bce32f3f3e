"""OrderedStage (NOTE [ Ordered stage ]): a function over an iterator's items on threads, a few
items ahead, results in the items' order; errors at their turn; nothing left running at close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from naiad.parallel.ahead import OrderedStage


def slow_square(x: int) -> int:
    time.sleep(0.02 if x % 2 == 0 else 0.0)  # later items finish first
    return x * x


def test_results_leave_in_the_items_order_whatever_finishes_first() -> None:
    assert list(OrderedStage(iter(range(12)), slow_square, threads=3, depth=4)) == [x * x for x in range(12)]


def test_the_function_runs_on_the_stage_threads_and_keeps_depth_items_in_flight() -> None:
    taken: list[int] = []
    names: set[str] = set()

    def items() -> Iterator[int]:
        for i in range(10):
            taken.append(i)
            yield i

    def fn(x: int) -> int:
        names.add(threading.current_thread().name)
        return x

    stage = OrderedStage(items(), fn, threads=2, depth=3, name="test-stage")
    assert next(stage) == 0
    assert len(taken) == 1  # the first result waits for its own item only
    assert next(stage) == 1
    assert len(taken) == 5  # the head handed over, three more in flight
    assert list(stage) == list(range(2, 10))
    assert names and all(n.startswith("test-stage") for n in names)


def test_the_first_result_waits_for_its_own_item_only() -> None:
    # The second item is not there until the first result has been handed over (a stream's
    # second batch waiting on reads): the first result does not wait for it.
    handed = threading.Event()

    def items() -> Iterator[int]:
        yield 0
        assert handed.wait(10), "the stage waited for the second item before its first result"
        yield from range(1, 6)

    stage = OrderedStage(items(), lambda x: x, threads=2, depth=3)
    assert next(stage) == 0
    handed.set()
    assert list(stage) == [1, 2, 3, 4, 5]


def test_an_error_of_the_function_is_raised_at_its_turn_and_ends_the_stage() -> None:
    def fn(x: int) -> int:
        if x == 3:
            raise ValueError("bad item 3")
        return x

    stage = OrderedStage(iter(range(8)), fn, threads=2, depth=4)
    assert [next(stage) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3"):
        next(stage)
    with pytest.raises(StopIteration):
        next(stage)


def test_an_error_of_the_source_comes_after_the_results_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("read failed")

    stage = OrderedStage(items(), lambda x: x, threads=2, depth=4)
    assert [next(stage), next(stage)] == [1, 2]
    with pytest.raises(OSError, match="read failed"):
        next(stage)


def test_close_cancels_what_has_not_started_and_closes_the_source() -> None:
    started: list[int] = []
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.set()

    def fn(x: int) -> int:
        started.append(x)
        time.sleep(0.05)
        return x

    stage = OrderedStage(items(), fn, threads=1, depth=5)
    assert next(stage) == 0
    stage.close()
    assert closed.is_set()
    assert len(started) <= 3  # one thread: the items queued behind it never ran
    with pytest.raises(StopIteration):
        next(stage)
