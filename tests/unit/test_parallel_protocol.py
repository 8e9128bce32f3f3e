"""The worker protocol (NOTE [ Worker protocol ]): kinds, the wire, and a worker's life in
``serve``, driven in this thread (no processes)."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import pytest

from naiad.errors import WorkerError
from naiad.parallel.context import enter, get_worker_context, leave
from naiad.parallel.protocol import (
    ANSWERS,
    NO_TASK,
    Exhausted,
    Kind,
    RemoteError,
    Reply,
    from_wire,
    task_entropy,
    to_wire,
)
from naiad.parallel.worker_side import WorkerSpec, run_task, serve

# What each kind carries, as a worker or a backend would send it.
EXAMPLES: dict[Kind, Reply] = {
    Kind.OK: (Kind.OK, 7, {"x": [1, 2]}, {"worker": 0.5, "worker_cpu": 0.25}),
    Kind.EXHAUSTED: (Kind.EXHAUSTED, 8, None, {}),
    Kind.ERROR: (Kind.ERROR, 9, RemoteError(ValueError("bad row")), {}),
    Kind.READY: (Kind.READY, NO_TASK, None, {}),
    Kind.START_FAILED: (Kind.START_FAILED, NO_TASK, RemoteError(OSError("no such file")), {}),
    Kind.RETIRED: (Kind.RETIRED, NO_TASK, 0, {}),
    Kind.DIED: (Kind.DIED, NO_TASK, -9, {}),
    Kind.UNREADABLE: (Kind.UNREADABLE, NO_TASK, EOFError("cut short"), {}),
    Kind.SLOT: (Kind.SLOT, NO_TASK, (12345, 0, 1 << 20), {}),  # (token, index, size): a slot's announcement
}


def test_every_kind_has_an_example() -> None:
    assert set(EXAMPLES) == set(Kind)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_every_kind_round_trips_through_pickle_as_itself(kind: Kind) -> None:
    assert pickle.loads(pickle.dumps(kind)) is kind
    wire = pickle.loads(pickle.dumps(to_wire(EXAMPLES[kind])))
    w, got, seq, value, stages = from_wire(3, wire)
    sent = EXAMPLES[kind]
    assert (w, got, seq, stages) == (3, kind, sent[1], sent[3])
    assert type(value) is type(sent[2])


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_a_kind_crosses_a_pipe_as_a_small_int(kind: Kind) -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        writer.send(to_wire((kind, 1, None, {})))
        wire = reader.recv()
    finally:
        reader.close()
        writer.close()
    assert type(wire[0]) is int
    assert from_wire(0, wire)[1] is kind


def test_kinds_have_distinct_numbers_and_hash_by_identity() -> None:
    assert len({kind.value for kind in Kind}) == len(Kind)
    assert {kind: kind.name for kind in Kind}[pickle.loads(pickle.dumps(Kind.DIED))] == "DIED"


def test_only_ok_exhausted_and_error_answer_a_task() -> None:
    assert ANSWERS == {Kind.OK, Kind.EXHAUSTED, Kind.ERROR}


@pytest.mark.parametrize("number", [99, -1, "ok", None, 2.5])
def test_an_unknown_kind_is_an_error_naming_it(number: Any) -> None:
    with pytest.raises(WorkerError, match=f"unknown kind {number!r}") as info:
        from_wire(0, (number, 1, None, {}))
    assert "0 (OK)" in str(info.value) and "7 (UNREADABLE)" in str(info.value)


def test_task_entropy_is_the_task_s_own_seed_keys() -> None:
    assert task_entropy((4, 2)) is None
    assert task_entropy((4, 2, (1, 2, 3))) == (1, 2, 3)


def test_run_task_answers_each_way_a_handler_ends() -> None:
    def handler(x: int) -> int:
        if x == 1:
            raise Exhausted
        if x == 2:
            raise KeyError("missing")
        return x * 10

    kind, seq, value, stages = run_task(handler, 5, 3)
    assert (kind, seq, value) == (Kind.OK, 5, 30) and {"worker", "worker_cpu"} <= set(stages)
    assert run_task(handler, 6, 1) == (Kind.EXHAUSTED, 6, None, {})
    kind, seq, value, stages = run_task(handler, 7, 2)
    assert (kind, seq, stages) == (Kind.ERROR, 7, {})
    assert isinstance(value.rebuild(), KeyError)


def _serve(factory: Any, tasks: list[Any], sent_until: int = 10**9) -> list[Reply]:
    replies: list[Reply] = []

    def send(reply: Reply) -> bool:
        replies.append(reply)
        return len(replies) < sent_until

    spec = WorkerSpec(factory)
    previous = enter(None, None)  # serve makes this thread a worker: undo that after
    try:
        serve(spec, spec.context(0, 1, "thread"), iter(tasks), send, reseed=False)
    finally:
        leave(previous)
    return replies


def _double(context: Any) -> Any:
    return lambda x: 2 * x


def test_a_worker_says_ready_then_answers_each_task_in_the_order_sent() -> None:
    replies = _serve(_double, [(10, 1, (0, 0)), (11, 2, (0, 0)), (12, 3, (0, 0, (5, 6)))])
    assert [(k, s) for k, s, _, _ in replies] == [(Kind.READY, NO_TASK), (Kind.OK, 10), (Kind.OK, 11), (Kind.OK, 12)]
    assert [v for _, _, v, _ in replies[1:]] == [2, 4, 6]
    assert get_worker_context() is None


def test_a_worker_that_cannot_build_its_handler_says_so_and_returns() -> None:
    def broken(context: Any) -> Any:
        raise OSError("no such file")

    replies = _serve(broken, [(10, 1, (0, 0))])
    assert [(k, s) for k, s, _, _ in replies] == [(Kind.START_FAILED, NO_TASK)]
    assert isinstance(replies[0][2].rebuild(), OSError)


def test_a_worker_returns_when_its_replies_have_nobody_to_read_them() -> None:
    replies = _serve(_double, [(10, 1, (0, 0)), (11, 2, (0, 0)), (12, 3, (0, 0))], sent_until=2)
    assert [s for _, s, _, _ in replies] == [NO_TASK, 10]

