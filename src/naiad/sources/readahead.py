"""Read-ahead of remote reads: the parts of one task fetched at once, on a few I/O threads.

NOTE [ Remote read-ahead ]
A range request to an object store costs a round trip (a millisecond on a local network, tens
across a region) before its first byte, and a worker that reads a read group's blocks one after
another pays one per block: its epoch is bound by latency, not bandwidth. So when a task's
reads are remote, they are all started at once on this process's I/O threads (at most
``IO_THREADS`` requests in flight per process) and their results taken in order: the group
costs about one round trip. Memory stays bounded by the task, whose bytes the parse holds
anyway (a read group is at most ``plan.GROUP_MAX_BYTES`` of text or ``group_rows`` rows).

Across tasks the depth is the pool's: ``num_workers`` processes, or ``read_ahead=`` threads
when ``num_workers=0``, each with one task at a time and ``prefetch_factor`` queued. A thread
that waits on the network costs no CPU, so for remote data a larger ``read_ahead=`` (8-16)
hides the latency of plans whose tasks are single large blocks (Parquet row groups).

The I/O threads are made per process (a forked worker makes its own) and never wait on each
other: a task run on an I/O thread that asks for more concurrent reads runs them in turn.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from naiad.process_state import per_process

__all__ = ["IO_THREADS", "io_map"]

T = TypeVar("T")
R = TypeVar("R")

IO_THREADS = 16
"""Remote reads one process keeps in flight at most."""

# This process's I/O threads; a forked worker makes its own (NOTE [ Per-process state ]).
_POOL = per_process(
    "naiad.sources.readahead io threads",
    lambda: ThreadPoolExecutor(IO_THREADS, thread_name_prefix="naiad-io", initializer=_mark),
)
_LOCAL = threading.local()


def _mark() -> None:
    _LOCAL.io_thread = True


def io_map(fn: Callable[[T], R], items: Sequence[T], *, window: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, run concurrently on the I/O threads (NOTE [ Remote read-ahead ]).

    The results are in order; the first failure, in order, is raised (the calls not yet
    started are cancelled). One item, or a call from an I/O thread, runs inline.

    Args:
        window: at most this many of the calls queued or running at once, the next started as
            the oldest is taken (None: all at once): a read of many small objects keeps a few
            requests in flight without filling the process's queue with all of them.
    """
    if len(items) < 2 or getattr(_LOCAL, "io_thread", False):
        return [fn(x) for x in items]
    pool = _POOL.get()
    ahead = len(items) if window is None else max(1, window)
    futures: deque[Future[R]] = deque()
    out: list[R] = []
    try:
        for x in items:
            if len(futures) >= ahead:
                out.append(futures.popleft().result())
            futures.append(pool.submit(fn, x))
        while futures:
            out.append(futures.popleft().result())
        return out
    finally:
        for f in futures:
            f.cancel()
