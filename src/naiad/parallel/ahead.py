"""A small ordered stage of threads: a function applied to an iterator's items a few items ahead
of the consumer, the results handed over in the items' order.

NOTE [ Ordered stage ]
A stream's batches are cut in the loop's process, after the shuffle buffer, so a batch transform
that must not run on the training loop's thread (a decode, NOTE [ Decode in the workers ] in
pipeline.py) runs here instead: :class:`OrderedStage` keeps up to ``depth`` items in flight on
``threads`` threads of its own and yields their results in the order the items came. The items
are taken from the source iterator on the consumer's thread, when it asks for a result (so the
source, a ``BatchStream`` with its shuffle buffer and ledger, is only ever driven by one thread),
and each item's function runs on a stage thread; the consumer waits only for the head's result.
The first result waits only for its own item: the stage fills up at the next call (a stream's
first batch does not wait for the reads of the batches after it).

An exception of the function is raised at its item's turn, and ends the stage (the pass ends, as
a stream's read error does); so does one from the source iterator, after the results before it.
The threads are the stage's own, started at its first item: the work they wait on
(libjpeg-turbo, Pillow, torch's resize) releases the GIL, and spreads over the decode pool's
threads (NOTE [ Decode threads ] in media/rows.py).

NOTE [ Stage deadline ]
The consumer's wait for the head's result is the loader's wait for a batch, so it has the
loader's bound: with ``timeout_s`` (the pool's ``timeout_s``, the loader's ``timeout``) a head
that has no result after that long raises :class:`~naiad.errors.WorkerError` in the pool's form,
torch's ``DataLoader timed out after N seconds`` first, then what it waited for
(``describe(item)``: for a stream's decode, the batch and epoch), and ends the stage. The
items' own waits (the stream's reads) are under the pool's deadline already. ``close()``
cancels what has not started and waits, bounded, for what has, so that no thread goes on
writing into a batch that was given up: up to 30 s (the decode of one batch, with a margin),
or ``timeout_s`` where it is set (a call longer than that is one the timeout calls stuck).
After a timeout it does not wait for the head at all (stuck, by that measure) and waits at most
1 s for the other items, as a thread worker's teardown does. A thread cannot be stopped: one
still busy is left, a daemon that never holds the interpreter's exit (NOTE [ Daemon threads ]
in parallel/threads.py), and the stage's pool is shut down so that it ends once free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as WaitTimeout
from concurrent.futures import wait as wait_futures
from typing import Generic, TypeVar

from naiad.errors import WorkerError
from naiad.parallel.threads import DaemonThreads

__all__ = ["OrderedStage"]

T = TypeVar("T")
R = TypeVar("R")

_CLOSE_WAIT_S = 30.0  # a decode of one batch; past it the threads are left to finish alone
_TIMED_OUT_WAIT_S = 1.0  # after a timeout (NOTE [ Stage deadline ]): as a thread worker's teardown


class OrderedStage(Generic[T, R], Iterator[R]):
    """``fn`` over ``items`` on ``threads`` threads, ``depth`` items ahead, results in order.

    Example:
        >>> stage = OrderedStage(iter(range(5)), lambda x: x * x, threads=2, depth=3)
        >>> list(stage)
        [0, 1, 4, 9, 16]
    """

    def __init__(self, items: Iterator[T], fn: Callable[[T], R], *, threads: int = 2, depth: int = 2,
                 name: str = "naiad-stage", timeout_s: float | None = None,
                 describe: Callable[[T], str] | None = None) -> None:
        """``timeout_s``: the longest wait for one result, None or 0 for no bound; ``describe``
        names an item in the timeout's message (NOTE [ Stage deadline ])."""
        self._items = items
        self._fn = fn
        self._threads = max(1, int(threads))
        self._depth = max(1, int(depth))
        self._name = name
        self._timeout_s = timeout_s or None
        self._describe = describe or (lambda item: f"item {item!r:.200}")
        self._pool: DaemonThreads | None = None
        self._flight: deque[tuple[Future[R], T]] = deque()
        self._source_error: BaseException | None = None
        self._source_done = False
        self._closed = False
        self._timed_out = False
        self._handed = False  # a result has been handed over

    def __iter__(self) -> OrderedStage[T, R]:
        return self

    def _fill(self, depth: int | None = None) -> None:
        while not self._source_done and len(self._flight) < (depth or self._depth):
            try:
                item = next(self._items)
            except StopIteration:
                self._source_done = True
                return
            except BaseException as exc:  # raised after the results before it
                self._source_done, self._source_error = True, exc
                return
            if self._pool is None:
                self._pool = DaemonThreads(self._threads, name=self._name)
            self._flight.append((self._pool.submit(self._fn, item), item))

    def __next__(self) -> R:
        if self._closed:
            raise StopIteration
        try:
            # The first result takes one item and waits for it alone: the next items may wait on
            # more of the source (a stream's reads), and are taken at the next call.
            first = not self._handed
            self._fill(1 if first else None)
            if not self._flight:
                if self._source_error is not None:
                    error, self._source_error = self._source_error, None
                    raise error
                raise StopIteration
            head, item = self._flight.popleft()
            result = self._result(head, item)
            self._handed = True
            if not first:
                self._fill()  # the next item starts before the consumer works on this one
            return result
        except BaseException:
            self.close()
            raise

    def _result(self, head: Future[R], item: T) -> R:
        """The head's result, waited for under the deadline (NOTE [ Stage deadline ])."""
        try:
            return head.result(timeout=self._timeout_s)
        except WaitTimeout:  # the builtin TimeoutError from Python 3.11, not before
            if head.done():  # the function's own TimeoutError, or a result just in time
                return head.result()
        self._timed_out = True
        doing = self._describe(item)
        # torch's words first, as the pool's timeout (WorkerPool._collect) has them.
        raise WorkerError(
            f"DataLoader timed out after {self._timeout_s} seconds: no result from the {self._name} threads "
            f"for {doing}; raise `timeout` or find what blocks it.",
            task=f"waiting for {doing}",
        )

    def close(self) -> None:
        """Stop: what has not started is cancelled, what has is waited for, bounded (NOTE [ Stage
        deadline ]); the threads end once free."""
        if self._closed:
            return
        self._closed = True
        for future, _ in self._flight:
            future.cancel()
        running = [f for f, _ in self._flight if not f.cancelled()]
        self._flight.clear()
        if self._timed_out:
            wait_s = _TIMED_OUT_WAIT_S
        else:
            wait_s = _CLOSE_WAIT_S if self._timeout_s is None else min(_CLOSE_WAIT_S, self._timeout_s)
        if running:
            wait_futures(running, timeout=wait_s)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
