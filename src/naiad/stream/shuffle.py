"""A columnar shuffle buffer: rows in, rows out in random order, memory bounded by its capacity.

NOTE [ Shuffle buffer ]
The buffer is a set of ``capacity_rows`` slots per column (NumPy arrays, preallocated when the
first rows arrive). While it is filling, rows are copied in. Once full, each arriving chunk of
``m`` rows (``m <= capacity``) is exchanged: ``m`` distinct random slots are drawn, their rows
are emitted in the drawn order, and the new rows take their places. This is the classic
streaming shuffle (TensorFlow's ``shuffle(buffer_size)``) done ``m`` rows at a time with one
gather and one scatter per column, never a Python loop per row. At the end of the stream the
remaining rows leave in a random permutation, gathered 64 Ki rows at a time as the batches ask
for them (``drain``).

When a chunk is as large as the buffer (``m == capacity``: big row groups and record batches),
every slot leaves (the exchange then emits the previous chunk's rows in a random order), so the
scatter is skipped: the new rows are copied in arrival order and the buffer remembers, as one
index array ``view``, which physical row each slot now holds (the inverse of the draw). The next exchange gathers through ``view``. Per column that is one random
gather and one sequential copy instead of a random gather and a random scatter, for the same
rows in the same order; the bookkeeping is two index passes per exchange, not per column (a
shuffled epoch from 1 Mi-row Parquet row groups: about 10% less CPU per row).

The columns of a big exchange are split between this thread and a helper (NumPy releases the
GIL while it gathers and scatters). When a chunk holds several exchanges, this thread draws the
next one while the helper exchanges most of the columns: the draws depend on nothing but the
generator and still happen here, one after another, so nothing reorders (1 Mi-row Parquet row
groups: 10-25% more rows/s in three side-by-side runs).

Each column's exchange starts with one sequential pass over its slots (a ``max`` over its
bytes, result unused) when the exchange touches at least an eighth of the slots and the column
fits in half a core's L2 cache or an eighth of the L3 (``warm_max_bytes``): the pass pulls the
column in at full memory bandwidth, so the random gather and scatter that follow hit the cache
instead of waiting on one line at a time (a shuffled epoch of ten float columns: 15-20% more
rows/s and less CPU per row, bench/RESULTS.md). The L3 bound counts because between two
exchanges the reads (a parse, a gather from kept blocks) push the slots out of every cache: with
the default buffer's 1 MiB columns, past half of this machine's 512 KiB L2 but far under an
eighth of its 32 MiB L3, kept epochs of the 150 MB CSV ran 16-23% faster with the pass, JSON
Lines 29%, Arrow 15%, Parquet within noise. It changes no value and no order.

The draws depend only on the chunk sizes and the seed, not on the data: exchange ``j`` empties
the first ``m`` values of a permutation of the slots keyed by ``SeedSequence([seed, epoch, rank,
tag, leg, j])`` (a keyed Feistel network, NOTE [ Keyed permutation ] in permutation.py, for
buffers of 64 Ki slots or more; a table drawn by ``Generator.choice`` for smaller ones). So which
rows the buffer holds at any point follows from positions alone, and can be found *backwards*:
from the exchange in progress, each earlier exchange's draw names the slots it wrote; a slot's
content is its last writer's row, and once every slot is accounted for (about
``capacity * ln(capacity)`` rows back, whatever the position) the walk stops (``naiad.stream.replay``). Once fewer slots
are left than an exchange drew, the permutation is asked, slot by slot, whether and where that
exchange drew each of them, instead of drawing it whole: a 2 Mi-row buffer of 1 Mi-row chunks
walks about 21 exchanges back, and its replay went from 40 M random draws (1.0 s) to about 4 M
permutation steps. That is how a stream resumes mid-epoch (see ``naiad.stream.batches``) without saving
the buffer's contents, in a time that does not grow with the position.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from naiad.errors import ConfigError
from naiad.order.permutation import Permutation
from naiad.parallel.threads import run_beside
from naiad.sources.columns import as_array

__all__ = ["ShuffleBuffer", "as_array", "draw_key", "draw_order", "draw_slots", "order_pieces", "permutation_of", "shuffle_quality"]

ArrayColumns = dict[str, np.ndarray]
Draw = tuple[np.ndarray, np.ndarray]  # an exchange's slots: as drawn, and as physical rows


# Below this many values per exchange the helper thread's hand-off costs more than it saves.
_SPLIT_MIN_VALUES = 1 << 16
# While this thread also draws the next exchange, it takes this share (%) of the columns and the
# helper the rest: a draw costs about as much as exchanging two float columns.
_DRAW_AHEAD_SHARE = 20


def _cache_bytes(level: int, root: str = "/sys/devices/system/cpu/cpu0/cache", default: int = 0) -> int:
    """The size of the cache of ``level`` that core 0 uses (Linux sysfs), or ``default`` where it
    cannot be read."""
    try:
        for entry in sorted(e for e in os.listdir(root) if e.startswith("index")):
            with open(os.path.join(root, entry, "level")) as f:
                if f.read().strip() != str(level):
                    continue
            with open(os.path.join(root, entry, "size")) as f:
                size = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


def _l2_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache", default: int = 1 << 20) -> int:
    """The size of one core's L2 cache (Linux sysfs), or ``default`` where it cannot be read."""
    return _cache_bytes(2, root, default)


def warm_max_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The biggest column an exchange warms first (see NOTE [ Shuffle buffer ]): half the L2
    cache, or an eighth of the L3 where that is more (it is shared with the other cores and
    the parser's threads, and holds the incoming and outgoing rows too)."""
    return max(_l2_cache_bytes(root) // 2, _cache_bytes(3, root) // 8)


# Columns up to this size are warmed before an exchange (see NOTE [ Shuffle buffer ]).
_WARM_MAX_BYTES = warm_max_bytes()


def draw_key(keys: tuple[int, ...], j: int) -> np.random.SeedSequence:
    """The seed of draw ``j`` of a buffer with seed ``keys`` (see :class:`ShuffleBuffer`)."""
    return np.random.SeedSequence([k % 2**64 for k in keys] + [j])


# Buffers of at least this many slots draw from a keyed permutation (NOTE [ Keyed permutation ]),
# which a resume can ask about one slot at a time; smaller ones from a table (Generator.choice),
# as a Feistel network over a few bits is measurably not uniform (and their replay is cheap).
PERMUTATION_MIN_SLOTS = 1 << 16


def permutation_of(capacity: int, seed: np.random.SeedSequence) -> Permutation:
    """The keyed permutation of a big buffer's slots that a draw with ``seed`` takes its first values of."""
    return Permutation(capacity, int(seed.generate_state(1, np.uint64)[0]))


def draw_slots(capacity: int, m: int, seed: np.random.SeedSequence) -> np.ndarray:
    """The ``m`` distinct slots (of ``capacity``) an exchange drawn with ``seed`` empties, in the
    order their rows leave."""
    if capacity >= PERMUTATION_MIN_SLOTS:
        return permutation_of(capacity, seed)(np.arange(m))
    # Floyd's algorithm inside Generator.choice: O(m) for m much smaller than capacity.
    return np.random.default_rng(seed).choice(capacity, m, replace=False)


def order_pieces(n: int, seed: np.random.SeedSequence) -> Callable[[int, int], np.ndarray]:
    """The order in which the final flush of ``n`` held rows leaves (a permutation of
    ``range(n)``), as ``piece(lo, hi)``: its places ``lo:hi``. A big one is the keyed
    permutation, evaluated a piece at a time; a small one is drawn whole, once."""
    if n >= PERMUTATION_MIN_SLOTS:
        permutation = permutation_of(n, seed)
        return lambda lo, hi: permutation(np.arange(lo, hi))
    order = np.random.default_rng(seed).permutation(n)
    return lambda lo, hi: order[lo:hi]


def draw_order(n: int, seed: np.random.SeedSequence) -> np.ndarray:
    """The whole order in which the final flush of ``n`` held rows leaves (:func:`order_pieces`)."""
    return order_pieces(n, seed)(0, n)


DRAIN_ROWS = 1 << 16
"""Rows per chunk of the final flush: the next batch waits for one chunk's gather, not the whole
buffer's (a 2 Mi-row buffer of nine columns: 0.65 s in one piece)."""


def _as_rows(array: np.ndarray) -> np.ndarray:
    """A C-contiguous ``(n, ...)`` array viewed as ``n`` opaque values of one row each (no copy)."""
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    return array.reshape(len(array), -1).view(np.dtype((np.void, row_bytes))).reshape(len(array))


class ShuffleBuffer:
    """A fixed-capacity columnar shuffle buffer (see NOTE [ Shuffle buffer ]).

    Args:
        capacity_rows: the number of rows held; memory is this many rows of every column.
        rng: the seed keys of the draws, ``(seed, epoch, rank, ...)``: exchange ``j`` draws from
            ``SeedSequence([*keys, j])``, so any exchange's draw can be made again without the
            ones before it (what a resume needs); or one generator that every draw advances.

    Example:
        >>> buf = ShuffleBuffer(4, (0, 0))
        >>> out = buf.push({"i": np.arange(10)}) + [buf.flush()]
        >>> sorted(np.concatenate([c["i"] for c in out]).tolist())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    def __init__(self, capacity_rows: int, rng: np.random.Generator | tuple[int, ...]) -> None:
        if capacity_rows < 1:
            raise ConfigError(f"`shuffle_buffer` must be >= 1, got {capacity_rows}.")
        self.capacity_rows = capacity_rows
        self.keys: tuple[int, ...] | None = None if isinstance(rng, np.random.Generator) else tuple(rng)
        self.rng = rng if isinstance(rng, np.random.Generator) else None
        self.draws = 0  # draws made: the next exchange's key
        self.size = 0
        self.slots: ArrayColumns | None = None
        self._rows: ArrayColumns = {}
        # Slot i holds physical row view[i] of `slots` (None: row i); set by whole-buffer exchanges.
        self._view: np.ndarray | None = None
        self._arange: np.ndarray | None = None  # kept: a fresh one per exchange costs page faults

    def _allocate(self, columns: ArrayColumns) -> None:
        self._view = None
        self.slots = {
            name: np.empty((self.capacity_rows, *col.shape[1:]), dtype=col.dtype)
            for name, col in columns.items()
        }
        # Multi-dimensional numeric columns also get a view of each row as one opaque value,
        # for the scatter of the exchange.
        self._rows = {
            name: _as_rows(slot) for name, slot in self.slots.items() if slot.ndim > 1 and slot.dtype.kind in "biufc"
        }

    def push(self, columns: ArrayColumns) -> list[ArrayColumns]:
        """Add rows (all columns the same length); returns the chunks of rows that leave."""
        n = len(next(iter(columns.values()))) if columns else 0
        if n == 0:
            return []
        if self.slots is None:
            self._allocate(columns)
        slots = self.slots
        assert slots is not None  # allocated just above
        pos = 0
        if self.size < self.capacity_rows:
            take = min(self.capacity_rows - self.size, n)
            for name, col in columns.items():
                slots[name][self.size : self.size + take] = col[:take]
            self.size += take
            pos = take
        out: list[ArrayColumns] = []
        names = list(slots)
        sizes = [min(self.capacity_rows, n - p) for p in range(pos, n, self.capacity_rows)]
        draw = self._draw(sizes[0]) if sizes else None
        for i, m in enumerate(sizes):
            assert draw is not None
            idx, sel = draw
            whole = m == self.capacity_rows
            chunk = {name: col[pos : pos + m] for name, col in columns.items()}
            exchange = functools.partial(self._exchange, sel=sel, chunk=chunk, whole=whole)
            following = sizes[i + 1] if i + 1 < len(sizes) else 0
            if m * len(names) < _SPLIT_MIN_VALUES:
                out.append(exchange(names))
                draw = self._advance(idx, whole, following)
            else:
                # Columns are independent: most of them go to a helper thread (NumPy releases the
                # GIL) while this one draws the next exchange, which needs nothing but the
                # generator; half of them when there is nothing to draw. The draws stay here, one
                # after another, so nothing reorders.
                k = len(names) * _DRAW_AHEAD_SHARE // 100 if following else len(names) // 2
                here = functools.partial(self._advance_and_exchange, idx, whole, following, exchange, names[:k])
                (draw, mine), theirs = run_beside(here, functools.partial(exchange, names[k:]))
                both = {**mine, **theirs}
                out.append({name: both[name] for name in names})
            pos += m
        return out

    def _draw(self, m: int) -> Draw:
        """The slots the next exchange of ``m`` rows empties: as drawn, and as physical rows."""
        idx = draw_slots(self.capacity_rows, m, self._next_key())
        return idx, (idx if self._view is None else self._view[idx])

    def _next_key(self) -> np.random.SeedSequence:
        j = self.draws
        self.draws += 1
        if self.keys is None:
            assert self.rng is not None
            return np.random.SeedSequence(int(self.rng.integers(2**63)))
        return draw_key(self.keys, j)

    def _advance(self, idx: np.ndarray, whole: bool, following: int) -> Draw | None:
        """After the exchange that emptied ``idx``: remap the slots if it took the whole buffer,
        then draw the ``following`` exchange (none when 0)."""
        if whole:  # the new rows sit in arrival order: slot idx[j] holds physical row j
            if self._arange is None:
                self._arange = np.arange(self.capacity_rows)
            view = np.empty(len(idx), np.intp)
            view[idx] = self._arange
            self._view = view
        return self._draw(following) if following else None

    def _advance_and_exchange(self, idx: np.ndarray, whole: bool, following: int,
                              exchange: Callable[[Sequence[str]], ArrayColumns],
                              names: Sequence[str]) -> tuple[Draw | None, ArrayColumns]:
        """:meth:`_advance`, then ``exchange(names)``: this thread's share while the helper works."""
        return self._advance(idx, whole, following), exchange(names)

    def _exchange(self, names: Sequence[str], sel: np.ndarray, chunk: ArrayColumns, whole: bool) -> ArrayColumns:
        """For each column in ``names``: take the physical rows ``sel`` out and put ``chunk``'s rows
        in, at ``sel`` or, when ``whole``, in their arrival order."""
        slots = self.slots
        assert slots is not None
        out = {}
        # Warming costs a pass over all the slots: worth it only when the draws touch most lines.
        warm = len(sel) * 8 >= self.capacity_rows
        for name in names:
            slot = slots[name]
            if warm and slot.dtype.kind in "biufcmM" and 0 < slot.nbytes <= _WARM_MAX_BYTES:
                slot.reshape(-1).view(np.uint8).max()
            # take(axis=0) copies whole rows of a 2-D column at once (3x faster than fancy
            # indexing there); for 1-D columns fancy indexing is the faster of the two.
            out[name] = np.take(slot, sel, axis=0) if slot.ndim > 1 else slot[sel]
            rows = self._rows.get(name)
            if whole:
                slot[...] = chunk[name]
            elif rows is None:
                slot[sel] = chunk[name]
            else:  # whole rows as one opaque value each: 3x faster than a 2-D scatter
                rows[sel] = _as_rows(np.ascontiguousarray(chunk[name]))
        return out

    def held(self) -> ArrayColumns:
        """The rows held, slot by slot (a copy where slots are remapped, else views)."""
        if self.slots is None:
            return {}
        if self._view is None:
            return {name: slot[: self.size] for name, slot in self.slots.items()}
        return {name: slot[self._view] for name, slot in self.slots.items()}

    def flush(self) -> ArrayColumns:
        """Empty the buffer: every row still held, in a random permutation."""
        chunks = list(self.drain())
        if len(chunks) <= 1:
            return chunks[0] if chunks else {}
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}

    def drain(self, chunk_rows: int = DRAIN_ROWS) -> Iterator[ArrayColumns]:
        """Empty the buffer as :meth:`flush` does, in chunks of ``chunk_rows`` gathered as they are
        asked for (the buffer is empty at once; its rows stay readable for the chunks)."""
        if self.slots is None or self.size == 0:
            return iter(())
        n, slots, view = self.size, self.slots, self._view
        piece = order_pieces(n, self._next_key())
        self.size = 0
        self._view = None
        self.slots = None  # the chunks still read the old arrays; new rows would get new ones

        def chunks() -> Iterator[ArrayColumns]:
            for lo in range(0, n, chunk_rows):
                perm = piece(lo, min(n, lo + chunk_rows))
                sel = perm if view is None else view[perm]
                yield {name: slot[sel] for name, slot in slots.items()}

        return chunks()

    def refill(self, rows: ArrayColumns, slots: np.ndarray | None = None) -> None:
        """Fill the buffer again with rows it held (a resume reads them again): ``rows[i]`` into
        slot ``slots[i]``, or slot ``i`` without ``slots``; the draws go on from ``draws``."""
        n = len(next(iter(rows.values()))) if rows else 0
        if slots is not None and np.array_equal(slots, np.arange(n)):
            slots = None
        self._allocate(rows)
        assert self.slots is not None
        if n == self.capacity_rows and all(isinstance(v, np.ndarray) for v in rows.values()):
            # A full buffer: the rows' arrays become the slots (a 2 Mi-row buffer: 0.2 s of copying
            # saved), and rows read in another order are found through the slots' view.
            self.slots = {k: v if v.flags.c_contiguous and v.flags.owndata and v.flags.writeable else np.array(v)
                          for k, v in rows.items()}
            self._rows = {k: _as_rows(v) for k, v in self.slots.items() if k in self._rows}
            if slots is not None:
                view = np.empty(n, np.intp)
                view[slots] = np.arange(n)
                self._view = view
        else:
            for k, v in rows.items():
                if slots is None:
                    self.slots[k][:n] = v
                else:
                    self.slots[k][slots] = v
        self.size = n


def shuffle_quality(order: np.ndarray) -> dict[str, float]:
    """How well ``order`` (the row numbers in the order they were delivered) is shuffled.

    Returns:
        ``position_correlation``: Pearson correlation between delivery position and row number
        (0 for a uniform shuffle, 1 for file order); ``neighbour_share``: the share of
        consecutive deliveries that were neighbours in the file (about ``2/n`` for a uniform
        shuffle, 1 for file order); ``mean_displacement``: mean ``|position - row| / n``
        (1/3 for a uniform shuffle, 0 for file order).
    """
    order = np.asarray(order, dtype=np.float64)
    n = len(order)
    if n < 3:
        return {"position_correlation": 0.0, "neighbour_share": 0.0, "mean_displacement": 0.0}
    pos = np.arange(n, dtype=np.float64)
    return {
        "position_correlation": float(np.corrcoef(pos, order)[0, 1]),
        "neighbour_share": float(np.mean(np.abs(np.diff(order)) == 1)),
        "mean_displacement": float(np.mean(np.abs(pos - (order - order.min()))) / n),
    }
