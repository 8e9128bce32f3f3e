"""The iterators a WorkerPool's passes return: a failed task raises and the iteration goes on.

NOTE [ A failed task ]
An exception from the handler fails its task only. torch's DataLoader iterator re-raises a
batch's exception from ``next()`` and the following ``next()`` carries on with the next batch,
so a loop that catches and skips a bad batch sees the rest of the epoch; a pool's iteration
does the same. The generators that drive a pass never raise a task's exception themselves (a
generator that raises is finished): they yield it wrapped in ``Failed``, and
:class:`PoolResults`, the iterator ``imap`` returns, raises it and stays usable. Everything
else ends the iteration (``PoolResults.alive`` turns False): a dead worker, a timeout, a
worker that could not start, a result that could not be received, and ``KeyboardInterrupt``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

__all__ = ["DeferredResults", "Failed", "PoolResults"]


class Failed:
    """A task's exception, carried out of a generator without ending it (NOTE [ A failed task ])."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc: BaseException | None = exc


class PoolResults(Iterator[Any]):
    """The results of one ``imap``: ``next()`` raises a failed task's exception and then goes on.

    Attributes:
        alive: False once the iteration ended (its last task, or an error that ends it: a
            dead worker, a timeout, ``KeyboardInterrupt``); True after a task's own exception,
            which the next ``next()`` carries on from (NOTE [ A failed task ]).
    """

    def __init__(self, results: Iterator[Any]) -> None:
        self._results = results
        self.alive = True

    def __iter__(self) -> PoolResults:
        return self

    def __next__(self) -> Any:
        if not self.alive:
            raise StopIteration
        try:
            item = next(self._results)
        except BaseException:
            self.alive = False  # the generator has finished (its end, or an error it raised)
            raise
        if type(item) is Failed:
            exc, item.exc = item.exc, None  # the marker must not keep the exception alive
            raise cast(BaseException, exc)
        return item

    def close(self) -> None:
        """End the iteration now; results still owed are dropped when they arrive."""
        self.alive = False
        close = getattr(self._results, "close", None)
        if close is not None:
            close()


class DeferredResults(Iterator[Any]):
    """An iterator made by ``make()`` at the first ``next()``; it passes a failed task's exception
    through and goes on after it, as :class:`PoolResults` does (a generator that wraps an
    iterator would end at the first exception instead: NOTE [ A failed task ])."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make: Callable[[], Iterator[Any]] | None = make
        self._it: Iterator[Any] | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        """Whether ``next()`` can still give results (see :class:`PoolResults`)."""
        if self._closed:
            return False
        return self._it is None or bool(getattr(self._it, "alive", False))

    def __iter__(self) -> DeferredResults:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        if self._it is None:
            make, self._make = self._make, None
            try:
                self._it = iter(cast(Callable[[], Iterator[Any]], make)())
            except BaseException:
                self._closed = True  # it could not be made: nothing follows
                raise
        return next(self._it)

    def close(self) -> None:
        """End the iteration; the inner iterator, if made, is closed."""
        self._closed = True
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
