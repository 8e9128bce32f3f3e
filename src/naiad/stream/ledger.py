"""The ledger of rows skipped by ``on_bad_rows="skip"``, and how skipped rows travel through a
stream without moving any other row.

NOTE [ Bad rows keep their positions ]
The epoch plan, the shuffle buffer's draws and a resume's replay all count row *positions*
(NOTE [ Mid-epoch resume ] in stream.py). A skipped row therefore keeps its position all the way
to batch assembly: a reader returns the good rows and, for each skipped one, its position among
the rows asked for (``BlockData.bad``); the stream puts a placeholder row there (zeros, or None
for objects) and tags every row with an id column (``-1``: a good row; else an entry of the
stream's pending bad rows). The shuffle buffer moves placeholders like any row. When a batch is
cut, its placeholders are dropped and their entries enter the ledger, in the order of the batch.

The rule that follows, and what it buys:

* A batch holds the rows of its planned positions that are good, so a batch with skipped rows is
  smaller than ``batch_size`` (empty, if every one of its rows was bad). The number of batches
  is the plan's: equal on every rank, whatever was skipped, with or without ``drop_last``.
* Every good row is delivered exactly once, and a resume, even on another topology, replays the
  same positions: the same batches, the same skipped rows (a resume is exact, never refused).
* A skipped row is counted when its batch is cut, not when it is read: a resume reads again the
  rows the buffer held, and they are counted once, when they leave. A state taken after ``k``
  batches holds the ledger of the rows skipped in those ``k`` batches (and the earlier epochs).
  With ``drop_last``, bad rows among the rows an epoch leaves unused are not counted.

NOTE [ Ledger bounds ]
The ledger is bounded in memory and in a state, whatever the number of skipped rows (a corpus
with millions of bad rows must not write megabytes into every checkpoint):

* in memory (``loader.stats()``): the first ``KEEP_ENTRIES`` skipped rows in full (a reason to
  its first ``MAX_ENTRY_REASON_CHARS`` characters), then counts per (file, reason) (a reason to
  its first ``MAX_REASON_CHARS``; at most ``_MAX_KEYS`` pairs, the rest as one "other reasons"
  count per file);
* in a state: the ``STATE_KEYS`` commonest (file, reason) counts, the rest as one count under
  ("(other files)", "(other reasons)"), and the first ``STATE_ENTRIES`` entries (their reasons
  to ``MAX_REASON_CHARS`` characters): a few KB. The
  total, and so ``max_bad_rows`` and the state's ``bad_rows``, stay exact across a resume; the
  entries after a resume are the state's sample and the rows skipped since.

Every skipped row, in full, goes to the ``naiad.bad_rows`` logger at INFO as one line of JSON
(silent unless a handler is added: ``logging.getLogger("naiad.bad_rows").addHandler(
logging.FileHandler("bad_rows.jsonl"))`` and ``setLevel(logging.INFO)`` keep them all in a file).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from naiad.errors import SourceError, StateError
from naiad.sources.base import MaxBadRows, check_max_bad_rows

__all__ = ["BAD_ID", "KEEP_ENTRIES", "STATE_ENTRIES", "STATE_KEYS", "BadRowLedger", "BadRowTracker", "check_max_bad_rows"]

KEEP_ENTRIES = 1000
"""Skipped rows kept in full in a ledger in memory; later ones are only counted."""

STATE_ENTRIES = 8
"""Skipped rows kept in full in a state (NOTE [ Ledger bounds ])."""

STATE_KEYS = 16
"""(file, reason) counts kept apart in a state; the rest are one count (NOTE [ Ledger bounds ])."""

MAX_REASON_CHARS = 160
"""A reason is counted, and kept in a state, to this many characters (a parser's message can
quote a whole line); an entry in memory keeps ``MAX_ENTRY_REASON_CHARS`` of it."""

MAX_ENTRY_REASON_CHARS = 1000

_LOG = logging.getLogger("naiad.bad_rows")
_PASS_LOG = logging.getLogger("naiad.stream")  # apart: naiad.bad_rows handlers may keep JSON lines
_OTHER_FILES = "(other files)"

BAD_ID = "__naiad_bad_row__"
"""The column that tags each row of a stream with skip on: -1, or the id of its pending entry."""

_MAX_KEYS = 1000  # distinct (file, reason) counts
_OTHER = "(other reasons)"
_LOOKBEHIND = 4096  # batches a state may be taken behind the stream (a prefetcher's read-ahead)

def _cut(text: str, most: int) -> str:
    """``text``, or its first ``most`` characters ending in "..." when it is longer."""
    return text if len(text) <= most else text[: most - 3] + "..."


class BadRowLedger:
    """The rows a loader skipped: the first :data:`KEEP_ENTRIES` in full, counts for all.

    Entries are plain dicts, ``{"file", "line" or "row", "column" (when known), "reason",
    "epoch"}``, in the order their batches were delivered. ``state()`` and ``load()`` carry it in
    a loader's state dict (JSON), so it survives a resume.
    """

    def __init__(self, keep: int = KEEP_ENTRIES) -> None:
        self.keep = keep
        self.entries: list[dict[str, Any]] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        # (epoch, batch, the entries it added as [start, stop), its (file, reason) keys): what a
        # state taken behind the stream leaves out. A decode stage's records come a few batches
        # after the cut's (BadRowTracker.count), so a batch's entries need not be the last ones.
        self._journal: deque[tuple[int, int, int, int, list[tuple[str, str]]]] = deque()

    @property
    def total(self) -> int:
        """Rows skipped."""
        return sum(self.counts.values())

    def record(self, epoch: int, batch: int, entries: Sequence[dict[str, Any]]) -> None:
        """Count the skipped rows of batch ``batch`` of ``epoch`` (in the batch's order)."""
        keys = []
        before = len(self.entries)
        log = _LOG.isEnabledFor(logging.INFO)
        for e in entries:
            if log:
                _LOG.info("%s", json.dumps({**e, "epoch": epoch}, default=str))
            reason = str(e.get("reason", ""))
            if len(reason) > MAX_ENTRY_REASON_CHARS:
                e = {**e, "reason": _cut(reason, MAX_ENTRY_REASON_CHARS)}
            key = self._key(str(e.get("file", "")), _cut(reason, MAX_REASON_CHARS))
            self.counts[key] += 1
            keys.append(key)
            if len(self.entries) < self.keep:
                self.entries.append({**e, "epoch": epoch})
        self._journal.append((epoch, batch, before, len(self.entries), keys))
        while len(self._journal) > 1 and self._journal[-1][1] - self._journal[0][1] > _LOOKBEHIND:
            self._journal.popleft()

    def _key(self, path: str, reason: str) -> tuple[str, str]:
        key = (path, reason)
        if key in self.counts or len(self.counts) < _MAX_KEYS:
            return key
        return (path, _OTHER)

    def by_file(self) -> dict[str, int]:
        """Rows skipped per file."""
        out: Counter[str] = Counter()
        for (path, _), n in self.counts.items():
            out[path] += n
        return dict(out)

    def by_reason(self) -> dict[str, int]:
        """Rows skipped per reason (all files), the commonest first."""
        out: Counter[str] = Counter()
        for (_, reason), n in self.counts.items():
            out[reason] += n
        return dict(out.most_common())

    def state(self, epoch: int | None = None, batch: int | None = None) -> dict[str, Any]:
        """The ledger as JSON-able data of a few KB (NOTE [ Ledger bounds ]), leaving out batches
        ``batch`` and later of ``epoch`` (the batches a stream cut ahead of the position a state
        describes)."""
        counts = Counter(self.counts)
        left_out: set[int] = set()
        if epoch is not None and batch is not None:
            for e, b, start, stop, keys in self._journal:
                if e == epoch and b >= batch:
                    counts.subtract(keys)
                    left_out.update(range(start, stop))
        counts = +counts  # the positive ones
        total = sum(counts.values())
        kept = counts.most_common(STATE_KEYS)
        rest = total - sum(n for _, n in kept)
        rows = [[path, reason, n] for (path, reason), n in kept] + ([[_OTHER_FILES, _OTHER, rest]] if rest else [])
        entries = [{**e, "reason": _cut(str(e.get("reason", "")), MAX_REASON_CHARS)}
                   for i, e in enumerate(self.entries[: STATE_ENTRIES + len(left_out)]) if i not in left_out]
        return {"total": total, "counts": rows, "entries": entries[:STATE_ENTRIES]}

    def load(self, state: Any) -> None:
        """Replace the ledger with ``state`` (from :meth:`state`).

        Raises:
            StateError: the state is not a ledger.
        """
        try:
            if len(state["counts"]) > _MAX_KEYS + 1:
                raise ValueError(f"{len(state['counts'])} counts, at most {_MAX_KEYS + 1}")
            counts = Counter({(str(p), str(r)): n for p, r, n in state["counts"]})
            # Only the first `keep` entries are kept: a hostile list costs no more than it weighs.
            entries = [dict(e) for e in state["entries"][: self.keep]]
            if not all(type(n) is int and n >= 0 for n in counts.values()):
                raise ValueError("counts must be ints >= 0")
            if not all(isinstance(e.get("file"), str) for e in entries):
                raise ValueError("entries without a file")
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"stream state bad_row_ledger: stored {type(state).__name__}, expected a ledger ({str(exc):.200}).") from None
        self.counts = counts
        self.entries = entries
        self._journal.clear()

    def summary(self, top: int = 3) -> str:
        """How many rows were skipped, where, and the commonest reasons, in words."""
        files = Counter(self.by_file()).most_common(top)
        reasons = list(self.by_reason().items())[:top]
        where = ", ".join(f"{path} ({n:,})" for path, n in files)
        why = "; ".join(f"{reason!r:.160} ({n:,})" for reason, n in reasons)
        first = self.entries[0] if self.entries else None
        at = ""
        if first is not None:
            pos = f" line {first['line']}" if "line" in first else f" row {first['row']}" if "row" in first else ""
            at = f"; the first: {first['file']}{pos}"
        return f"{self.total:,} in all (every epoch), in {where}; the commonest reasons: {why}{at}"


class BadRowTracker:
    """One stream's skipped rows on their way from the readers to the ledger (NOTE [ Bad rows keep
    their positions ]), and the ``max_bad_rows`` check for its epoch.

    Args:
        ledger: where delivered skipped rows are counted (the loader's, across epochs).
        epoch: the stream's epoch.
        limit: ``max_bad_rows``: a count, a fraction of ``planned_rows``, or None.
        planned_rows: the rows this rank delivers in the epoch (positions, skipped ones included).
        skipped: rows of this epoch skipped before the stream's first batch (a resume's).
    """

    def __init__(self, ledger: BadRowLedger, epoch: int, limit: MaxBadRows, planned_rows: int, skipped: int = 0) -> None:
        self.ledger = ledger
        self.epoch = epoch
        self.max_rows = None if limit is None else limit if isinstance(limit, int) else int(limit * planned_rows)
        self._limit_text = f"{limit}" if isinstance(limit, int) else f"{limit} of {planned_rows:,} rows"
        self.skipped = skipped
        self._pending: dict[int, dict[str, Any]] = {}
        self._next_id = 0
        self._by_batch: list[tuple[int, int]] = []  # (batch, rows skipped from it), in batch order
        self._first: dict[str, Any] | None = None  # this pass's first skipped row
        self._reported = False

    def tag(self, columns: Mapping[str, np.ndarray], bad: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        """``columns`` (the good rows of a read) with a placeholder at each skipped row's position
        and the :data:`BAD_ID` column."""
        n = (len(next(iter(columns.values()))) if columns else 0) + len(bad)
        ids = np.full(n, -1, np.int64)
        if not bad:
            return {**columns, BAD_ID: ids}
        at = np.array([e["at"] for e in bad], np.int64)
        ids[at] = np.arange(self._next_id, self._next_id + len(bad))
        for e in bad:
            self._pending[self._next_id] = {k: v for k, v in e.items() if k != "at"}
            self._next_id += 1
        keep = ids < 0
        out: dict[str, np.ndarray] = {BAD_ID: ids}
        for name, col in columns.items():
            full = np.empty((n, *col.shape[1:]), col.dtype) if col.dtype == object else np.zeros((n, *col.shape[1:]), col.dtype)
            full[keep] = col
            out[name] = full
        return out

    def untag(self, batch: dict[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
        """Batch ``index`` without its placeholders, whose entries enter the ledger.

        Raises:
            SourceError: past ``max_bad_rows`` for the epoch, summarising the ledger.
        """
        ids = batch.pop(BAD_ID, None)
        if ids is None:
            return batch
        bad = ids >= 0
        if not bad.any():
            return batch
        self.count(index, [self._pending.pop(int(i)) for i in ids[bad]])
        keep = ~bad
        return {name: col[keep] for name, col in batch.items()}

    def count(self, index: int, entries: list[dict[str, Any]]) -> None:
        """Ledger ``entries``, the rows skipped from batch ``index``: when it is cut, or later (a
        decode stage's, a few batches behind the cut; each batch's are counted once).

        Raises:
            SourceError: past ``max_bad_rows`` for the epoch, summarising the ledger.
        """
        self.ledger.record(self.epoch, index, entries)
        self.skipped += len(entries)
        if self._first is None and entries:
            self._first = entries[0]
        # In batch order, whatever order the counts came in: skipped_before() walks it.
        bisect.insort(self._by_batch, (index, len(entries)))
        if self.max_rows is not None and self.skipped > self.max_rows:
            raise SourceError(
                f"{self.skipped:,} bad rows skipped in epoch {self.epoch}, past max_bad_rows={self._limit_text}; "
                f"{self.ledger.summary()}. Fix the data, or raise the limit (on_bad_rows=naiad.SkipBadRows(max_rows=...)).",
                path=entries[0]["file"],
            )

    def report(self) -> None:
        """Log, once, at WARNING on ``naiad.stream``, how many rows this pass skipped and the
        first one's file, position and reason (the pass's end: every row skipped is counted)."""
        if self._reported or self._first is None:
            return
        self._reported = True
        first = self._first
        where = ", ".join(f"{k} {first[k]}" for k in ("line", "row", "column") if first.get(k) is not None)
        _PASS_LOG.warning("naiad: %s bad rows skipped in epoch %d (%s in the epoch); the first: %s%s: %s",
                          f"{sum(n for _, n in self._by_batch):,}", self.epoch, f"{self.skipped:,}",
                          first.get("file", "?"), f" ({where})" if where else "", _cut(str(first.get("reason", "")), MAX_REASON_CHARS))

    def skipped_before(self, batch: int, start: int) -> int:
        """Rows of the epoch skipped in the batches before ``batch`` (``start``: the skips the
        stream began with)."""
        out = start
        for index, count in self._by_batch:
            if index >= batch:
                break
            out += count
        return out
