"""What a pass delivered when its batches may leave out of plan order (``in_order=False``).

NOTE [ Out-of-order delivery ]
With ``in_order=False`` the pool hands each task to the least busy worker and delivers results
as they complete, so the ``k`` batches a training loop received are not plan batches
``0..k-1``: a slow batch is overtaken by the ones after it. A count of batches cannot say where
such a pass stands, so a pass whose delivery order can differ from its plan records *which*
tasks it delivered, told by the pool just before each result leaves it (``on_deliver``):

* a map-style pass, the plan batches delivered, as :class:`BatchRuns`: the contiguous prefix
  ``[0, P)`` and the few runs delivered beyond it (a slow batch leaves one hole; the holes are
  tasks in flight, so the runs are at most the tasks in flight plus one). A resume plans the
  batches outside the runs, each once, in plan order.
* an IterableDataset's pass, the batches each worker delivered, as :class:`WorkerCounts`: a
  worker runs its tasks one after another and its results arrive in that order, so what it
  delivered is always a prefix of its own iterator's batches, out of order or not. A resume
  skips each worker's own count of batches, whatever order the workers' results arrive in.

The position must be what the training loop *received*, which lags what the pass delivered
when a device prefetcher reads ahead. :class:`DeliveryLog` keeps the deliveries the loop has not
received yet in order, and folds the rest into the summary (``settle``), so its memory is the
summary plus the prefetcher's depth, and ``at(k)`` gives the summary after the first ``k``.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from naiad.errors import ConfigError

__all__ = ["GIVE_BACK", "BatchRuns", "DeliveryLog", "WorkerCounts"]

GIVE_BACK = 16
"""The most received batches a pass whose order is its delivery's (``in_order=False``, an
IterableDataset's workers) can give back (``state_dict(pending=k)``): the rest are folded."""


_Self = TypeVar("_Self", bound="Summary")


class Summary(Protocol):
    """What a :class:`DeliveryLog` folds its deliveries into."""

    def add(self, tag: Any) -> None:
        """Count one more delivery, named by its tag."""
        ...

    def copy(self: _Self) -> _Self:
        """An independent copy."""
        ...


S = TypeVar("S", bound=Summary)


class BatchRuns:
    """A set of plan batch numbers, held as sorted, disjoint, non-adjacent runs ``[a, b)``.

    Example:
        >>> runs = BatchRuns.of(2, [])
        >>> for n in (4, 5, 2):
        ...     runs.add(n)
        >>> runs.prefix, runs.beyond(), len(runs), list(runs.missing(0, 8))
        (3, [[4, 6]], 5, [3, 6, 7])
    """

    def __init__(self, runs: Sequence[Sequence[int]] = ()) -> None:
        self.runs: list[list[int]] = [[int(a), int(b)] for a, b in runs]

    @classmethod
    def of(cls, prefix: int, beyond: Sequence[Sequence[int]]) -> BatchRuns:
        """Batches ``[0, prefix)`` and the runs ``beyond`` (from a state: checked before)."""
        return cls(([[0, prefix]] if prefix else []) + [list(r) for r in beyond])

    def add(self, n: int) -> None:
        """Add batch ``n`` (not already held)."""
        runs = self.runs
        if runs and runs[-1][1] == n:  # in plan order: the last run grows
            runs[-1][1] += 1
            return
        i = bisect.bisect_right(runs, n, key=lambda r: r[0])  # runs[i-1][0] <= n < runs[i][0]
        if i and runs[i - 1][1] > n:
            raise ValueError(f"batch {n} was delivered twice")
        joins_left = i > 0 and runs[i - 1][1] == n
        joins_right = i < len(runs) and runs[i][0] == n + 1
        if joins_left and joins_right:
            runs[i - 1][1] = runs.pop(i)[1]
        elif joins_left:
            runs[i - 1][1] += 1
        elif joins_right:
            runs[i][0] = n
        else:
            runs.insert(i, [n, n + 1])

    @property
    def prefix(self) -> int:
        """``P``: batches ``[0, P)`` are all held, batch ``P`` is not."""
        return self.runs[0][1] if self.runs and self.runs[0][0] == 0 else 0

    def beyond(self) -> list[list[int]]:
        """The runs after the prefix, as ``[a, b]`` lists (JSON)."""
        return [list(r) for r in self.runs if r[0] > 0]

    def missing(self, start: int, stop: int) -> Iterator[int]:
        """The batch numbers in ``[start, stop)`` not held, ascending."""
        n = start
        for a, b in self.runs:
            if b <= n:
                continue
            if a >= stop:
                break
            yield from range(n, min(a, stop))
            n = max(n, b)
        yield from range(n, stop)

    def __len__(self) -> int:
        return sum(b - a for a, b in self.runs)

    def copy(self) -> BatchRuns:
        return BatchRuns(self.runs)


class WorkerCounts:
    """Batches delivered per worker of an IterableDataset's pass (worker ``w``: the first
    ``counts[w]`` batches of its own iterator)."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = [int(c) for c in counts]

    def add(self, w: int) -> None:
        """Count one more batch of worker ``w``."""
        self.counts[w] += 1

    def copy(self) -> WorkerCounts:
        return WorkerCounts(self.counts)


class DeliveryLog(Generic[S]):
    """A pass's deliveries in the order they left it: the ones the training loop received
    folded into a summary, the rest kept in order (NOTE [ Out-of-order delivery ])."""

    def __init__(self, summary: S) -> None:
        self._summary = summary  # what was delivered before this pass, and what the loop received of it
        self._tail: deque[Any] = deque()  # delivered by this pass, not yet folded, in order
        self._folded = 0  # this pass's deliveries in the summary

    def add(self, tag: Any) -> None:
        """Note a delivery (called by the pool just before the batch leaves it)."""
        self._tail.append(tag)

    @property
    def recorded(self) -> int:
        """This pass's deliveries noted so far."""
        return self._folded + len(self._tail)

    def settle(self, received: int) -> None:
        """The loop has received the first ``received`` deliveries: fold them into the summary,
        all but the last ``GIVE_BACK`` (a loop that fetches ahead may give those back:
        ``state_dict(pending=k)``)."""
        while self._folded < received - GIVE_BACK and self._tail:
            self._summary.add(self._tail.popleft())
            self._folded += 1

    def at(self, delivered: int) -> S:
        """The summary after this pass's first ``delivered`` deliveries (a copy)."""
        if not self._folded <= delivered <= self.recorded:
            raise ConfigError(
                f"the position after {delivered} batch(es) of this pass is not kept: a pass whose "
                f"order is its delivery's keeps the last {GIVE_BACK} received (here {self._folded} "
                f"folded, {self.recorded} delivered); give back at most {GIVE_BACK} (`pending`)."
            )
        summary = self._summary.copy()
        for tag in itertools.islice(self._tail, delivered - self._folded):
            summary.add(tag)
        return summary

    def add_settled(self, tag: Any) -> None:
        """Count a delivery of before this pass (a resume's skipped batch) in the summary."""
        self._summary.add(tag)
