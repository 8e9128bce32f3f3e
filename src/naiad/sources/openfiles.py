"""Descriptors kept open across reads, bounded per process: the oldest are closed past the bound.

NOTE [ Open files ]
Reading windows of tokens with ``pread`` needs an open descriptor per file, and opening one per
read costs more than the read (NOTE [ Reading windows with pread ] in tokens/files.py), so
descriptors are kept open between batches. Real corpora have thousands of token files, each
process (every worker) keeps its own descriptors, and the soft limit on open files is often 1,024
(or 256): kept forever, they end a shuffled epoch with "Too many open files". So a process keeps
at most :func:`open_files_budget` of them (a quarter of its soft ``RLIMIT_NOFILE``, between 8 and
1,024, or ``NAIAD_MAX_OPEN_FILES``), in one table shared by every reader of the process, and
closes the oldest opened past it.

The readers of Parquet, Arrow and ``.npy`` files keep a few open readers per thread (their
footers parsed once), as many as a sixteenth of the same budget, at most 16 (``ReaderCache`` in
columnar.py): with the thread workers and read-ahead threads a process has, they stay within it.

A descriptor is never closed while a read may be using it: closing one that another thread is
reading through would let the next ``open`` reuse its number, and that read would return another
file's bytes. So a read *enters* the table (:meth:`Descriptors.enter`, once per read, not per
file), and a descriptor evicted meanwhile is only set aside, closed once no read is inside. Each
descriptor set aside moves the table's ``generation`` on, so a reader may keep the descriptors it
looked up for its next reads while the generation stands (a token reader looks its files up once,
not at every batch).
Should reads on several threads overlap for long while many files come and go, the descriptors
set aside could pile up: at half the budget a new read waits until the reads in flight end (a
batch's reads: milliseconds). A read that needs more files at once than half the budget is done
in groups of files (the caller's loop over :attr:`Descriptors.group_size`). After a fork the
child closes the descriptors it inherited from the table and opens its own in a new table (a
``pread`` has no offset to share, but the table is the process's: NOTE [ Per-process state ]).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from naiad.process_state import per_process

__all__ = ["Descriptors", "descriptors", "open_files_budget"]

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def open_files_budget() -> int:
    """How many descriptors a process keeps open for reads (NOTE [ Open files ])."""
    named = os.environ.get("NAIAD_MAX_OPEN_FILES", "")
    if named.strip().isdigit() and int(named) > 0:
        return int(named)
    soft = 1024
    if resource is not None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit != resource.RLIM_INFINITY:
            soft = int(limit)
        else:
            soft = 1 << 16
    return max(8, min(soft // 4, 1024))


class Descriptors:
    """Read-only descriptors by path, at most ``capacity`` open, the oldest opened closed first
    (NOTE [ Open files ]).

    Args:
        capacity: the most descriptors kept open (those set aside while reads hold the table come
            on top, at most half as many again).
        generation: the first :attr:`generation` (a forked child's table starts past its
            parent's, so nothing a reader looked up there passes for its own).
    """

    def __init__(self, capacity: int, generation: int = 0) -> None:
        self.capacity = max(1, int(capacity))
        self._open: dict[str, int] = {}  # in the order opened
        self._aside: list[int] = []  # evicted while a read held the table: closed once none does
        self._holds = 0  # reads in flight
        self._generation = int(generation)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # waited on only while descriptors pile up

    def __len__(self) -> int:
        return len(self._open)

    def close_inherited(self) -> None:
        """In a forked child, the parent's table: close the child's copies of its descriptors,
        without its lock (another thread may have held it at the fork; the child has one)."""
        for fd in [*self._open.values(), *self._aside]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._open, self._aside, self._holds = {}, [], 0

    @property
    def group_size(self) -> int:
        """How many files one read may hold at once: half the budget (a read of more files goes
        a group at a time)."""
        return max(1, self.capacity // 2)

    @property
    def generation(self) -> int:
        """How many descriptors the table has set aside for closing, ever: while it has not
        changed since a reader looked its descriptors up, they are all still open."""
        return self._generation

    def enter(self) -> int:
        """Begin a read: no descriptor is closed until :meth:`leave`. Returns the
        :attr:`generation`, for a reader that kept its descriptors from an earlier read."""
        with self._lock:
            while self._holds and len(self._aside) >= self.group_size:
                self._changed.wait()  # the reads in flight end in milliseconds
            self._holds += 1
            return self._generation

    def lookup(self, paths: Sequence[str], ids: Iterable[int]) -> dict[int, int]:
        """Descriptors for the files ``paths[i]`` of ``ids`` by id, opened where needed, inside a
        read (:meth:`enter`). The oldest opened are set aside past the capacity (a read touches
        each of its files once: counting uses would cost more than the reopening it saves).

        Raises:
            OSError: a file cannot be opened (``filename`` names it).
        """
        out = {}
        with self._lock:
            opened = self._open
            for i in ids:
                path = paths[i]
                fd = opened.get(path)
                if fd is None:
                    fd = opened[path] = os.open(path, os.O_RDONLY | _CLOEXEC)
                    if len(opened) > self.capacity:
                        self._aside.append(opened.pop(next(iter(opened))))
                        self._generation += 1
                out[i] = fd
        return out

    def leave(self) -> None:
        """End a read that :meth:`enter` began; the descriptors set aside are closed when it was
        the last."""
        with self._lock:
            self._holds -= 1
            if not self._holds and self._aside:
                for fd in self._aside:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._aside.clear()
                self._changed.notify_all()

    @contextmanager
    def held(self, paths: Sequence[str], ids: Iterable[int]) -> Iterator[dict[int, int]]:
        """A read of the files ``paths[i]`` of ``ids``: their descriptors by id, for a ``with``
        block (:meth:`enter`, :meth:`lookup`, :meth:`leave`)."""
        self.enter()
        try:
            yield self.lookup(paths, ids)
        finally:
            self.leave()

    def close_all(self) -> None:
        """Close every descriptor (no read may hold the table: tests, a process that is done)."""
        with self._lock:
            for fd in [*self._open.values(), *self._aside]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._open.clear()
            self._aside.clear()
            self._generation += 1


_first_generation = 0


def _new_table() -> Descriptors:
    return Descriptors(open_files_budget(), _first_generation)


def _close_inherited(table: Descriptors) -> None:
    global _first_generation
    table.close_inherited()
    _first_generation = table.generation + 1  # what readers looked up in the parent is gone


_TABLE = per_process("naiad.sources.openfiles descriptors", _new_table, on_fork=_close_inherited)


def descriptors() -> Descriptors:
    """The process's table of kept descriptors (NOTE [ Open files ]), made at first use; a forked
    child closes the descriptors it inherited and makes its own (NOTE [ Per-process state ])."""
    return _TABLE.get()
