"""A batch's token windows from an object behind a URL: few range requests, in flight together.

NOTE [ Remote windows ]
A window is a few KB at a scattered offset, and against a far server each request costs a round
trip (tens of milliseconds), so a batch of 64 windows read one request after another waited 64
round trips. A batch's windows of one object are sorted by offset; those whose bytes lie within
``GAP_BYTES`` of the ones before are read as one range (an unshuffled batch is one request), a
range reaching at most into the next ``RUN_BYTES`` boundary (the size the block cache reads
through its chunks: NOTE [ Block cache ] in sources/cache.py), and the ranges go to the process's
I/O threads, ``IO_THREADS`` in flight at once (NOTE [ Remote read-ahead ] in
sources/readahead.py). Each window's bytes are then copied to its row, in the batch's order.
Retries, the block cache and the object's listed version are the Storage's, as for every read.
"""

from __future__ import annotations

import numpy as np

from naiad.sources import storage
from naiad.sources.cache import CHUNK_BYTES
from naiad.sources.readahead import IO_THREADS, io_map
from naiad.sources.storage import Storage

__all__ = ["GAP_BYTES", "RUN_BYTES", "read_remote_rows"]

GAP_BYTES = 64 << 10
"""Windows this close (bytes between one's end and the next one's start) share a request: 64 KiB
is a millisecond of a 100 MB/s stream, against a round trip of tens."""

RUN_BYTES = CHUNK_BYTES // 4
"""A range starts anew at each multiple of this: the block cache serves reads up to this long
from its chunks, so later epochs find them whatever windows they ask for."""


def read_remote_rows(url: str, store: Storage | None, offsets: np.ndarray, out: np.ndarray) -> None:
    """``out[j]`` = the bytes of ``url`` from ``offsets[j]`` on, as many as a row of ``out``
    holds (NOTE [ Remote windows ]); the Storage's SourceError naming the object when it is
    shorter now than its listing says."""
    n = len(offsets)
    if n == 0:
        return
    view = out.view(np.uint8).reshape(n, -1)
    nbytes = view.shape[1]
    order = np.argsort(offsets, kind="stable")
    begins = np.asarray(offsets, np.int64)[order]
    ends = np.maximum.accumulate(begins + nbytes)  # windows may overlap: a run ends at its furthest
    new = np.ones(n, bool)
    new[1:] = (begins[1:] > ends[:-1] + GAP_BYTES) | (begins[1:] // RUN_BYTES != begins[:-1] // RUN_BYTES)
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:], n) - 1
    spans = list(zip(begins[firsts].tolist(), ends[lasts].tolist(), strict=True))

    def fetch(span: tuple[int, int]) -> bytes:  # the Storage refuses an object shorter than listed
        return storage.read_range(url, span[0], span[1], store=store)

    # One request per run of windows, not per window: the loop below is over requests.
    for (start, _), first, last, data in zip(spans, firsts.tolist(), lasts.tolist(),
                                             io_map(fetch, spans, window=IO_THREADS), strict=True):
        rows = order[first:last + 1]
        windows = np.lib.stride_tricks.sliding_window_view(np.frombuffer(data, np.uint8), nbytes)
        view[rows] = windows[begins[first:last + 1] - start]
