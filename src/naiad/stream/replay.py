"""Where a shuffled stream stands at any position, found from positions alone: the rows its
buffer held and owed, by walking the buffer's draws backwards (NOTE [ Shuffle buffer ] in
shuffle.py; NOTE [ Mid-epoch resume ] in stream.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from naiad.errors import ConfigError
from naiad.stream.plan import RankPlan, Task
from naiad.stream.shuffle import (
    PERMUTATION_MIN_SLOTS,
    ShuffleBuffer,
    draw_key,
    draw_order,
    draw_slots,
    permutation_of,
)

__all__ = ["BufferReplay"]


class BufferReplay:
    """Where a resumed stream stands (NOTE [ Mid-epoch resume ] in stream.py), found by replaying
    the plan over row positions: the rows the buffer held (``held``, slot by slot), those still
    owed to batches by the exchange in progress (``owed``, in their order), and where the plan
    goes on (``restore.window`` names the reads that yield any of those rows again).
    """

    def __init__(self, next_task: int, held: np.ndarray | None = None, owed: np.ndarray | None = None) -> None:
        self.next_task = next_task
        self.held = held if held is not None else np.zeros(0, np.int64)
        self.owed = owed if owed is not None else np.zeros(0, np.int64)
        self.consumed = 0  # stream positions taken in by the buffer (shuffled)
        self.remainder: Task | None = None  # the rest of a chunk cut inside, read next
        self.tasks: Sequence[Task] = ()  # the plan's tasks, and where each one's rows start
        self.offsets = np.zeros(1, np.int64)

    @classmethod
    def nothing(cls) -> BufferReplay:
        """A fresh start: nothing to restore."""
        return cls(0)

    @classmethod
    def replay(cls, plan: RankPlan, buffer: ShuffleBuffer | None, start: int) -> BufferReplay:
        """Where the stream stands after ``start`` rows have left in batches.

        With a buffer, only the draws that decide what it holds are made again: from the task
        in progress backwards until every slot is accounted for (NOTE [ Mid-epoch resume ]
        in stream.py), so the cost does not grow with ``start``. Without one, the stream goes
        on with the rest of the task in progress (``remainder``).
        """
        tasks = plan.tasks
        offsets = np.concatenate(([0], np.cumsum([t.rows for t in tasks]))).astype(np.int64)
        if start >= offsets[-1] and buffer is None:
            return cls(len(tasks))
        if buffer is None:  # no shuffle: rows leave in stream order; continue at row `start`
            k = int(np.searchsorted(offsets, start, side="right")) - 1
            replay = cls(k + 1)
            if start > offsets[k]:
                replay.remainder = tasks[k].without_first(start - int(offsets[k]))
            else:
                replay.next_task = k
            return replay
        if buffer.keys is None:
            raise ConfigError("a shuffle buffer is replayed only with seed keys, not a shared generator.")
        held, owed, consumed, draws = _replay_draws(buffer.capacity_rows, buffer.keys, offsets, start)
        buffer.draws = draws  # the restored buffer goes on with the next exchange's draw
        next_task = int(np.searchsorted(offsets, consumed, side="right")) - 1
        remainder = None
        if next_task < len(tasks) and consumed > offsets[next_task]:  # inside a chunk: the rest of it
            remainder = tasks[next_task].without_first(consumed - int(offsets[next_task]))
            next_task += 1
        replay = cls(min(next_task, len(tasks)), held, owed)
        replay.consumed, replay.remainder = consumed, remainder
        replay.tasks, replay.offsets = tasks, offsets
        return replay

    def install(self, buffer: ShuffleBuffer | None, rows: dict[str, np.ndarray], slots: np.ndarray | None = None) -> None:
        """Put the rows of ``held`` (read again) back in the buffer: ``rows`` in the order of
        ``held``, or, with ``slots``, each row into slot ``slots[i]`` (the order they were read)."""
        if buffer is not None and len(self.held):
            buffer.refill(rows, slots)


def _exchanges(capacity: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The buffer's exchanges over chunks laid end to end at ``offsets``: for each, its task,
    its first incoming position and its size (what ``ShuffleBuffer.push`` does, without data)."""
    task, first, size = [], [], []
    filled = 0
    for k in range(len(offsets) - 1):
        a, n = int(offsets[k]), int(offsets[k + 1] - offsets[k])
        p = min(capacity - filled, n)
        filled += p
        while p < n:
            m = min(capacity, n - p)
            task.append(k)
            first.append(a + p)
            size.append(m)
            p += m
    return np.array(task, np.int64), np.array(first, np.int64), np.array(size, np.int64)


def _replay_draws(capacity: int, keys: tuple[int, ...], offsets: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The rows (stream positions) a keyed buffer holds, and those it owes, once the exchange
    that emits row ``start`` is made; the positions taken in by then; and the draws made.

    Walks the draws backwards from that exchange until every slot's last writer is found (slots
    never written since the buffer filled hold position = slot), then makes that exchange, so
    the work is about ``capacity * ln(capacity)`` rows of draws, never the epoch's. (A chunk
    holding several exchanges, a big row group, is cut there: the rest of it goes through the
    buffer as usual.)
    """
    total = int(offsets[-1])
    # A buffer at least as large as the stream never fills, so no exchange draws from its
    # slots: replaying it with `total` slots is the same and allocates no more than the rows
    # (a state's buffer_rows is data from a file, and 10**18 must not be an allocation).
    capacity = min(capacity, max(total, 1))
    task, first, size = _exchanges(capacity, offsets)
    emitted = np.cumsum(size)
    i = int(np.searchsorted(emitted, start, side="left"))  # the exchange that emits row `start`
    if i < len(size):
        k, i0, i1 = int(task[i]), i, i + 1
    else:  # row `start` leaves in the final flush
        k, i0 = len(offsets) - 1, len(size)
        i1 = i0
    filled = min(capacity, int(offsets[k + 1]) if k + 1 < len(offsets) else total)
    content = np.empty(capacity, np.int64)
    known = np.zeros(capacity, bool)  # slots whose last writer is found
    left, unknown = capacity, None  # how many are not; which (once asked one by one)
    for j in range(i0 - 1, -1, -1):
        if left == 0:
            break
        m, key = int(size[j]), draw_key(keys, j)
        if capacity >= PERMUTATION_MIN_SLOTS and left < m:
            # Fewer slots to place than the exchange drew: ask the permutation where each of
            # them stands in the draw (NOTE [ Keyed permutation ]).
            if unknown is None:
                unknown = np.flatnonzero(~known)
            at = permutation_of(capacity, key).inverse(unknown)
            hit = at < m
            found = unknown[hit]
            content[found] = first[j] + at[hit]
            known[found] = True
            unknown = unknown[~hit]
            left = len(unknown)
        else:
            idx = draw_slots(capacity, m, key)
            new = np.flatnonzero(~known[idx])
            found = idx[new]
            content[found] = first[j] + new
            known[found] = True
            left -= len(new)
            unknown = None
    never = np.flatnonzero(~known)
    content[never] = never  # filled in order, never exchanged since
    content = content[:filled] if i0 == 0 else content
    out: list[np.ndarray] = []
    for j in range(i0, i1):
        idx = draw_slots(capacity, int(size[j]), draw_key(keys, j))
        out.append(content[idx])
        content[idx] = first[j] + np.arange(size[j])
    before = int(emitted[i0 - 1]) if i0 else 0
    if i >= len(size):  # the flush: every row held leaves in one permutation
        out.append(content[draw_order(len(content), draw_key(keys, i1))])
        content = np.zeros(0, np.int64)
        return content, np.concatenate(out)[start - before :], total, i1 + 1
    owed = np.concatenate(out)[start - before :] if out else np.zeros(0, np.int64)
    return content, owed, int(first[i] + size[i]), i1
