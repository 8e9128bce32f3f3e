"""The newline scan: a plain line-based file cut into blocks of whole lines, rows counted.

NOTE [ Newline scan ]
The cut (NOTE [ Byte-range blocks ] in lines.py) reads the file in steps of ``block_bytes``
after its header and ends each block at the last newline read so far; a line longer than a
step joins the next. It is sequential: each block's step starts where the previous one's
ended. What makes it fast is how the bytes are read, not the rule:

* The file is read into one reused buffer of ``SCAN_CHUNK_BYTES`` (1 MiB). A fresh 16 MiB
  ``read()`` per step cost a page fault per 4 KiB of it, and a 16 MiB piece no longer fits the
  cache that the comparisons run in: at 1 GB the old scan took 1.0-1.5 s, this one 0.35-0.4 s.
* Each piece is compared with ``\\n`` once, into a reused mask; a block's rows are counted on
  that mask from the previous cut to its own, so every byte is counted once, and only the
  cut is searched for (``rfind``, C's ``memrchr``), never every newline's position.
* Blank lines, which CSV and JSON parsers skip, are found on the same mask (a newline after a
  newline, or after ``\\r`` after a newline) and counted only in pieces that have any.

A block may start in one piece and end in a later one: the counts carry over, and the last
newline of earlier pieces is remembered for a line that spans pieces.

The rule looks sequential, but the steps' ends form a fixed grid, ``start + j * block_bytes``
(a step with no newline is extended by one more step, which lands on the grid again), and a
block ends after the last newline before a grid point, unless that newline ended the previous
block. So a local file of 32 MiB or more is cut into regions of 16 MiB on the grid, scanned
side by side (NumPy and the reads release the GIL), each reporting per grid point its last
newline and counts, and ``_merge_regions`` joins them into the same cut. The files of a
source are cut side by side too (``Source.blocks``); a file's regions then stay in its thread.
At 1 GB on two cores: 1.0-1.5 s before, 0.25-0.3 s now.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from naiad.errors import SourceError
from naiad.parallel.threads import thread_cores
from naiad.sources import storage
from naiad.sources.cache import CHUNK_BYTES

__all__ = [
    "SCAN_CHUNK_BYTES", "SCAN_REGION_BYTES", "Entry", "cut_lines", "cut_lines_parallel", "early_cut", "header_end", "scan_plain",
    "span_rows",
]

SCAN_CHUNK_BYTES = 1 << 20
"""Bytes the scan reads and compares at a time (see NOTE [ Newline scan ])."""

SCAN_REGION_BYTES = 16 << 20
"""A local file this big or bigger is scanned in regions of this size side by side."""

_SCAN_CACHED_BYTES = 1 << 20

Entry = tuple[int, int, int, int]
"""A block of the cut: (start, stop, rows, first line)."""


def scan_plain(path: str, block_bytes: int, header_lines: int, keep_blank: bool,
               store: storage.Storage | None = None) -> list[Entry]:
    """The cut of a plain (uncompressed) file after its ``header_lines``; an object is read
    through ``store``, its source's Storage."""
    remote = storage.is_remote(path)
    # An object's scan reads it whole, once: past the block cache, unless it is small enough to
    # be one range (the same the reader's header and type sample read), which keeps a shard
    # that has no index entry (no rows) from being fetched again by the next process.
    small = remote and storage.size(path, store=store) <= _SCAN_CACHED_BYTES
    # Where the objects fit in the cache, the scan reads through its chunks instead: the
    # bytes it reads are then the first epoch's too (NOTE [ Block cache ], chunks).
    chunks = remote and storage.needs_store(path, store).chunked(path)
    with storage.open_input(path, store=store, cached="chunks" if chunks else small,
                            buffer_bytes=CHUNK_BYTES if chunks else 8 << 20) as f:
        pos = header_end(f.read(max(block_bytes, 1 << 16)), header_lines, path) if header_lines else 0
        if not remote:
            size = os.fstat(f.fileno()).st_size
            threads = min(thread_cores(), 8)
            if threads > 1 and size - pos >= 2 * SCAN_REGION_BYTES:
                return cut_lines_parallel(functools.partial(_open_at, path), pos, size, block_bytes, 1 + header_lines,
                                          keep_blank, threads, SCAN_REGION_BYTES, SCAN_CHUNK_BYTES)
        f.seek(pos)
        return cut_lines(f, pos, block_bytes, 1 + header_lines, keep_blank, SCAN_CHUNK_BYTES)


def early_cut(path: str, block_bytes: int, header_lines: int) -> list[tuple[int, int]]:
    """The byte ranges of :func:`scan_plain`'s cut of a local plain file, without its counts,
    from the bytes near the steps' ends only (NOTE [ Early reads ] in naiad/stream/early.py).

    A block ends after the last newline before a grid point unless that newline ended the
    previous block (NOTE [ Newline scan ]), so each end is found by searching back from its
    grid point to the previous end: a line's length of bytes per block, not the file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = header_end(f.read(max(block_bytes, 1 << 16)), header_lines, path) if header_lines else 0
        spans: list[tuple[int, int]] = []
        start = pos
        # The grid points, then the file's end (its last newline ends the last full block).
        for g in (*range(pos + block_bytes, size + 1, block_bytes), size):
            nl = _last_newline(f.fileno(), start, g)
            if nl >= 0:
                spans.append((start, nl + 1))
                start = nl + 1
        if start < size:  # the last line, without a newline
            spans.append((start, size))
        return spans


def _last_newline(fd: int, lo: int, hi: int) -> int:
    """The last newline in bytes ``[lo, hi)`` of the file, or -1: read backwards from ``hi``."""
    want = 4096
    end = hi
    while end > lo:
        a = max(lo, end - want)
        k = os.pread(fd, end - a, a).rfind(b"\n")
        if k >= 0:
            return a + k
        end, want = a, min(want * 4, SCAN_CHUNK_BYTES)
    return -1


def span_rows(path: str, start: int, stop: int, keep_blank: bool) -> int:
    """The rows of the block ``[start, stop)`` of :func:`early_cut`, as :func:`scan_plain`
    counts them: its lines, less blank ones unless ``keep_blank``."""
    with open(path, "rb") as f:
        at = max(0, start - 2)
        f.seek(at)
        before = f.read(start - at)  # as the scan's regions: what is missing is a newline
        prev1 = before[-1] if before else 10
        prev2 = before[-2] if len(before) > 1 else 10
        region = _scan_region(f, start, stop, start, stop - start + 1, keep_blank,
                              max(1, min(SCAN_CHUNK_BYTES, stop - start)), prev1, prev2)
    if region.end != stop:
        raise SourceError(f"expected {stop - start} bytes at offset {start}, read {region.end - start}: "
                          "the file shrank while it was read.", path=path)
    if region.last_byte == 10 or start == stop:
        return region.newlines - (0 if keep_blank else region.blanks)
    # The last line, without a newline (its block holds no other): blank if it is a lone \r.
    return int(keep_blank or not (stop - start == 1 and region.last_byte == 13))


def _open_at(path: str, offset: int) -> io.BufferedIOBase:
    f = open(path, "rb")
    f.seek(offset)
    return f


def header_end(head: bytes, header_lines: int, path: str) -> int:
    """Where the rows start in a file that begins with ``head``, after ``header_lines`` lines."""
    pos = 0
    for _ in range(header_lines):
        nl = head.find(b"\n", pos)
        if nl < 0:
            if len(head) >= 1 << 16:
                raise SourceError("no end of line in the first 64 KiB: is this a CSV file?", path=path, line=1)
            return len(head)  # empty, or a header alone: no rows
        pos = nl + 1
    return pos


def cut_lines(f: io.BufferedIOBase, pos: int, block_bytes: int, line: int, keep_blank: bool,
              chunk_bytes: int = SCAN_CHUNK_BYTES) -> list[Entry]:
    """Cut what ``f`` holds from its position (byte ``pos`` of the file, line ``line``) to its
    end into blocks, as NOTE [ Newline scan ] describes, in one pass."""
    region = _scan_region(f, pos, None, pos, block_bytes, keep_blank, chunk_bytes)
    return _merge_regions([region], pos, line, keep_blank)


def cut_lines_parallel(open_at: Callable[[int], io.BufferedIOBase], pos: int, size: int, block_bytes: int, line: int,
                       keep_blank: bool, threads: int, region_bytes: int = SCAN_REGION_BYTES,
                       chunk_bytes: int = SCAN_CHUNK_BYTES) -> list[Entry]:
    """:func:`cut_lines` of a file of ``size`` bytes, its regions scanned side by side on
    ``threads`` threads (``open_at(offset)``: a file of its own, at ``offset``)."""
    step = max(1, region_bytes // block_bytes) * block_bytes  # regions start on the steps' grid
    starts = list(range(pos, size, step)) or [pos]

    def scan(k: int) -> _Region:
        a = starts[k]
        b = starts[k + 1] if k + 1 < len(starts) else None
        at = max(pos, a - 2)
        with open_at(at) as f:
            before = f.read(a - at)  # the two bytes before the region (none before the rows)
            prev1 = before[-1] if before else 10  # the start of the rows is as after a newline
            prev2 = before[-2] if len(before) > 1 else 10
            return _scan_region(f, a, b, pos, block_bytes, keep_blank, chunk_bytes, prev1, prev2)

    with ThreadPoolExecutor(max(1, min(threads, len(starts))), thread_name_prefix="naiad-scan") as pool:
        regions = list(pool.map(scan, range(len(starts))))
    return _merge_regions(regions, pos, line, keep_blank)


@dataclass
class _Region:
    """What a region of the file says about the steps' ends (the grid points) inside it."""

    points: list[tuple[int, int, int]]
    """Per grid point in order (and the file's end, in the last region): the region's last
    newline before it (-1: none), and the newlines and blank lines up to and with that one."""
    newlines: int
    blanks: int
    last_nl: int  # the region's last newline (-1: none)
    end: int  # where the region ended (the file's size, for the last one)
    last_byte: int  # the byte before `end`


def _scan_region(f: io.BufferedIOBase, a: int, b: int | None, origin: int, block_bytes: int, keep_blank: bool,
                 chunk_bytes: int, prev1: int = 10, prev2: int = 10) -> _Region:
    """Scan bytes [a, b) of the file (b None: to its end) from ``f``, at ``a``; the grid points
    are ``origin + j * block_bytes``; ``prev1`` and ``prev2`` are the two bytes before ``a``."""
    points: list[tuple[int, int, int]] = []
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    arr = np.frombuffer(buf, np.uint8)
    nl = np.zeros(chunk_bytes, bool)
    blank = np.zeros(chunk_bytes, bool)
    g = origin + ((a - origin) // block_bytes + 1) * block_bytes  # the first grid point after `a`
    base = a
    last_nl = -1
    seen_nl = seen_blank = 0  # newlines (and blank ones) before `counted`
    counted = a
    while True:
        want = chunk_bytes if b is None else min(chunk_bytes, b - base)
        n = 0
        while n < want:
            got = f.readinto(view[n:want])
            if not got:
                break
            n += got
        np.equal(arr[:n], 10, out=nl[:n])
        any_blank = not keep_blank and n > 0 and _mark_blanks(buf, arr, nl, blank, n, prev1, prev2)
        while g <= base + n and (b is None or g <= b):
            k = buf.rfind(b"\n", 0, g - base)
            if k >= 0:
                if k + 1 > counted - base:
                    nls, blanks = _count(nl, blank, counted - base, k + 1, any_blank)
                    seen_nl, seen_blank, counted = seen_nl + nls, seen_blank + blanks, base + k + 1
                points.append((base + k, seen_nl, seen_blank))
            else:  # no newline in this piece before the point: the region's last one so far
                points.append((last_nl, seen_nl, seen_blank))
            g += block_bytes
        nls, blanks = _count(nl, blank, counted - base, n, any_blank)
        seen_nl, seen_blank = seen_nl + nls, seen_blank + blanks
        if n:
            j = buf.rfind(b"\n", 0, n)
            if j >= 0:
                last_nl = base + j
            prev2, prev1 = (int(arr[n - 2]) if n > 1 else prev1), int(arr[n - 1])
        base += n
        counted = base
        if n < want or (b is not None and base >= b):
            if n < want:  # the file's end: the last block ends at its last newline
                points.append((last_nl, seen_nl, seen_blank))
            return _Region(points, seen_nl, seen_blank, last_nl, base, prev1)


def _merge_regions(regions: list[_Region], pos: int, line: int, keep_blank: bool) -> list[Entry]:
    """The cut from the regions' points, in order: a block ends after the last newline before
    each point, unless that newline ended the previous block (the step then goes on)."""
    out: list[Entry] = []
    last_nl = pos - 1
    nl_before = blank_before = 0  # newlines (and blank ones) before the region
    nl_at_pos = blank_at_pos = 0
    for region in regions:
        for local_nl, nls, blanks in region.points:
            if local_nl >= 0:
                cut_nl, nl_to, blank_to = local_nl, nl_before + nls, blank_before + blanks
            else:
                cut_nl, nl_to, blank_to = last_nl, nl_before, blank_before
            if cut_nl < pos:
                continue  # no newline in this step: it joins the next
            lines_in = nl_to - nl_at_pos
            out.append((pos, cut_nl + 1, lines_in if keep_blank else lines_in - (blank_to - blank_at_pos), line))
            line += lines_in
            pos, nl_at_pos, blank_at_pos = cut_nl + 1, nl_to, blank_to
        nl_before += region.newlines
        blank_before += region.blanks
        if region.last_nl >= 0:
            last_nl = region.last_nl
    end = regions[-1].end
    if pos < end:  # the last line, without a newline
        is_blank = end - pos == 1 and regions[-1].last_byte == 13
        out.append((pos, end, int(keep_blank or not is_blank), line))
    return out


def _count(nl: np.ndarray, blank: np.ndarray, lo: int, hi: int, any_blank: bool) -> tuple[int, int]:
    """Newlines, and blank lines, in ``[lo, hi)`` of the piece."""
    return int(np.count_nonzero(nl[lo:hi])), int(np.count_nonzero(blank[lo:hi])) if any_blank else 0


def _mark_blanks(buf: bytearray, arr: np.ndarray, nl: np.ndarray, blank: np.ndarray, n: int, prev1: int, prev2: int) -> bool:
    """Mark in ``blank[:n]`` the newlines that end a blank line (after a newline, or after a
    ``\\r`` after a newline), ``prev1`` and ``prev2`` being the two bytes before the piece;
    whether there is any."""
    np.logical_and(nl[1:n], nl[: n - 1], out=blank[1:n])
    blank[0] = nl[0] and prev1 == 10
    if buf.find(b"\r", 0, n) >= 0 or prev1 == 13:
        cr = arr[:n] == 13
        if n > 2:
            blank[2:n] |= nl[2:n] & cr[1 : n - 1] & nl[: n - 2]
        if n > 1:
            blank[1] |= nl[1] and cr[0] and prev1 == 10
        blank[0] |= nl[0] and prev1 == 13 and prev2 == 10
    return bool(blank[:n].any())
