"""The stages of a stream's pass: where its tasks come from, the reads, the shuffle buffer and the
batcher (the optional decode stage after them is ``decode.DecodeAhead``).

NOTE [ Stream stages ]
A pass of a stream is a chain of small stages, each pulling from the one before it on the
loop's thread, lazily: a read is asked for only when the batcher has no batch ready.

  tasks    where the pass's tasks come from, one of three: the plan (:class:`PlanTasks`, a fresh
           pass or one resumed where no row is owed); early reads while the rows are still
           counted (:class:`EarlyTasks`, NOTE [ Early reads ] in early.py), which hand the plan
           over once the count ends; a resume's restoring reads (:class:`RestoreTasks`, NOTE
           [ Owed rows first ] in restore.py), whose owed rows go straight to the batcher and
           whose held rows go back into the buffer before it takes more.
  reads    :class:`ReadStage`: the tasks through ``imap`` (the pool's read-ahead threads or
           workers, ``reads.make_handler_factory``), results in plan order as NumPy columns, the
           rows skipped by ``on_bad_rows="skip"`` tagged in place (NOTE [ Bad rows keep their
           positions ] in ledger.py).
  shuffle  :class:`ShuffleStage`: the rows through the shuffle buffer (``shuffle.ShuffleBuffer``),
           or on as they are without shuffling; drained at the end.
  batches  :class:`BatchStage`: rows cut into the plan's batch sizes (``batching.Batcher``), the
           tags turned into ledger entries, tensors, the key column and ``__epoch__``, the
           transform.
  decode   optional, in the loop's process: ``decode.DecodeAhead``, a worker-side transform a
           few batches ahead on an ordered stage of threads.

The deadline: every wait of the loop's thread on another thread is under the loader's
``timeout`` (the pool's ``timeout_s``) and raises the same :class:`~naiad.errors.WorkerError`,
"DataLoader timed out after N seconds" first: the reads' through the pool (``WorkerPool``'s
wait for a result), the decode stage's through its ``OrderedStage`` (NOTE [ Stage deadline ] in
parallel/ahead.py), the decode in the reads through the pool. The tasks, shuffle and batch stages
compute on the loop's thread; their only waits are on this process's own finite work (early
reads waiting for the count, a restore's held rows worked out beside it: docs/WORKERS.md).

close(), from the consumer's end back to the source: the decode stage first (what has not
started is cancelled, what has is waited for, bounded by the deadline), then the stream's
chain, :meth:`StreamStages.close`: the batcher's rows dropped, the shuffle buffer's rows dropped,
the reads' results closed (the pool drops those still owed for this pass), and the task origin
(no more tasks handed out). Each close may be called again; a stage closed yields no more. The
end of the epoch, ``break``, an exception and garbage collection all end there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from naiad.stream.batching import Batcher, to_torch
from naiad.stream.early import EarlyReads
from naiad.stream.ledger import BadRowTracker
from naiad.stream.options import Batch, Imap
from naiad.stream.plan import RankPlan
from naiad.stream.restore import Restoring
from naiad.stream.shuffle import ShuffleBuffer, as_array

__all__ = ["BatchStage", "EarlyTasks", "PlanTasks", "ReadStage", "RestoreTasks", "ShuffleStage", "StreamStages",
           "TaskOrigin", "run_stages"]

Columns = dict[str, np.ndarray]


class TaskOrigin(Protocol):
    """Where a pass's tasks come from, and what its results need before the shuffle buffer."""

    def tasks(self) -> Iterator[Any]:
        """Every task of the pass, in order."""

    def results(self, results: Iterator[Any]) -> Iterator[Any]:
        """The reads' results, as the origin hands them on."""

    def restored(self, i: int, arrays: Columns) -> Columns | None:
        """Rows of result ``i`` that go straight to the batcher, or None: it goes to the buffer."""

    def before_buffer(self, buffer: ShuffleBuffer | None) -> None:
        """Called before the buffer takes a result's rows."""

    def finish(self, buffer: ShuffleBuffer | None) -> None:
        """Called after the last result, before the buffer drains."""

    def close(self) -> None:
        """No more tasks."""


class PlanTasks:
    """The plan's tasks from its first: a fresh pass, or a resume where no row is owed."""

    def __init__(self, plan: RankPlan) -> None:
        self.plan = plan
        self._closed = False

    def tasks(self) -> Iterator[Any]:
        for task in self.plan.tasks:
            if self._closed:
                return
            yield task

    def results(self, results: Iterator[Any]) -> Iterator[Any]:
        return results

    def restored(self, i: int, arrays: Columns) -> Columns | None:
        return None

    def before_buffer(self, buffer: ShuffleBuffer | None) -> None:
        pass

    def finish(self, buffer: ShuffleBuffer | None) -> None:
        pass

    def close(self) -> None:
        self._closed = True


class EarlyTasks(PlanTasks):
    """A fresh pass's early reads (NOTE [ Early reads ]): batch sizes unknown until the count ends,
    then the plan's (``on_plan`` is told it, the batcher gets its sizes)."""

    def __init__(self, early: EarlyReads, batcher: Batcher, on_plan: Callable[[RankPlan], None]) -> None:
        self.early = early
        self.batcher = batcher
        self.on_plan = on_plan
        self._closed = False

    def tasks(self) -> Iterator[Any]:
        for task in self.early.tasks():
            if self._closed:
                return
            yield task

    def results(self, results: Iterator[Any]) -> Iterator[Any]:
        return self.early.checked(iter(results))  # an early read's error named from its planned block

    def before_buffer(self, buffer: ShuffleBuffer | None) -> None:
        if self.early.plan is not None:
            self._adopt()

    def finish(self, buffer: ShuffleBuffer | None) -> None:
        self._adopt()  # waits for the count, if it still runs

    def _adopt(self) -> None:
        if self.batcher.sizes is None:
            plan = self.early.resolve()
            self.on_plan(plan)
            self.batcher.sizes = plan.batch_sizes


class RestoreTasks(PlanTasks):
    """A resume's tasks (NOTE [ Owed rows first ]): the restoring reads, then the plan's."""

    def __init__(self, restoring: Restoring) -> None:
        self.restoring = restoring
        self._closed = False

    def tasks(self) -> Iterator[Any]:
        for task in self.restoring.tasks():
            if self._closed:
                return
            yield task

    def restored(self, i: int, arrays: Columns) -> Columns | None:
        if self.restoring.restores(i):
            return self.restoring.take(arrays)
        return None

    def before_buffer(self, buffer: ShuffleBuffer | None) -> None:
        self.restoring.settle(buffer)  # the held rows, back in the buffer before it takes more

    def finish(self, buffer: ShuffleBuffer | None) -> None:
        if buffer is not None:
            self.restoring.settle(buffer)


class ReadStage:
    """The origin's tasks through ``imap``, results in plan order as NumPy columns, skipped rows
    tagged in place when ``tracker`` is given."""

    def __init__(self, origin: TaskOrigin, imap: Imap, tracker: BadRowTracker | None) -> None:
        self.tracker = tracker
        self._results = imap(origin.tasks())
        self._checked = origin.results(self._results)

    def __iter__(self) -> Iterator[Columns]:
        tracker = self.tracker
        for columns, bad in self._checked:
            arrays = {name: as_array(col) for name, col in columns.items()}
            yield arrays if tracker is None else tracker.tag(arrays, bad)

    def close(self) -> None:
        """The pool drops the results still owed for this pass."""
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


class ShuffleStage:
    """Rows through the shuffle buffer (or on as they are, without one), the origin's restored
    rows past it."""

    def __init__(self, buffer: ShuffleBuffer | None, origin: TaskOrigin) -> None:
        self.buffer = buffer
        self.origin = origin

    def chunks(self, reads: Iterable[Columns]) -> Iterator[Columns]:
        origin, buffer = self.origin, self.buffer
        for i, arrays in enumerate(reads):
            restored = origin.restored(i, arrays)
            if restored is not None:
                yield restored
                continue
            origin.before_buffer(buffer)
            if buffer is None:
                yield arrays
            else:
                yield from buffer.push(arrays)
        origin.finish(buffer)
        if buffer is not None:
            yield from buffer.drain()  # a chunk at a time: the next batch waits for one

    def close(self) -> None:
        self.buffer = None  # its rows go with it


class BatchStage:
    """Rows cut into the plan's batches: untagged, as tensors, with the key column and
    ``__epoch__`` when the pass keys its rows, through ``transform``."""

    def __init__(self, batcher: Batcher, *, tracker: BadRowTracker | None, index_column: str | None, epoch: int,
                 transform: Callable[[Batch], Any] | None) -> None:
        self.batcher = batcher
        self.tracker = tracker
        self.index_column = index_column
        self.epoch = epoch
        self.transform = transform

    def batches(self, chunks: Iterable[Columns]) -> Iterator[Batch]:
        # One generator frame per batch, the batcher's own: this is the hot path.
        batcher, emit = self.batcher, self._emit
        for chunk in chunks:
            batcher.add(chunk)
            for arrays in batcher.ready():
                yield emit(arrays)
            if batcher.done:
                return  # drop_last: the remaining rows are not used this epoch
        for arrays in batcher.ready():
            yield emit(arrays)
        for arrays in batcher.finish():
            yield emit(arrays)

    def _emit(self, arrays: Columns) -> Batch:
        tracker, index = self.tracker, self.index_column
        if tracker is not None:  # the batch just cut is number batcher.next - 1
            arrays = tracker.untag(arrays, self.batcher.next - 1)
        if index is not None and index not in arrays:  # an empty batch (every row skipped)
            arrays = {**arrays, index: np.zeros(0, np.int64)}
        batch = to_torch(arrays)
        if index is not None:
            batch["__epoch__"] = self.epoch
        transform = self.transform
        return transform(batch) if transform is not None else batch

    def close(self) -> None:
        self.batcher.chunks.clear()  # the rows cut into no batch


class StreamStages:
    """One pass's chain (NOTE [ Stream stages ]): ``origin`` → ``reads`` → ``shuffle`` → ``batches``."""

    def __init__(self, origin: TaskOrigin, reads: ReadStage, shuffle: ShuffleStage, batches: BatchStage) -> None:
        self.origin = origin
        self.reads = reads
        self.shuffle = shuffle
        self.batches = batches
        self._closed = False

    def __iter__(self) -> Iterator[Batch]:
        return run_stages(lambda: self)

    def close(self) -> None:
        """Close each stage, from the batches back to the origin of the tasks."""
        if self._closed:
            return
        self._closed = True
        self.batches.close()
        self.shuffle.close()
        self.reads.close()
        self.origin.close()


def run_stages(make: Callable[[], StreamStages | None]) -> Iterator[Batch]:
    """The batches of the chain ``make()`` returns (None: no batch), made at the first ``next()``
    (an error making it ends the pass as a stage's does); the stages closed at the end, at
    ``close()`` or when an error ends the pass."""
    stages = make()
    if stages is None:
        return
    try:
        yield from stages.batches.batches(stages.shuffle.chunks(stages.reads))
    finally:
        stages.close()
