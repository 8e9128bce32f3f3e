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
``close()`` cancels what has not started and waits, bounded, for what has: no thread outlives
the stage writing into a batch that was given up. The threads are the stage's own, started at
its first item: the work they wait on (libjpeg-turbo, Pillow, torch's resize) releases the GIL,
and spreads over the decode pool's threads (NOTE [ Decode threads ] in media/rows.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Generic, TypeVar

__all__ = ["OrderedStage"]

T = TypeVar("T")
R = TypeVar("R")

_CLOSE_WAIT_S = 30.0  # a decode of one batch; past it the threads are left to finish alone


class OrderedStage(Generic[T, R], Iterator[R]):
    """``fn`` over ``items`` on ``threads`` threads, ``depth`` items ahead, results in order.

    Example:
        >>> stage = OrderedStage(iter(range(5)), lambda x: x * x, threads=2, depth=3)
        >>> list(stage)
        [0, 1, 4, 9, 16]
    """

    def __init__(self, items: Iterator[T], fn: Callable[[T], R], *, threads: int = 2, depth: int = 2,
                 name: str = "naiad-stage") -> None:
        self._items = items
        self._fn = fn
        self._threads = max(1, int(threads))
        self._depth = max(1, int(depth))
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._flight: deque[Future[R]] = deque()
        self._source_error: BaseException | None = None
        self._source_done = False
        self._closed = False
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
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            self._flight.append(self._pool.submit(self._fn, item))

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
            head = self._flight.popleft()
            result = head.result()
            self._handed = True
            if not first:
                self._fill()  # the next item starts before the consumer works on this one
            return result
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop: what has not started is cancelled, what has is waited for (bounded)."""
        if self._closed:
            return
        self._closed = True
        for future in self._flight:
            future.cancel()
        running = [f for f in self._flight if not f.cancelled()]
        self._flight.clear()
        if running:
            wait_futures(running, timeout=_CLOSE_WAIT_S)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
