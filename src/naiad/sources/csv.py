"""CSV (and TSV, and any delimiter) files, parsed by PyArrow one byte-range block at a time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage
from naiad.sources.badlines import BadRow, parse_robust, with_long_lines
from naiad.sources.base import Source
from naiad.sources.columns import (
    DTypes,
    apply_dtypes,
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
    count_rows,
    detect_compression,
    parse_group_lines,
    parse_selected_lines,
    read_block_bytes,
    slice_rows,
)
from naiad.sources.options import BadRows, StorageLike, warn_renamed
from naiad.sources.paths import PathLike

__all__ = ["CsvFormat", "CsvSource", "read_csv"]

_SAMPLE_BYTES = 1 << 20
_COLUMN_RE = re.compile(r"column #(\d+)")
_ROW_RE = re.compile(r"Row #\d+: |:[^:]*$")
_INT_RE = r"^[+-]?\d+$"
_FLOAT_RE = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(?i:nan|inf|infinity)$"
_NULLS = ["", "NA", "N/A", "n/a", "NULL", "null", "NaN", "nan", "-NaN", "-nan", "#N/A", "None"]


def _skip_row(row: object) -> str:
    return "skip"


def _numeric_types(columns: Sequence[tuple[str, pa.ChunkedArray]]) -> dict[str, pa.DataType]:
    """The columns of text values that are numbers for the most part: int64 when every number
    is an integer, float64 otherwise. Values in ``_NULLS`` (after trimming) do not count."""
    import pyarrow.compute as pc  # on first use: its import is a third of naiad's
    numeric: dict[str, pa.DataType] = {}
    for name, col in columns:
        if not pa.types.is_string(col.type):
            col = col.cast(pa.string())
        values = pc.utf8_trim_whitespace(col)
        values = pc.filter(values, pc.invert(pc.is_in(values, pa.array(_NULLS))))
        if len(values) == 0:
            continue
        floats = pc.sum(pc.match_substring_regex(values, _FLOAT_RE)).as_py() or 0
        if floats > 0.5 * len(values):
            ints = pc.sum(pc.match_substring_regex(values, _INT_RE)).as_py() or 0
            numeric[name] = pa.int64() if ints == floats else pa.float64()
    return numeric


def _open_quote_on_last_line(data: bytes, quote: bytes) -> bool:
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    return data.count(quote, data.rfind(b"\n", 0, end) + 1, end) % 2 == 1


_OLD_KEYWORDS = ("delimiter", "header", "column_names", "quote_char", "newlines_in_values", "compression")


@dataclass(frozen=True)
class CsvFormat:
    """How CSV files are written: :class:`CsvSource`'s ``csv=`` (``naiad.CsvFormat``).

    Attributes:
        delimiter: the field separator ("\\t" for TSV); None: a comma (a tab for ``.tsv`` files
            read through ``naiad.read``).
        header: the first line of every file holds the column names.
        column_names: names to use (replacing the header's when ``header`` is True; required
            or "f0", "f1", ... when it is False).
        quote_char: the quoting character, or None for no quoting.
        newlines_in_values: allow newlines inside quoted values. Files are then not split
            into byte ranges: each file is one block (memory grows with the file size).
        compression: "infer" from the extension (.gz, .zst, .bz2, .lz4), a codec name or None.
            A compressed file is read as one block (it cannot be entered in the middle).

    Example:
        >>> CsvFormat(delimiter="\\t", header=False).column_names is None
        True
    """

    delimiter: str | None = None
    header: bool = True
    column_names: tuple[str, ...] | None = None
    quote_char: str | None = '"'
    newlines_in_values: bool = False
    compression: str | None = "infer"

    def __post_init__(self) -> None:
        if self.delimiter is not None and (not isinstance(self.delimiter, str) or len(self.delimiter) != 1):
            raise ConfigError(f"`delimiter` must be one character, got {self.delimiter!r}.")
        if self.column_names is not None:
            if isinstance(self.column_names, str):
                raise ConfigError(f"`column_names` must be a list of names, got the string {self.column_names!r}.")
            object.__setattr__(self, "column_names", tuple(self.column_names))

    @classmethod
    def folded(cls, csv: CsvFormat | None, old: dict[str, Any]) -> CsvFormat:
        """``csv`` (None: the defaults) with the old keywords of ``old`` (popped from it) in
        their fields, warned about (NOTE [ Reader options ] in options.py)."""
        if csv is not None and not isinstance(csv, CsvFormat):
            raise ConfigError(f"`csv` must be a naiad.CsvFormat, got {type(csv).__name__}.")
        given = {k: old.pop(k) for k in _OLD_KEYWORDS if k in old}
        if given:
            warn_renamed("read_csv", {k: f"csv=naiad.CsvFormat({k}=...)" for k in given})
        return replace(csv or cls(), **given)


class CsvSource(LineBlocks, Source):
    """A lazy source over CSV files (a path, a glob or a list), parsed by PyArrow, cut into
    byte-range blocks of whole lines: ``naiad.read_csv``.

    Column types are inferred from the first MiB of the first non-empty file and then fixed for
    every block, so a batch never changes dtype; ``dtypes`` overrides them.

    Args:
        paths, columns, dtypes, on_bad_rows, index_dir, storage, keep_parsed_bytes: as every
            reader takes them (:class:`~naiad.Source`).
        csv: how the files are written (:class:`CsvFormat`: delimiter, header, column names,
            quoting, newlines in values, compression); None: comma-separated with a header.
        block_bytes: the size of a block, the unit of reading and of block shuffling
            (None: about 1/4096 of the source's local files together, or of each remote file,
            between 64 KiB and 4 MiB; see ``lines.default_block_bytes``).

    Example:
        >>> ds = naiad.read_csv("diabetes.csv", dtypes="float32")  # doctest: +SKIP
        >>> loader = naiad.DataLoader(ds, batch_size=256, shuffle=True,
        ...                           transform=naiad.pack_xy(label="Outcome"))  # doctest: +SKIP
        >>> tsv = naiad.read_csv("x.tsv", csv=naiad.CsvFormat(delimiter="\\t"))  # doctest: +SKIP
    """

    reader_name = "read_csv"
    traits = SourceTraits(early_cut=True, keeps_parsed=True, line_numbers=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        csv: CsvFormat | None = None,
        columns: Sequence[str] | None = None,
        dtypes: DTypes = None,
        on_bad_rows: BadRows = "raise",
        block_bytes: int | None = None,
        index_dir: IndexDir = None,
        storage: StorageLike = None,
        keep_parsed_bytes: int | None = None,
        **deprecated: Any,
    ) -> None:
        csv = CsvFormat.folded(csv, deprecated)
        super().__init__(paths, on_bad_rows=on_bad_rows, storage=storage, keep_parsed_bytes=keep_parsed_bytes,
                         deprecated=deprecated)
        if block_bytes is not None and block_bytes < 1:
            raise ConfigError(f"`block_bytes` must be >= 1, got {block_bytes}.")
        self.csv = csv
        self.delimiter = csv.delimiter or ","
        self.header = csv.header
        self.compression = csv.compression
        self.newlines_in_values = csv.newlines_in_values
        self.block_bytes = block_bytes
        self.index_dir = check_index_dir(index_dir)
        self._quote = csv.quote_char
        self._dtypes_arg = dtypes
        self._selected = list(columns) if columns is not None else None
        self._names = list(csv.column_names) if csv.column_names is not None else None
        self._header_arg_names = self._names  # names given by the user replace every header
        self._full: pa.Schema | None = None  # every column, types fixed
        if self._names is None and self.header:
            # The first file with a header names the columns (a file may be empty, 0 bytes).
            self._names = next((n for n in map(self._header_names, self.paths) if n is not None), None)
        if self._selected is not None and self._names is not None:
            select_columns(pa.schema([(n, pa.string()) for n in self._names]), self._selected, self.paths[0])

    # -- metadata --------------------------------------------------------------------------

    def _head(self, path: str, nbytes: int) -> bytes:
        codec = detect_compression(path, self.compression)
        try:
            with storage.input_stream(path, compression=codec, store=self.storage) as stream:
                return bytes(stream.read(nbytes))
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read: {exc}", path=path) from None

    def _header_names(self, path: str) -> list[str] | None:
        head = self._head(path, 1 << 16)
        if not head:
            return None
        line = head.split(b"\n", 1)[0].rstrip(b"\r")
        opts = pacsv.ParseOptions(delimiter=self.delimiter, quote_char=self._quote or False)
        try:
            table = pacsv.read_csv(pa.py_buffer(line + b"\n"), parse_options=opts,
                                   read_options=pacsv.ReadOptions(autogenerate_column_names=True))
        except pa.ArrowException as exc:
            raise SourceError(f"cannot parse the header: {exc}", path=path, line=1) from None
        return [str(v[0]) if len(v) else "" for v in table.to_pydict().values()]

    def _parse_options(self) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(
            delimiter=self.delimiter, quote_char=self._quote or False,
            newlines_in_values=self.newlines_in_values,
        )

    def full_schema(self) -> pa.Schema:
        """Every column of the file with its fixed type (before column selection)."""
        if self._full is None:
            self._full = self._infer()
        return self._full

    def _infer(self) -> pa.Schema:
        inferred: pa.Schema | None = None
        for path in self.paths:
            head = self._head(path, _SAMPLE_BYTES)
            if self.header:
                head = head.split(b"\n", 1)[1] if b"\n" in head else b""
            cut = head.rfind(b"\n") + 1
            sample = head[:cut] if cut else head
            if sample.strip():
                inferred = self._infer_sample(sample)
                break
        if inferred is None:  # no file has a data row: names only
            inferred = pa.schema([(n, pa.string()) for n in (self._names or [])])
        return apply_dtypes(inferred, resolve_dtypes(self._dtypes_arg, inferred.names))

    def _infer_sample(self, sample: bytes) -> pa.Schema:
        """Column types from a sample, robust to a few bad rows in it.

        PyArrow's own inference turns a numeric column into text because of one bad value, and
        fails outright on a row with a wrong field count. So: bad rows are skipped, and a column
        PyArrow reads as text is numeric when most of its non-empty values are numbers (the rest
        are bad rows, reported when their block is read). A column PyArrow reads as numbers has
        no value that is not one, so only the text columns are matched against the number
        patterns: on a sample of ten numeric columns that is one parse instead of two and no
        regular expression (about 10 ms instead of 35-40, before the first read).
        """
        names = self._names
        read = pacsv.ReadOptions(column_names=names, autogenerate_column_names=names is None,
                                 block_size=len(sample) + 1)  # one block: inferred over the whole sample
        parse = self._parse_options()
        parse.invalid_row_handler = _skip_row
        # Bytes that are not UTF-8 would make PyArrow fail to hand a bad row to the handler
        # (and fail the whole sample); for inference a replacement character is as good.
        sample = sample.decode("utf-8", "replace").encode()
        try:
            inferred = pacsv.read_csv(pa.py_buffer(sample), read_options=read, parse_options=parse)
        except pa.ArrowException:
            # Read as text, every column matched (and PyArrow infers the rest, below).
            inferred = None
        try:
            as_text = inferred if inferred is not None else pacsv.read_csv(
                pa.py_buffer(sample), read_options=read, parse_options=parse,
                convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names or []}))
            if names is None:
                names = self._names = list(as_text.column_names)
        except pa.ArrowException as exc:
            raise SourceError(f"cannot read the first MiB to infer column types: {exc}", path=self.paths[0]) from None
        text = [(n, col) for n, col in zip(names, as_text.columns)
                if inferred is None or pa.types.is_string(col.type) or pa.types.is_null(col.type)]
        numeric = _numeric_types(text)
        if inferred is not None:
            others = inferred.schema
        else:
            try:
                others = pacsv.read_csv(pa.py_buffer(sample), read_options=read, parse_options=parse,
                                        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in numeric})).schema
            except pa.ArrowException:
                others = pa.schema([(n, pa.string()) for n in names])
        fields = []
        for f in others:
            t = numeric.get(f.name, f.type)
            # A column that is empty in the sample is inferred as null; read it as text.
            fields.append(pa.field(f.name, pa.string() if pa.types.is_null(t) else t))
        return pa.schema(fields)

    def _read_schema(self) -> pa.Schema:
        return select_columns(self.full_schema(), self._selected, self.paths[0])

    # -- blocks ----------------------------------------------------------------------------

    def _cut_args(self, path: str) -> CutArgs:
        return CutArgs(block_bytes=block_bytes_for(path, self.block_bytes, self.local_bytes(), self.storage), header_lines=1 if self.header else 0,
                       compression=self.compression, keep_blank=False, whole=self.newlines_in_values, index_dir=self.index_dir)

    def _check_header(self, path: str) -> None:
        if self.header:
            # Every file is parsed with the first file's names: a different header would
            # silently put values in the wrong columns.
            first = self._names if self._header_arg_names is None else None
            names = self._header_names(path)
            if None not in (first, names) and names != first:
                raise SourceError(f"the header {names} differs from the first file's {first}.", path=path, line=1)

    def _early_cut(self, path: str) -> list[Block] | None:
        self._check_header(path)  # before any row of the file is read
        return super()._early_cut(path)

    def _file_blocks(self, path: str) -> list[Block]:
        self._check_header(path)
        blocks = super()._file_blocks(path)
        if self.newlines_in_values and blocks:
            # Lines are not records here: count the records by parsing (as text, so a bad
            # value does not stop the count; rows with a wrong field count are counted too).
            b = blocks[0]
            table, bad = self._parse_records(read_block_bytes(b, self.compression, self.storage), b, as_text=True)
            blocks = [b._replace(rows=table.num_rows + len(bad))]
        return blocks

    def _parse_records(self, buf: bytes, block: Block, *, as_text: bool, use_threads: bool = False) -> tuple[pa.Table, list[str]]:
        """Parse a whole file whose quoted values may hold newlines (no line bisection); returns
        the table and the problem of each record skipped for its field count."""
        full = self.full_schema()
        bad: list[str] = []

        def on_invalid(row: pacsv.InvalidRow) -> str:
            where = f"data row {row.number}: " if row.number is not None else ""
            bad.append(f"{where}Expected {row.expected_columns} columns, got {row.actual_columns}; the row is {row.text[:200]!r}")
            return "skip"

        opts = self._parse_options()
        opts.invalid_row_handler = on_invalid
        types = {n: pa.string() for n in full.names} if as_text else full
        if not buf.strip():
            return pa.schema([(n, types[n]) for n in full.names]).empty_table(), []
        try:
            table = pacsv.read_csv(
                pa.py_buffer(buf), parse_options=opts,
                read_options=pacsv.ReadOptions(column_names=full.names, use_threads=use_threads),
                convert_options=pacsv.ConvertOptions(column_types=types, include_columns=None if as_text else self.schema().names),
            )
        except pa.ArrowException as exc:
            raise SourceError(f"{exc} (values with newlines: no line number is known).", path=block.path) from None
        if bad and not as_text and self.on_bad_rows == "raise":
            raise SourceError(f"{bad[0]}.", path=block.path)
        return table, bad

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        if self.newlines_in_values:
            whole, bad = self._parse_records(read_block_bytes(block, self.compression, self.storage), block, as_text=False, use_threads=use_threads)
            # PyArrow names no line or record of a bad row here, so the good records take the
            # block's first positions and the bad ones the last: the same at every read.
            good = whole.num_rows
            entries = tuple(bad_entry(p - lo, block.path, bad[p - good]) for p in range(max(lo, good), hi))
            return BlockData(table_to_columns(whole.slice(lo, max(0, min(hi, good) - lo))), entries)
        buf, line0 = slice_rows(read_block_bytes(block, self.compression, self.storage), lo, hi, block.rows, keep_blank=False)
        return self._parse_lines(buf, line0, block, hi - lo, use_threads)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        data = None if self.newlines_in_values else parse_group_lines(parts, self.compression, False, lambda buf, n: self._parse_lines(buf, 0, parts[0][0], n, use_threads), self.storage)
        return data if data is not None else super()._read_group(parts, use_threads)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        data = None if self.newlines_in_values else parse_selected_lines(
            parts, self.compression, False, lambda buf, n: self._parse_lines(buf, 0, parts[0][0], n, use_threads), self.storage,
        )
        return data if data is not None else super()._read_rows_many(parts, use_threads)

    def _parse_lines(self, buf: bytes, line0: int, block: Block, expected: int, use_threads: bool) -> BlockData:
        """Parse ``buf`` (whole lines, the first at line ``line0`` of the block): ``expected`` rows."""
        full = self.full_schema()
        schema = self.schema()
        read = pacsv.ReadOptions(column_names=full.names, use_threads=use_threads)
        convert = pacsv.ConvertOptions(column_types=full, include_columns=schema.names)
        parse_opts = self._parse_options()
        quote = self._quote.encode() if self._quote else None

        def read_table(data: bytes, block_size: int | None) -> pa.Table:
            options = read if block_size is None else pacsv.ReadOptions(
                column_names=full.names, use_threads=use_threads, block_size=block_size)
            return pacsv.read_csv(pa.py_buffer(data), read_options=options, parse_options=parse_opts, convert_options=convert)

        def parse(data: bytes) -> pa.Table:
            if not data or data.isspace():  # (no copy, unlike strip())
                return schema.empty_table()
            table = with_long_lines(lambda size: read_table(data, size), len(data))
            # The whole buffer's rows are known from the scan; a piece's are counted.
            lines = expected if data is buf else count_rows(data, keep_blank=False)
            if table.num_rows != lines or (quote is not None and _open_quote_on_last_line(data, quote)):
                # A quote left open runs on over the following lines (PyArrow accepts that):
                # rows go missing. Opened on the last line, it runs to the end and none does,
                # but that line's count of quotes is odd (a well-formed line's is even, ""
                # included). Bisection finds the line that opens it.
                raise BadRow("a quoted value is not closed on its line (pass newlines_in_values=True if values hold newlines)")
            if null_rows(table).size:
                col = null_column(table)
                raise BadRow(f"missing value in integer column {col!r} (NumPy integers have no NaN; pass dtypes={{{col!r}: 'float32'}} to read NaN)", col)
            return table

        tables, skipped = parse_robust(
            buf, parse, path=block.path, first_line=block.first_line + line0,
            on_bad_rows=self.on_bad_rows, keep_blank=False, describe=lambda exc: _csv_problem(exc, full),
        )
        # Every line bad: no piece parsed, zero rows.
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0] if tables else schema.empty_table()
        if table.num_rows + len(skipped) != expected:
            raise SourceError(
                f"expected {expected} rows from line {block.first_line + line0}, parsed {table.num_rows + len(skipped)}: "
                "a newline inside a quoted value? Pass newlines_in_values=True.",
                path=block.path, line=block.first_line + line0,
            )
        bad = tuple(bad_entry(at, block.path, problem, line=line, column=column) for at, line, problem, column in skipped)
        return BlockData(table_to_columns(table), bad)


def _csv_problem(exc: Exception, full: pa.Schema) -> tuple[str, str | None]:
    """A bad line's problem in words, and its column when one is named."""
    if isinstance(exc, BadRow):
        return str(exc), exc.column
    text = _ROW_RE.sub("", str(exc).split("\n")[0])
    m = _COLUMN_RE.search(text)
    column = full.names[int(m.group(1))] if m and int(m.group(1)) < len(full.names) else None
    if "conversion error to string" in text:  # the only way a value fails to be a string
        text += ": the value is not valid UTF-8"
    elif "conversion error" in text and column is not None:
        text += f" (the type {full.field(column).type} was inferred from the first MiB; pass dtypes={{{column!r}: ...}} if it is wrong)"
    return text, column


read_csv = CsvSource
