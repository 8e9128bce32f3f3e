"""A batch's samples decoded on a small thread pool, and what a transform does with the rows
that fail.

NOTE [ Decode threads ]
Decoding is per sample by necessity (each image has its own bytes, size and crop), but the
decoders do their work with the GIL released (libjpeg-turbo through simplejpeg or Pillow,
Pillow's other codecs, torch's resize), so a batch's samples are spread over a few threads and
the per-sample Python between those calls is all that serialises. The calling thread only
waits: a transform applied in the training process never decodes in the training loop's thread.

Each pool thread takes the next row from a shared counter (so a large image does not hold up a
thread's fixed share) and writes only that row's slot of the output, so no lock guards the
output. Failures are collected per row; the caller raises them together once every row has
finished, so no thread is left writing into a batch that has been given up.

The pool is one per process (made again after a fork, where the parent's threads do not exist)
and its threads are marked as one core each, so nothing they call spreads further. How many
threads a batch uses (``default_threads``): every usable core outside naiad's workers; inside a
pool of N process (or thread) workers, the cores divided among the N, at least one each (two for
a decode that holds the GIL: :data:`WORKER_THREADS_HOLDING_GIL`).

Its threads are :class:`~naiad.parallel.threads.DaemonThreads` (NOTE [ Daemon threads ]): a
decoder stuck for good on one hostile file must not keep the process from exiting once the
loader's timeout has raised. A stream's pass shuts the pool down when it closes (its end, a
``break``, an error: :func:`release_threads`), and exit shuts it down too: the idle threads end,
a stuck one is left (a daemon), and the next batch to decode makes a new pool, so a thread lost
to a stuck file does not stay one thread short. The batches already handed to the pool finish
on it: a batch's calls are queued together, under the pool's lock, before any shutdown's
``None``, so a pass that ends does not cut short another's decode. A pass may also be closed by
the cyclic collector, in whichever thread allocates, perhaps one queueing a batch's calls under
that lock: its shutdown then waits for them to be queued, and is done by that thread after them.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from typing import Any

import numpy as np
import torch

from naiad.errors import DecodeError
from naiad.parallel.context import get_worker_context
from naiad.parallel.threads import DaemonThreads, one_core_each, usable_cores
from naiad.process_state import per_process

__all__ = ["default_threads", "drop_rows", "encoded", "raise_failures", "release_threads", "run_rows", "sample_name"]


class _DecodePool:
    """This process's decode pool and what guards it (NOTE [ Per-process state ]: a forked child
    has none of the parent's threads, and the lock may have been held by one of them at the fork,
    so both are made again there)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner = 0  # the thread holding the lock while it queues a batch's calls
        self.release_asked = False  # by a finalizer in that thread (release_threads)
        self.pool: DaemonThreads | None = None
        self.size = 0


# The child never shuts the parent's pool down: its threads are not the child's to join.
_state = per_process("naiad.media.rows decode pool", _DecodePool)


WORKER_THREADS_HOLDING_GIL = 2
"""The fewest threads a decode that holds the GIL (``decode_video``) uses in a worker: measured
(2 workers on 2 cores, 16-frame H.264 clips decoded in batches of 8), one PyAV thread per worker
process left its core idle about a third of the time while the other worker decoded (the kernel
counted it as I/O wait; no page faults, no steal), 38-42 clips/s in all; a second thread in each
worker filled that time, 52-54 clips/s, the single process's rate times the cores. The two share
their worker's GIL, so the second costs thread switches, not a core."""


def default_threads(*, holds_gil: bool = False) -> int:
    """Threads a batch's decode uses when the transform was given none (NOTE [ Decode threads ]);
    ``holds_gil``: the decode is mostly Python under the GIL (:data:`WORKER_THREADS_HOLDING_GIL`)."""
    cores = usable_cores()
    context = get_worker_context()
    if context is not None and context.num_workers > 0:
        return max(WORKER_THREADS_HOLDING_GIL if holds_gil else 1, cores // context.num_workers)
    return cores


def _executor(threads: int) -> DaemonThreads:
    """This process's decode pool, with room for ``threads`` (call with its lock held)."""
    state = _state.get()
    # Sized for every core, not one batch's share: thread workers each decode their own batch
    # on it at once.
    size = max(threads, usable_cores())
    # Also made again once shut down at exit, for a read-ahead thread's last task.
    if state.pool is None or state.size < size or state.pool.closed:
        old = state.pool
        state.pool, state.size = DaemonThreads(size, name="naiad-decode", initializer=one_core_each), size
        if old is not None:
            old.shutdown()  # its running batches finish; new ones use the new pool
    return state.pool


def release_threads() -> None:
    """Shut this process's decode pool down (NOTE [ Decode threads ]): its idle threads end, a
    batch it holds finishes, a stuck one is left; the next batch to decode makes a new pool."""
    state = _state.peek()
    if state is None:
        return  # no pool made in this process
    if state.owner == threading.get_ident():
        # A pass's close run by the cyclic collector in this very thread, while it queues a
        # batch's calls under the lock: that batch releases the pool once they are queued.
        state.release_asked = True
        return
    with state.lock:
        old, state.pool = state.pool, None
    if old is not None:
        old.shutdown()


def _queue(call: Callable[[], None], threads: int) -> list[Future[None]]:
    """``call`` queued ``threads`` times on this process's pool, all of them before any
    shutdown's ``None`` (NOTE [ Decode threads ])."""
    state = _state.get()
    released = None
    with state.lock:
        state.owner = threading.get_ident()
        try:
            pool = _executor(threads)
            futures: list[Future[None]] = [pool.submit(call) for _ in range(threads)]
        finally:
            if state.release_asked:  # by a finalizer in this thread, meanwhile
                state.release_asked, released, state.pool = False, state.pool, None
            state.owner = 0  # last: nothing between this and the lock's release can run a finalizer
    if released is not None:
        released.shutdown()
    return futures


def run_rows(work: Callable[[int], None], rows: int, threads: int) -> dict[int, BaseException]:
    """Call ``work(i)`` for every row on ``threads`` pool threads (NOTE [ Decode threads ]);
    returns the rows whose call raised, with their exceptions, once every row has finished."""
    failures: dict[int, BaseException] = {}
    if rows == 0:
        return failures
    threads = max(1, min(threads, rows))
    counter = iter(range(rows))
    take = threading.Lock()

    def drain() -> None:
        while True:
            with take:
                i = next(counter, None)
            if i is None:
                return
            try:
                work(i)
            except Exception as exc:  # noqa: BLE001 - reported per row by the caller
                failures[i] = _unlinked(exc)

    futures = _queue(drain, threads)
    # Unbounded: this thread is a decode stage's or a worker's, and whoever waits for it does so
    # under the loader's timeout (docs/WORKERS.md, "Threads, processes and waits").
    wait(futures)
    for future in futures:
        future.result()  # drain itself never raises; this re-raises only a BaseException
    return failures


def encoded(value: Any) -> bytes | memoryview:
    """One sample's encoded bytes: bytes-like, a uint8 array, an Arrow scalar, or the
    ``{"bytes": ..., "path": ...}`` struct Hugging Face ``datasets`` stores images as."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value if isinstance(value, bytes) else memoryview(value).cast("B")
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        return memoryview(np.ascontiguousarray(value).reshape(-1).tobytes())
    if hasattr(value, "as_py"):
        return encoded(value.as_py())
    if isinstance(value, Mapping) and value.get("bytes") is not None:
        return encoded(value["bytes"])
    raise ValueError(f"expected the image's encoded bytes, got {type(value).__name__}")


def sample_name(batch: Mapping[str, Any], rows: int, key: str | None) -> Callable[[int], str]:
    """How an error names row ``i``: the batch's ``__key__`` or ``path`` value, else its key
    column's value, else its row number."""
    for column in ("__key__", "path"):
        names = batch.get(column)
        if names is not None and not isinstance(names, (str, bytes)) and _length(names) == rows:

            def by_name(i: int, names: Any = names, column: str = column) -> str:
                return f"{column} {names[i]!r}"

            return by_name
    if key is not None and key in batch and _length(batch[key]) == rows:
        keys = batch[key]

        def by_key(i: int) -> str:
            return f"{key} {int(keys[i])}"

        return by_key
    return lambda i: f"row {i}"


def _length(values: Any) -> int | None:
    try:
        return len(values)
    except TypeError:
        return None


def drop_rows(batch: Mapping[str, Any], bad: Sequence[int], rows: int) -> dict[str, Any]:
    """The batch without rows ``bad``: every column with one entry per row (a list, tuple, NumPy
    array or tensor) filtered; anything else (a scalar field, a string) kept as it is."""
    keep = np.ones(rows, dtype=bool)
    keep[list(bad)] = False
    index = np.flatnonzero(keep)
    out: dict[str, Any] = {}
    for name, values in batch.items():
        if isinstance(values, torch.Tensor) and values.ndim >= 1 and values.shape[0] == rows:
            out[name] = values[torch.from_numpy(index)]
        elif isinstance(values, np.ndarray) and values.ndim >= 1 and values.shape[0] == rows:
            out[name] = values[index]
        elif isinstance(values, (list, tuple)) and len(values) == rows:
            out[name] = type(values)(values[i] for i in index)
        else:
            out[name] = values
    return out


def raise_failures(
    failures: Mapping[int, BaseException],
    *,
    what: str,
    column: str,
    batch: Mapping[str, Any],
    decoded: dict[str, Any],
    rows: int,
    key: str | None,
) -> None:
    """Raise one :class:`~naiad.errors.DecodeError` for the batch's failed rows (none: return).

    ``decoded`` is the batch with the column decoded (the failed rows' slots unspecified); the
    error's ``kept`` is it without the failed rows, so a pipeline that skips bad samples can
    ledger ``rows`` and deliver ``kept`` without decoding the batch again.
    """
    if not failures:
        return
    bad = sorted(failures)
    name = sample_name(batch, rows, key)
    keys = [name(i) for i in bad]
    reasons = [f"{type(failures[i]).__name__}: {failures[i]}" for i in bad]
    shown = "; ".join(f"{k} (row {i}): {r}" for k, i, r in list(zip(keys, bad, reasons))[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    # Raised as it is made, never held in a local: this frame, in the error's traceback, would
    # hold the error, a cycle that keeps the batch until the collector runs.
    raise DecodeError(
        f"{len(bad)} of {rows} {what} did not decode: {shown}{more}. The error's `rows` lists them "
        "and `kept` holds the batch without them.",
        column=column,
        rows=bad,
        keys=keys,
        reasons=reasons,
        kept=drop_rows(decoded, bad, rows),
    ) from failures[bad[0]]


def _unlinked(exc: Exception) -> Exception:
    """A row's exception, its traceback kept for its lines but freed of what it held: the
    locals of the frames it passed (a decoded image of hundreds of MB, the failing decoder's
    buffers), and the pool thread's own frame, which holds the failures that hold the exception
    (a cycle: a batch of images that failed to decode kept 530 MB until the next collection)."""
    tb = exc.__traceback__
    inner = tb.tb_next if tb is not None else None
    traceback.clear_frames(inner)
    return exc.with_traceback(inner)
