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
pool of N process (or thread) workers, the cores divided among the N, at least one each.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from naiad.errors import DecodeError
from naiad.parallel.context import get_worker_context
from naiad.parallel.threads import one_core_each, usable_cores

__all__ = ["default_threads", "drop_rows", "encoded", "raise_failures", "run_rows", "sample_name"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_pid = -1


def default_threads() -> int:
    """Threads a batch's decode uses when the transform was given none (NOTE [ Decode threads ])."""
    cores = usable_cores()
    context = get_worker_context()
    if context is not None and context.num_workers > 0:
        return max(1, cores // context.num_workers)
    return cores


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size, _pool_pid
    with _lock:
        # Sized for every core, not one batch's share: thread workers each decode their own
        # batch on it at once.
        size = max(threads, usable_cores())
        if _pool is None or _pool_pid != os.getpid() or _pool_size < size:
            old = _pool if _pool_pid == os.getpid() else None
            _pool = ThreadPoolExecutor(size, thread_name_prefix="naiad-decode", initializer=one_core_each)
            _pool_size, _pool_pid = size, os.getpid()
            if old is not None:
                old.shutdown(wait=False)  # its running batches finish; new ones use the new pool
        return _pool


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
                failures[i] = exc

    pool = _executor(threads)
    futures = [pool.submit(drain) for _ in range(threads)]
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
    error = DecodeError(
        f"{len(bad)} of {rows} {what} did not decode: {shown}{more}. The error's `rows` lists them "
        "and `kept` holds the batch without them.",
        column=column,
        rows=bad,
        keys=keys,
        reasons=reasons,
        kept=drop_rows(decoded, bad, rows),
    )
    raise error from failures[bad[0]]
