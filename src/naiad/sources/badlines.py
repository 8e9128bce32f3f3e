"""A parse of whole lines that names or skips its bad ones: PyArrow fails a block whole, and
the bad lines are found by bisection.

NOTE [ Bad rows ]
PyArrow parses a whole block at once and, on a bad row, fails the whole block without saying
which line. Only then do we bisect: parse each half of the lines, recursing into the halves that
fail, down to single lines. A clean block costs one parse; a block with ``k`` bad rows costs
``O(k log n)`` parses. The single failing line gives the exact line number and PyArrow's own
description of the problem.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources.contract import OnBadRows
from naiad.sources.lines import row_spans

__all__ = ["BadLine", "BadRow", "ParseFn", "parse_robust", "with_long_lines"]


def with_long_lines(read: Callable[[int | None], pa.Table], size: int) -> pa.Table:
    """``read(None)``: a parse with PyArrow's own block size; where a line is longer than that
    block (1 MiB: PyArrow says it straddles two), ``read(size + 1)``: the buffer as one block."""
    try:
        return read(None)
    except pa.ArrowInvalid as exc:
        if "straddl" not in str(exc):
            raise
        return read(size + 1)


class BadRow(ValueError):
    """Raised by a parse function for a problem PyArrow does not see (e.g. a null integer).

    Attributes:
        column: the column the problem is in, when known.
    """

    def __init__(self, message: str, column: str | None = None) -> None:
        super().__init__(message)
        self.column = column


ParseFn = Callable[[bytes], pa.Table]
BadLine = tuple[int, int, str, "str | None"]
"""A line skipped by :func:`parse_robust`: (row of the buffer, 1-based line, problem, column)."""


def parse_robust(
    buf: bytes,
    parse: ParseFn,
    *,
    path: str,
    first_line: int,
    on_bad_rows: OnBadRows,
    keep_blank: bool,
    describe: Callable[[Exception], tuple[str, str | None]],
) -> tuple[list[pa.Table], list[BadLine]]:
    """Parse ``buf``; on failure, isolate the bad lines by bisection (see NOTE [ Bad rows ]).

    Args:
        parse: bytes of whole lines -> table; raises ``pa.ArrowException`` or :class:`BadRow`.
        first_line: 1-based line number of the first line of ``buf``.
        describe: an exception -> (problem in words, column name or None).

    Returns:
        The parsed pieces in order, and the bad rows skipped, in order: (row of ``buf``, line,
        problem, column).

    Raises:
        SourceError: on the first bad row when ``on_bad_rows="raise"``.
    """
    try:
        return [parse(buf)], []
    except (pa.ArrowException, BadRow):
        pass
    starts, ends, lines = row_spans(buf, keep_blank)
    n = len(starts)
    tables: list[pa.Table] = []
    skipped: list[BadLine] = []

    def go(a: int, b: int, known_bad: bool) -> None:
        if a >= b:
            return
        if not known_bad:
            piece = buf[int(starts[a]) : int(starts[b]) if b < n else len(buf)]
            try:
                tables.append(parse(piece))
                return
            except (pa.ArrowException, BadRow) as exc:
                err: Exception = exc
                if b - a > 1:
                    mid = (a + b) // 2
                    go(a, mid, False)
                    go(mid, b, False)
                    return
        else:
            mid = (a + b) // 2
            go(a, mid, False)
            go(mid, b, False)
            return
        # one line that does not parse
        problem, column = describe(err)
        if on_bad_rows == "raise":
            text = buf[int(starts[a]) : int(ends[a])][:200].decode("utf-8", "replace")
            raise SourceError(f"{problem}; the line is {text!r}.", path=path, line=first_line + int(lines[a]), column=column)
        skipped.append((a, first_line + int(lines[a]), problem, column))

    go(0, n, True)
    return tables, skipped
