"""Descriptors kept open across reads, bounded per process: the least recently used are closed.

NOTE [ Open files ]
Reading windows of tokens with ``pread`` needs an open descriptor per file, and opening one per
read costs more than the read (NOTE [ Reading windows with pread ] in tokens/files.py), so
descriptors are kept open between batches. Real corpora have thousands of token files, each
process (every worker) keeps its own descriptors, and the soft limit on open files is often 1,024
(or 256): kept forever, they end a shuffled epoch with "Too many open files". So a process keeps
at most :func:`open_files_budget` of them (a quarter of its soft ``RLIMIT_NOFILE``, between 8 and
1,024, or ``NAIAD_MAX_OPEN_FILES``), in one table shared by every reader of the process, and
closes the least recently used past it.

A read *pins* the descriptors it uses (:meth:`Descriptors.pinned`), so another thread never
closes one under it: closing a descriptor another thread is reading through would let the next
``open`` reuse its number, and the read would return another file's bytes. A read that needs
more files at once than the budget is done in groups of files (the caller's loop over
:meth:`Descriptors.groups`). After a fork the child closes the descriptors it inherited from the
table and opens its own (a ``pread`` has no offset to share, but the table is the process's).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["Descriptors", "descriptors", "open_files_budget"]

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]


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
    """Read-only descriptors by path, at most ``capacity`` open, least recently used closed first
    (NOTE [ Open files ]).

    Args:
        capacity: the most descriptors kept open (pinned ones may exceed it until released).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self._open: OrderedDict[str, int] = OrderedDict()
        self._pins: dict[str, int] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._open)

    def _forked(self) -> None:
        """In a forked child: close what the parent's table held (the child's copies) and start empty."""
        if self._pid != os.getpid():
            for fd in self._open.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._open.clear()
            self._pins.clear()
            self._pid = os.getpid()

    def groups(self, count: int) -> int:
        """How many files one pinned group may hold: a share of the budget that leaves room for
        other readers' pins."""
        return max(1, min(count, self.capacity // 2 or 1))

    @contextmanager
    def pinned(self, paths: Sequence[str]) -> Iterator[list[int]]:
        """Descriptors for ``paths`` (opened where needed), pinned until the block ends.

        Raises:
            OSError: a file cannot be opened (those opened for the others are kept).
        """
        fds = self._acquire(paths)
        try:
            yield fds
        finally:
            self._release(paths)

    def _acquire(self, paths: Sequence[str]) -> list[int]:
        out: list[int] = []
        with self._lock:
            self._forked()
            try:
                for path in paths:
                    fd = self._open.get(path)
                    if fd is None:
                        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                        self._open[path] = fd
                    else:
                        self._open.move_to_end(path)
                    self._pins[path] = self._pins.get(path, 0) + 1
                    out.append(fd)
            except BaseException:
                self._unpin(paths[: len(out)])
                raise
            self._evict()
        return out

    def _release(self, paths: Sequence[str]) -> None:
        with self._lock:
            if self._pid != os.getpid():
                return
            self._unpin(paths)
            self._evict()

    def _unpin(self, paths: Sequence[str]) -> None:
        for path in paths:
            left = self._pins.get(path, 0) - 1
            if left > 0:
                self._pins[path] = left
            else:
                self._pins.pop(path, None)

    def _evict(self) -> None:
        """Close the least recently used unpinned descriptors past the capacity."""
        if len(self._open) <= self.capacity:
            return
        for path in list(self._open):
            if len(self._open) <= self.capacity:
                break
            if path in self._pins:
                continue
            fd = self._open.pop(path)
            try:
                os.close(fd)
            except OSError:
                pass

    def close_all(self) -> None:
        """Close every descriptor not in use (tests; a reader that is done)."""
        with self._lock:
            self._forked()
            for path in [p for p in self._open if p not in self._pins]:
                try:
                    os.close(self._open.pop(path))
                except OSError:
                    pass


_TABLE: Descriptors | None = None
_TABLE_LOCK = threading.Lock()


def descriptors() -> Descriptors:
    """The process's table of kept descriptors (NOTE [ Open files ]), made at first use."""
    global _TABLE
    if _TABLE is None:
        with _TABLE_LOCK:
            if _TABLE is None:
                _TABLE = Descriptors(open_files_budget())
    return _TABLE
