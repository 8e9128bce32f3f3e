"""JSON Lines files (one JSON object per line), parsed by PyArrow one byte-range block at a time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.badlines import BadRow, parse_robust, with_long_lines
from naiad.sources.base import Source
from naiad.sources.columns import (
    DTypes,
    apply_dtypes,
    missing_reason,
    null_column,
    null_rows,
    resolve_dtypes,
    select_columns,
    table_to_columns,
)
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits, bad_entry
from naiad.sources.index import IndexDir, check_index_dir
from naiad.sources.lines import (
    CutArgs,
    LineBlocks,
    block_bytes_for,
    detect_compression,
    parse_group_lines,
    parse_selected_lines,
    read_block_bytes,
    slice_rows,
)
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.paths import PathLike

__all__ = ["JsonlSource", "read_jsonl"]

_SAMPLE_BYTES = 1 << 20
_COLUMN_RE = re.compile(r"Column (\d+): ")
_FIELD_RE = re.compile(r"Column\(/([^)/]*)\)")


def _parse_sample(data: bytes) -> pa.Table:
    """Lines of the inference sample; a field name that is not UTF-8 makes its line a bad row
    (PyArrow parses it, and fails only when the name is asked for)."""
    table = pajson.read_json(pa.py_buffer(data if data.endswith(b"\n") else data + b"\n"))
    try:
        table.schema.names  # noqa: B018 (decodes every name)
    except UnicodeDecodeError as exc:
        raise BadRow(f"a field name is not UTF-8: {exc}") from None
    return table


class JsonlSource(LineBlocks, Source):
    """A lazy source over JSON Lines files (a path, a glob or a list), parsed by PyArrow, cut
    into byte-range blocks of whole lines: ``naiad.read_jsonl``.

    Fields and their types are inferred from the first MiB of the first non-empty file, then
    fixed; fields that appear only later are ignored (name them in ``dtypes`` to keep them).
    A field missing from a row is NaN (floats) or a bad row (integers: pass a float dtype).

    Args:
        paths, columns, dtypes, on_bad_rows, index_dir, storage, keep_parsed_bytes: as every
            reader takes them (:class:`~naiad.Source`).
        compression: "infer" from the extension, a codec name or None (one block per file).
        block_bytes: the size of a block, the unit of reading and of block shuffling
            (None: about 1/4096 of the source's local files together, or of each remote file,
            between 64 KiB and 4 MiB; see ``lines.default_block_bytes``).

    Example:
        >>> ds = naiad.read_jsonl("events-*.jsonl.gz", columns=["x", "label"])  # doctest: +SKIP
    """

    reader_name = "read_jsonl"
    traits = SourceTraits(early_cut=True, keeps_parsed=True, line_numbers=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        compression: str | None = "infer",
        on_bad_rows: BadRows = "raise",
        block_bytes: int | None = None,
        index_dir: IndexDir = None,
        storage: StorageLike = None,
        keep_parsed_bytes: int | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, keep_parsed_bytes=keep_parsed_bytes,
                         deprecated=deprecated)
        self.compression = compression
        self.block_bytes = block_bytes
        self.index_dir = check_index_dir(index_dir)
        self._dtypes_arg = dtypes
        self._selected = list(columns) if columns is not None else None
        self._full: pa.Schema | None = None

    def full_schema(self) -> pa.Schema:
        """Every inferred field with its fixed type (before column selection)."""
        if self._full is None:
            self._full = self._infer()
        return self._full

    def _infer(self) -> pa.Schema:
        for path in self.paths:
            codec = detect_compression(path, self.compression)
            try:
                with storage.input_stream(path, compression=codec, store=self.storage) as stream:
                    head = bytes(stream.read(_SAMPLE_BYTES))
            except (OSError, pa.ArrowException) as exc:
                raise SourceError(f"cannot read: {exc}", path=path) from None
            cut = head.rfind(b"\n") + 1
            sample = head[:cut] if cut else head + b"\n"
            if not sample.strip():
                continue
            # Bad lines in the sample are left out of the inference (found again, with their
            # line numbers, when their block is read).
            pieces, _ = parse_robust(
                sample, _parse_sample,
                path=path, first_line=1, on_bad_rows="skip", keep_blank=False,
                describe=lambda e: (str(e), None),
            )
            if not pieces:
                raise SourceError("no line of the first MiB is a JSON object.", path=path, line=1)
            schema = pieces[0].schema
            for piece in pieces[1:]:
                try:
                    schema = pa.unify_schemas([schema, piece.schema], promote_options="permissive")
                except pa.ArrowException:
                    pass  # a field of another type in a few lines: bad rows, when their block is read
            schema = pa.schema([pa.field(f.name, pa.string() if pa.types.is_null(f.type) else f.type) for f in schema])
            dtypes = resolve_dtypes(self._dtypes_arg, schema.names) if not isinstance(self._dtypes_arg, dict) else None
            if isinstance(self._dtypes_arg, dict):
                # Fields named in dtypes are kept even if the sample lacks them.
                extra = [pa.field(c, t) for c, t in resolve_dtypes(self._dtypes_arg, list(self._dtypes_arg)).items()  # type: ignore[union-attr]
                         if c not in schema.names]
                schema = pa.schema(list(schema) + extra)
                dtypes = resolve_dtypes(self._dtypes_arg, schema.names)
            return apply_dtypes(schema, dtypes)
        return pa.schema([])

    def _read_schema(self) -> pa.Schema:
        return select_columns(self.full_schema(), self._selected, self.paths[0])

    def _cut_args(self, path: str) -> CutArgs:
        return CutArgs(block_bytes=block_bytes_for(path, self.block_bytes, self.local_bytes(), self.storage), header_lines=0,
                       compression=self.compression, keep_blank=False, whole=False, index_dir=self.index_dir)

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        buf, line0 = slice_rows(read_block_bytes(block, self.compression, self.storage), lo, hi, block.rows, keep_blank=False)
        return self._parse_lines(buf, line0, block, hi - lo, use_threads)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        data = parse_group_lines(parts, self.compression, False, lambda buf, n: self._parse_lines(buf, 0, parts[0][0], n, use_threads), self.storage)
        return data if data is not None else super()._read_group(parts, use_threads)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        data = parse_selected_lines(
            parts, self.compression, False, lambda buf, n: self._parse_lines(buf, 0, parts[0][0], n, use_threads), self.storage,
        )
        return data if data is not None else super()._read_rows_many(parts, use_threads)

    def _parse_lines(self, buf: bytes, line0: int, block: Block, expected: int, use_threads: bool) -> BlockData:
        """Parse ``buf`` (whole lines, the first at line ``line0`` of the block): ``expected`` rows."""
        full = self.full_schema()
        schema = self.schema()
        read = pajson.ReadOptions(use_threads=use_threads)
        parse_opts = pajson.ParseOptions(explicit_schema=full, unexpected_field_behavior="ignore")

        def parse(data: bytes) -> pa.Table:
            if not data.strip():
                return schema.empty_table()
            if not data.endswith(b"\n"):
                data += b"\n"
            table = with_long_lines(lambda size: pajson.read_json(
                pa.py_buffer(data), parse_options=parse_opts,
                read_options=read if size is None else pajson.ReadOptions(use_threads=use_threads, block_size=size),
            ), len(data)).select(schema.names)
            # PyArrow's JSON parser does not check that strings are UTF-8; a line that is not
            # fails here, as a bad row, instead of when its value is read.
            table.validate(full=True)
            if null_rows(table).size:
                col = null_column(table)
                raise BadRow(missing_reason(col, table.schema.field(col).type, f"pass dtypes={{{col!r}: 'float32'}} to read NaN"), col)
            return table

        tables, skipped = parse_robust(
            buf, parse, path=block.path, first_line=block.first_line + line0,
            on_bad_rows=self.on_bad_rows, keep_blank=False, describe=lambda exc: _json_problem(exc, full, schema),
        )
        # Every line bad: no piece parsed, zero rows.
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0] if tables else schema.empty_table()
        if table.num_rows + len(skipped) != expected:
            raise SourceError(f"expected {expected} rows, parsed {table.num_rows + len(skipped)}: one object per line is required.",
                              path=block.path, line=block.first_line + line0)
        bad = tuple(bad_entry(at, block.path, problem, line=line, column=column) for at, line, problem, column in skipped)
        return BlockData(table_to_columns(table), bad)


def _json_problem(exc: Exception, full: pa.Schema, schema: pa.Schema) -> tuple[str, str | None]:
    """A bad line's problem in words, and its field when one is named."""
    if isinstance(exc, BadRow):
        return str(exc), exc.column
    text = str(exc).split("\n")[0].replace(" in row 0", "")
    m = _COLUMN_RE.match(text)  # "Column 2: In chunk 0: Invalid: Invalid UTF8 ..."
    if m and int(m.group(1)) < len(schema.names):
        return text, schema.names[int(m.group(1))]
    m = _FIELD_RE.search(text)  # "JSON parse error: Column(/b) changed from number to string"
    return text, m.group(1) if m and m.group(1) in full.names else None


read_jsonl = JsonlSource
