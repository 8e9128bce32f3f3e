"""Elastic resume: the rest of an epoch on another world size, batch size or shuffle buffer.

NOTE [ Elastic resume ]
An epoch is a sequence of ``N`` positions: for a map-style dataset, positions in the epoch's
index order (a permutation per (seed, epoch), or ``range(N)``); for a streaming source,
positions in the epoch's block order (the permuted blocks laid end to end). A *leg* is a stretch
of an epoch run with one topology: ``(world_size, batch_size, drop_last, buffer_rows)``. Rank
``r`` of a leg takes the contiguous range ``[r*M//W, (r+1)*M//W)`` of the leg's ``M`` input
positions (NOTE [ Exactly once across ranks ] in plan.py), and every rank yields the same number
of batches, so ranks step in lockstep and one rank's count of batches describes the whole job.

Resuming with the topology the state was saved with continues the leg exactly. Resuming with
another one ends the leg after the ``k`` batches every rank delivered and starts a new leg over
the positions no old rank delivered. Those follow from the plan alone, by replay, with no row
lists stored: without a shuffle buffer, old rank ``r`` delivered the first ``S_r(k)`` positions
of its range; with one, the buffer's draws depend only on chunk sizes, so replaying it over
positions tells which rows it had emitted, which it held and which were still owed (see
NOTE [ Mid-epoch resume ] in stream.py). The new leg's input is, rank by rank of the old leg,
the rows it held or owed (ascending) followed by the part of its range it had not read yet.
The new ranks split that input as any leg does, so every remaining row is delivered exactly once
across them, with equal batch counts. A state records each finished leg as five integers, so
resuming again (elastic or not) during a resumed epoch replays the legs in turn. The next epoch
is an ordinary epoch for the new topology.

A state is data from a file, so every leg read from one is checked strictly (ints that are ints,
within bounds): replaying a leg costs time in its ranks, so a hostile state that asks for 10**18
ranks or a million legs is a StateError, not a hang (docs/SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from naiad.errors import StateError
from naiad.order.ranks import batch_sizes, rank_bounds

__all__ = ["MAX_LEGS", "MAX_WORLD_SIZE", "Leg", "Segments", "leg_remaining", "rank_share", "state_int"]

MAX_WORLD_SIZE = 1 << 16
"""The most ranks a stored leg, and the finished legs of a state together, may have."""

MAX_LEGS = 1024
"""The most finished legs (elastic resumes within one epoch) a state may hold."""


def state_int(value: Any, what: str, lo: int = 0, hi: int | None = None) -> int:
    """``value`` if it is an int in ``[lo, hi]`` (not a bool, float or string), else a StateError.

    Example:
        >>> state_int(3, "loader state epoch")
        3
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value >= lo and (hi is None or value <= hi):
            return int(value)
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    shown = f"{value!r:.80}" if not isinstance(value, int) or value.bit_length() < 256 else f"an int of {value.bit_length()} bits"
    raise StateError(f"{what}: stored {shown}, expected an int {bound}.")

Piece = tuple[int, int] | np.ndarray
"""A run of positions: a range ``(start, stop)`` or an explicit int64 array."""


@dataclass(frozen=True)
class Leg:
    """One stretch of an epoch with one topology (see NOTE [ Elastic resume ]).

    Attributes:
        world_size: ranks in the leg.
        batch_size: rows (indices) per full batch.
        drop_last: only full batches, the same number on every rank.
        buffer_rows: the shuffle buffer's capacity (0: none, the order is the plan's).
        batches: batches every rank delivered in this leg before it ended.
    """

    world_size: int
    batch_size: int
    drop_last: bool
    buffer_rows: int
    batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The leg as plain JSON-able data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], batches_key: str = "batches") -> Leg:
        """The leg from :meth:`as_dict` (a stream's state counts its batches under
        ``batches_yielded``); a malformed one is a StateError."""
        missing = [k for k in ("world_size", "batch_size", "drop_last", "buffer_rows", batches_key) if k not in data]
        if missing:
            raise StateError(f"malformed leg in the loader state: no {', '.join(missing)}.")
        drop_last = data["drop_last"]
        if not isinstance(drop_last, bool):
            raise StateError(f"malformed leg in the loader state: drop_last is {drop_last!r:.80}, expected a bool.")
        return cls(
            state_int(data["world_size"], "loader state leg world_size", 1, MAX_WORLD_SIZE),
            # An int64 at most: batch sizes are NumPy arrays of them (a larger one is no plan).
            state_int(data["batch_size"], "loader state leg batch_size", 1, 2**63 - 1),
            drop_last,
            # An int64 at most too: the plan's block runs divide by it as a float.
            state_int(data["buffer_rows"], "loader state leg buffer_rows", 0, 2**63 - 1),
            state_int(data[batches_key], f"loader state leg {batches_key}", 0),
        )

    def same_topology(self, other: Leg) -> bool:
        """True when ``other`` runs the same plan as this leg (only ``batches`` may differ)."""
        return (self.world_size, self.batch_size, self.drop_last, self.buffer_rows) == (
            other.world_size, other.batch_size, other.drop_last, other.buffer_rows)


class Segments:
    """An ordered sequence of positions, held as ranges and small explicit arrays.

    The first leg of an epoch is one range; later legs add an array of scattered leftovers per
    old rank. Memory is bounded by the leftovers, never by ``N``.
    """

    def __init__(self, pieces: Sequence[Piece] = ()) -> None:
        kept: list[Piece] = []
        for p in pieces:
            if isinstance(p, np.ndarray):
                if len(p):
                    kept.append(p.astype(np.int64, copy=False))
            elif p[1] > p[0]:
                kept.append((int(p[0]), int(p[1])))
        self.pieces = kept
        self._ends = np.cumsum([_piece_len(p) for p in kept], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __add__(self, other: Segments) -> Segments:
        return Segments(self.pieces + other.pieces)

    def slice(self, a: int, b: int) -> Segments:
        """Positions ``a:b`` of the sequence (indices into it, not position values)."""
        a, b = max(a, 0), min(b, len(self))
        out: list[Piece] = []
        start = 0
        for p, end in zip(self.pieces, self._ends.tolist()):
            lo, hi = max(a - start, 0), min(b - start, end - start)
            if hi > lo:
                out.append((p[0] + lo, p[0] + hi) if isinstance(p, tuple) else p[lo:hi])
            start = end
            if start >= b:
                break
        return Segments(out)

    def at(self, offsets: np.ndarray) -> np.ndarray:
        """The position values at the given offsets into the sequence (vectorized)."""
        offsets = np.asarray(offsets, np.int64)
        out = np.empty(len(offsets), np.int64)
        which = np.searchsorted(self._ends, offsets, side="right")
        starts = np.concatenate(([0], self._ends[:-1]))
        for k in np.unique(which).tolist():
            sel = which == k
            p, rel = self.pieces[k], offsets[sel] - starts[k]
            out[sel] = p[0] + rel if isinstance(p, tuple) else p[rel]
        return out

    def to_array(self) -> np.ndarray:
        """Every position, in order (for map-style plans, which index arrays anyway)."""
        parts = [np.arange(p[0], p[1], dtype=np.int64) if isinstance(p, tuple) else p for p in self.pieces]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __repr__(self) -> str:
        shown = [p if isinstance(p, tuple) else f"array[{len(p)}]" for p in self.pieces[:6]]
        return f"Segments({shown}{'...' if len(self.pieces) > 6 else ''}, n={len(self)})"


def _piece_len(p: Piece) -> int:
    return len(p) if isinstance(p, np.ndarray) else p[1] - p[0]


def rank_share(sequence: Segments, leg: Leg, rank: int) -> tuple[Segments, np.ndarray]:
    """Rank ``rank``'s positions in a leg over ``sequence``, and its batch sizes.

    The ranges and batch counts of NOTE [ Exactly once across ranks ]: contiguous ranges whose
    sizes differ by at most one, ``ceil(max_rows / batch_size)`` batches on every rank (or
    ``min_rows // batch_size`` full ones with ``drop_last``).
    """
    bounds = rank_bounds(len(sequence), leg.world_size)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    sizes_all = np.diff(bounds)
    if leg.drop_last:
        n = int(sizes_all.min()) // leg.batch_size
        sizes = np.full(n, leg.batch_size, np.int64)
    else:
        n = -(-int(sizes_all.max()) // leg.batch_size)
        sizes = batch_sizes(hi - lo, n, leg.batch_size)
    return sequence.slice(lo, hi), sizes


Leftovers = Callable[[int, Segments, np.ndarray, int], tuple[np.ndarray, int]]
"""``(rank, share, batch_sizes, delivered_rows) -> (offsets still owed, offsets consumed)``:
which offsets into the rank's share were taken in but not delivered (a shuffle buffer's held and
owed rows), and how many offsets it had taken in. Without a buffer: nothing held, ``delivered``
consumed."""


def no_buffer(rank: int, share: Segments, sizes: np.ndarray, delivered: int) -> tuple[np.ndarray, int]:
    """The :data:`Leftovers` of a leg without a shuffle buffer: rows leave in plan order."""
    return np.zeros(0, np.int64), delivered


def leg_remaining(sequence: Segments, leg: Leg, leftovers: Leftovers = no_buffer) -> Segments:
    """The positions of ``sequence`` that no rank of ``leg`` delivered in its ``leg.batches``
    batches, in the canonical order of the next leg's input (NOTE [ Elastic resume ])."""
    pieces: list[Piece] = []
    for rank in range(leg.world_size):
        share, sizes = rank_share(sequence, leg, rank)
        delivered = int(sizes[: leg.batches].sum())
        owed, consumed = leftovers(rank, share, sizes, delivered)
        if len(owed):
            pieces.append(np.sort(share.at(np.sort(owed))))
        pieces.extend(share.slice(consumed, len(share)).pieces)
    return Segments(pieces)


def epoch_sequence(total: int, legs: Sequence[Leg], leftovers_for: Callable[[int], Leftovers]) -> Segments:
    """The input of the leg after ``legs``: all ``total`` positions, less what each leg delivered.

    ``leftovers_for(i)`` gives leg ``i``'s :data:`Leftovers` (its buffer replay).
    """
    sequence = Segments([(0, total)])
    for i, leg in enumerate(legs):
        sequence = leg_remaining(sequence, leg, leftovers_for(i))
    return sequence


def iter_legs(data: Any) -> Iterator[Leg]:
    """The finished legs stored in a state (a list of dicts); a malformed list is a StateError."""
    if not isinstance(data, list):
        raise StateError(f"loader state `legs` must be a list, got {type(data).__name__}.")
    if len(data) > MAX_LEGS:
        raise StateError(f"loader state `legs` holds {len(data)} legs, more than the {MAX_LEGS} an epoch may have.")
    ranks = 0
    for item in data:
        if not isinstance(item, Mapping):
            raise StateError(f"loader state `legs` holds {item!r:.100}, not a dict.")
        leg = Leg.from_dict(item)
        ranks += leg.world_size
        if ranks > MAX_WORLD_SIZE:
            raise StateError(f"loader state `legs` have more than {MAX_WORLD_SIZE} ranks in all.")
        yield leg
