"""The stream pass as a chain of stages (NOTE [ Stream stages ] in naiad/stream/stages.py): each
closes, from the batches back to the tasks, and the pass's reads are closed with it."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.stream.batches import StreamOptions, iter_batches
from naiad.stream.reads import read_task
from naiad.stream.stages import BatchStage, PlanTasks, ShuffleStage, StreamStages


class Results(Iterator[Any]):
    """The reads' results, as a pool's ordered ``imap`` gives them, recording ``close()``."""

    def __init__(self, source: naiad.Source, tasks: Iterable[Any]) -> None:
        self.handle = functools.partial(read_task, source, True)
        self.tasks = iter(tasks)
        self.closed = False
        self.handed = 0

    def __next__(self) -> Any:
        if self.closed:
            raise StopIteration
        self.handed += 1
        return self.handle(next(self.tasks))

    def close(self) -> None:
        self.closed = True


def _source(tmp_path: Path, rows: int = 400) -> naiad.Source:
    path = tmp_path / "rows.csv"
    path.write_text("id\n" + "".join(f"{i}\n" for i in range(rows)))
    return naiad.read_csv(str(path), block_bytes=128)


def _stream(source: naiad.Source, opened: list[Results], state: Any = None) -> Any:
    def imap(tasks: Iterable[Any]) -> Results:
        opened.append(Results(source, tasks))
        return opened[-1]

    opts = StreamOptions(batch_size=10, shuffle=True, seed=1, shuffle_buffer=50, rank=0, world_size=1)
    return iter_batches(source, opts, epoch=0, imap=imap, state=state)


@pytest.mark.parametrize("resumed", [False, True])
def test_closing_a_stream_mid_pass_closes_its_reads(tmp_path: Path, resumed: bool) -> None:
    source = _source(tmp_path)
    opened: list[Results] = []
    stream = _stream(source, opened)
    if resumed:  # the restoring reads' origin
        for _ in range(7):
            next(stream)
        state = stream.get_state()
        stream.close()
        stream = _stream(source, opened, state=state)
    next(stream)
    stream.close()
    assert opened[-1].closed
    with pytest.raises(StopIteration):
        next(stream)


def test_the_end_of_the_epoch_closes_the_reads(tmp_path: Path) -> None:
    source = _source(tmp_path)
    opened: list[Results] = []
    batches = list(_stream(source, opened))
    assert sorted(np.concatenate([b["id"].numpy() for b in batches]).tolist()) == list(range(400))
    assert opened[0].closed


def test_stages_close_from_the_batches_back_to_the_tasks() -> None:
    closed: list[str] = []

    class Stage:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    class Reads(Stage):
        def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
            for i in range(100):
                yield {"a": np.arange(i * 4, i * 4 + 4)}

    origin = PlanTasks.__new__(PlanTasks)
    origin._closed = False
    origin.close = lambda: closed.append("tasks")  # type: ignore[method-assign]
    shuffle = ShuffleStage(None, origin)
    shuffle.close = lambda: closed.append("shuffle")  # type: ignore[method-assign]

    from naiad.stream.batching import Batcher

    batcher = Batcher(np.full(100, 4), 0, {"a": np.zeros(0, np.int64)}, 4)
    batches = BatchStage(batcher, tracker=None, index_column=None, epoch=0, transform=None)
    batches.close = lambda: closed.append("batches")  # type: ignore[method-assign]
    stages = StreamStages(origin, Reads("reads"), shuffle, batches)  # type: ignore[arg-type]
    it = iter(stages)
    assert next(it)["a"].tolist() == [0, 1, 2, 3]
    it.close()  # type: ignore[attr-defined]
    assert closed == ["batches", "shuffle", "reads", "tasks"]
    stages.close()  # again: nothing more
    assert closed == ["batches", "shuffle", "reads", "tasks"]


def test_a_closed_origin_hands_out_no_more_tasks(tmp_path: Path) -> None:
    source = _source(tmp_path)
    opts = StreamOptions(batch_size=10, rank=0, world_size=1)
    from naiad.stream.planning import plan_for

    origin = PlanTasks(plan_for(source, opts, 0))
    tasks = origin.tasks()
    next(tasks)
    origin.close()
    assert list(tasks) == []
