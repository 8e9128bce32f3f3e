"""Plain text files, one sample per line (blank lines are samples too)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources.base import Source
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits, bad_entry
from naiad.sources.index import IndexDir, check_index_dir
from naiad.sources.lines import (
    CutArgs,
    LineBlocks,
    block_bytes_for,
    parse_group_lines,
    parse_selected_lines,
    read_block_bytes,
    slice_rows,
)
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.paths import PathLike

__all__ = ["TextSource", "read_text"]


class TextSource(LineBlocks, Source):
    """A lazy source over text files, cut into byte-range blocks of whole lines: each line
    (without its newline) is one sample: ``naiad.read_text``.

    Args:
        paths, on_bad_rows, index_dir, storage: as every reader takes them
            (:class:`~naiad.Source`).
        column: the name of the one column of the batches.
        encoding: "utf-8" (checked; a line that is not UTF-8 is a bad row) or "latin-1".
        compression: "infer" from the extension, a codec name or None (one block per file).
        block_bytes: the size of a block, the unit of reading and of block shuffling
            (None: about 1/4096 of the source's local files together, or of each remote file,
            between 64 KiB and 4 MiB; see ``lines.default_block_bytes``).
        keep_parsed_bytes: the most memory for the lines kept across epochs as Python strings
            in the process that reads them, so later epochs split nothing (None: 1/16 of the
            memory, at most 1 GiB; 0: keep nothing). Counted as the text's bytes and 88 bytes
            a line; all or nothing (NOTE [ Kept blocks ] in naiad/sources/decoded.py).

    Example:
        >>> ds = naiad.read_text("corpus/*.txt")  # doctest: +SKIP
        >>> next(iter(naiad.DataLoader(ds, batch_size=2)))["text"]  # doctest: +SKIP
        ['first line', 'second line']
    """

    reader_name = "read_text"
    traits = SourceTraits(early_cut=True, keeps_parsed=True, line_numbers=True)

    def __init__(
        self,
        paths: PathLike,
        *,
        column: str = "text",
        encoding: str = "utf-8",
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
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf8", "latin-1", "latin1", "iso-8859-1"):
            raise ConfigError(f"`encoding` must be 'utf-8' or 'latin-1', got {encoding!r}.")
        self.column = column
        self.utf8 = encoding.lower().startswith("utf")
        self.compression = compression
        self.block_bytes = block_bytes
        self.index_dir = check_index_dir(index_dir)

    def _read_schema(self) -> pa.Schema:
        return pa.schema([(self.column, pa.string())])

    def parsed_bytes(self) -> int:
        """The lines as Python strings: their bytes, and 88 a line (a string object's header of
        49-74 bytes, its slot in the kept object array, the allocator's rounding). A compressed
        file's bytes are not known before it is read: 256 a line there."""
        return sum(b.stop - b.start + 88 * b.rows if b.stop >= 0 else 256 * b.rows for b in self.blocks())

    def _cut_args(self, path: str) -> CutArgs:
        return CutArgs(block_bytes=block_bytes_for(path, self.block_bytes, self.local_bytes(), self.storage), header_lines=0,
                       compression=self.compression, keep_blank=True, whole=False, index_dir=self.index_dir)

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        buf, line0 = slice_rows(read_block_bytes(block, self.compression, self.storage), lo, hi, block.rows, keep_blank=True)
        if hi == lo:
            return BlockData({self.column: []})
        return self._split_lines(buf, line0, block)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        data = parse_group_lines(parts, self.compression, True, lambda buf, n: self._split_lines(buf, 0, parts[0][0]), self.storage)
        return data if data is not None else super()._read_group(parts, use_threads)

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        data = parse_selected_lines(
            parts, self.compression, True, lambda buf, n: self._split_lines(buf, 0, parts[0][0]), self.storage,
        )
        return data if data is not None else super()._read_rows_many(parts, use_threads)

    def _split_lines(self, buf: bytes, line0: int, block: Block) -> BlockData:
        """The lines of ``buf`` (whole lines, the first at line ``line0`` of the block)."""
        import pyarrow.compute as pc  # on first use: its import is a third of naiad's
        if buf.endswith(b"\n"):
            buf = buf[:-1]
        if not self.utf8:
            lines = pa.array([buf.decode("latin-1")]) if buf else pa.array([""])
            split = pc.split_pattern(lines, "\n").flatten()
            return BlockData({self.column: pc.utf8_rtrim(split, "\r").to_pylist()})
        # Split as binary (vectorised), then check UTF-8 for the whole block at once.
        binary = pc.split_pattern(pa.array([buf], pa.binary()), b"\n").flatten()
        skipped: tuple[dict[str, Any], ...] = ()
        try:
            strings = binary.cast(pa.string())
        except pa.ArrowInvalid:
            ok = _utf8_mask(binary)
            bad = np.flatnonzero(~ok)
            if self.on_bad_rows == "raise":
                raise SourceError("the line is not valid UTF-8 (pass encoding='latin-1'?).",
                                  path=block.path, line=block.first_line + line0 + int(bad[0])) from None
            strings = pc.filter(binary, pa.array(ok)).cast(pa.string())
            skipped = tuple(bad_entry(i, block.path, "the line is not valid UTF-8", line=block.first_line + line0 + i)
                            for i in bad.tolist())
        strings = pc.utf8_rtrim(strings, "\r")
        return BlockData({self.column: strings.to_pylist()}, skipped)


def _utf8_mask(binary: pa.Array) -> np.ndarray:
    """Which lines are valid UTF-8 (only called once a block is known to have a bad one)."""
    out = np.ones(len(binary), bool)
    for i, v in enumerate(binary.to_pylist()):  # error path only: the block already failed
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            out[i] = False
    return out


read_text = TextSource
