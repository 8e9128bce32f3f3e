"""Arrow IPC files (Feather v2): one block per record batch, memory-mapped."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources.base import (
    Block,
    BlockData,
    DTypes,
    OnBadRows,
    PathLike,
    Source,
    apply_dtypes,
    check_no_nulls,
    resolve_dtypes,
    select_columns,
    table_to_columns,
)

__all__ = ["ArrowSource", "read_arrow"]

# Open readers per thread: one reader is not safe to share between threads.
_LOCAL = threading.local()
_MAX_OPEN = 16


def read_arrow(
    paths: PathLike,
    *,
    columns: Sequence[str] | None = None,
    dtypes: DTypes = None,
    on_bad_rows: OnBadRows = "raise",
) -> ArrowSource:
    """A lazy source over Arrow IPC *file* format (Feather v2) files; a block is a record batch.

    Files are memory-mapped, so reading a block copies only the rows a batch needs. The IPC
    *stream* format has no index of its batches; convert it with ``pyarrow.ipc.new_file``.

    Args:
        paths: a file, a glob or a list of them; files are read in this order.
        columns: read only these columns (output keeps file order).
        dtypes: a mapping column -> dtype, or one dtype for every numeric column.
        on_bad_rows: what a null in an integer column does: "raise" or "skip" (and count).

    Example:
        >>> ds = naiad.read_arrow("train.arrow")  # doctest: +SKIP
    """
    return ArrowSource(paths, columns=columns, dtypes=dtypes, on_bad_rows=on_bad_rows)


def open_ipc(path: str) -> pa.ipc.RecordBatchFileReader:
    """A cached, memory-mapped IPC file reader (per thread), or a SourceError."""
    cache: OrderedDict[str, pa.ipc.RecordBatchFileReader] | None = getattr(_LOCAL, "open", None)
    if cache is None:
        cache = _LOCAL.open = OrderedDict()
    reader = cache.get(path)
    if reader is None:
        try:
            reader = pa.ipc.open_file(pa.memory_map(path, "r"))
        except FileNotFoundError:
            raise SourceError("file not found.", path=path) from None
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(
                f"not a readable Arrow IPC file ({exc}); is it truncated, or in the stream format?",
                path=path,
            ) from None
        cache[path] = reader
        if len(cache) > _MAX_OPEN:
            cache.popitem(last=False)
    else:
        cache.move_to_end(path)
    return reader


class ArrowSource(Source):
    """Arrow IPC files cut into record batches (see :func:`read_arrow`)."""

    def __init__(
        self,
        paths: PathLike,
        *,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        on_bad_rows: OnBadRows = "raise",
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows)
        self._selected = list(columns) if columns is not None else None
        self._dtypes_arg = dtypes
        self.schema()  # the schema is metadata: check columns and dtypes now

    def _read_schema(self) -> pa.Schema:
        schema = select_columns(open_ipc(self.paths[0]).schema, self._selected, self.paths[0])
        return apply_dtypes(schema, resolve_dtypes(self._dtypes_arg, schema.names))

    def _file_blocks(self, path: str) -> list[Block]:
        reader = open_ipc(path)
        missing = [n for n in self.schema().names if n not in reader.schema.names]
        if missing:
            raise SourceError(f"column(s) {missing} missing (present in {self.paths[0]}).", path=path, column=missing[0])
        blocks, row = [], 0
        for i in range(reader.num_record_batches):
            # Memory-mapped: reading a batch's header touches no column data.
            n = reader.get_batch(i).num_rows
            if n:
                blocks.append(Block(path, i, i + 1, n, row))
            row += n
        return blocks

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        schema = self.schema()
        try:
            batch = open_ipc(block.path).get_batch(block.start)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read record batch {block.start} ({exc}); is the file truncated?", path=block.path) from None
        table = pa.Table.from_batches([batch.slice(lo, hi - lo)]).select(schema.names)
        if table.schema != schema:
            try:
                table = table.cast(schema)
            except (pa.ArrowException, ValueError) as exc:
                raise SourceError(f"cannot convert record batch {block.start} to {schema}: {exc}", path=block.path) from None
        table, skipped = check_no_nulls(table, block, lo, self.on_bad_rows)
        return BlockData(table_to_columns(table), skipped)
