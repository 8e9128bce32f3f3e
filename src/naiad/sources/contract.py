"""What a file format supplies: the small contract a reader implements, and the plain data it reads.

NOTE [ Format contract ]
A source is a format (this module's :class:`SourceFormat`) joined to the block-reading engine
(:class:`~naiad.sources.engine.BlockEngine`) by :class:`~naiad.sources.base.Source`. A new kind
of source subclasses ``Source``, calls its initialiser (``Source.__init__``: the files, the bad
rows policy, the storage) and writes three methods:

- ``_read_schema()``: the output schema (after column selection and dtypes), from metadata or a
  sample;
- ``_file_blocks(path)``: one file cut into :class:`Block` s with exact row counts;
- ``_read(block, lo, hi, use_threads)``: rows ``lo:hi`` of a block as columns, a
  :class:`BlockData`, skipping or raising on bad rows as ``on_bad_rows`` says.

Everything else is the engine's: the cached schema and block list (files cut side by side on
threads, or counted beside the first reads), parsed blocks kept across epochs, read groups,
scattered rows for a resume, the row counts the plan needs. What the planner must know of a
format beyond its blocks is one value, its :class:`SourceTraits` (NOTE [ Source traits ]). A
format may do more where it can do it cheaper, each optional and each with a default that is
always right:

- ``_early_cut(path)`` and ``early_rows(block)`` (or ``early_block(block)``): the blocks before
  their rows are counted, so reads start beside the count (NOTE [ Early reads ] in
  naiad/stream/early.py), with ``SourceTraits.early_cut``; default: no early cut.
- ``_group_table(parts, use_threads)``: several whole reads of local files as one Arrow table
  (one decode call); default None, read one by one.
- ``_read_group(parts, use_threads)`` and ``_read_rows_many(parts, use_threads)``: a read group,
  or a resume's scattered rows, in one parse (the line formats); the engine's defaults read part
  by part.
- ``parsed_bytes()``: the size of its parsed blocks, kept when ``SourceTraits.keeps_parsed``.
- ``sample_bytes()``: about how many bytes a row holds when that is far more than its schema
  says (an image, a clip, a ragged row of tokens): the default shuffle buffer is sized by it;
  default None.

A format may use from the engine ``schema()``, ``blocks()`` and ``local_bytes()``, and the
options set by ``Source.__init__``: ``paths``, ``storage``, ``on_bad_rows``. Nothing here is
called per row: a read is a block or a range of one. A source made of another source (its reads
transformed) is a :class:`~naiad.sources.wrapper.FormatWrapper`, not a format (NOTE [ Format
wrappers ] in sources/wrapper.py).

NOTE [ Source traits ]
The planner, the stream and the tools ask a source a few questions its blocks do not answer:
are its blocks the file's own parts, how early may a pass read, how are its rows keyed, are its
parsed blocks kept, what does a block's ``first_line`` count. The answers are one frozen value,
``source.traits`` (:class:`SourceTraits`), set by the format (a class attribute, or per source
where an option changes an answer) and read by every consumer; a wrapper derives its own from
the source it wraps (:meth:`~naiad.sources.wrapper.FormatWrapper.wrap_traits`), so a tokenized
tar source plans as the tar source does. They change the plan (``reads_before_count`` and
``blocks_from_metadata`` choose block runs or single blocks, and the default buffer), so a
format's traits are part of what a state resumes: changing one changes the order of its passes.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError
from naiad.sources.columns import Columns

if TYPE_CHECKING:
    from naiad.sources.storage import Storage

__all__ = [
    "Block",
    "BlockData",
    "GroupPart",
    "OnBadRows",
    "SourceFormat",
    "SourceTraits",
    "bad_entry",
    "default_block_rows",
]


OnBadRows = Literal["raise", "skip"]


class Block(NamedTuple):
    """One unit of reading: plain data, so it pickles cheaply and prints clearly in errors.

    Attributes:
        path: the file.
        start: first byte (text formats), row group / record batch index, or first row (npy).
        stop: end of the byte range, index + 1, or end row (npy); -1 means the whole file.
        rows: number of rows (samples) in the block.
        first_line: 1-based line of the block's first line (text formats) or 0-based row of its
            first row in the file (columnar formats); used in error messages.
    """

    path: str
    start: int
    stop: int
    rows: int
    first_line: int


GroupPart = tuple[Block, int, int, "np.ndarray | None"]
"""One read of a group: (block, lo, hi, take) as in :class:`~naiad.stream.plan.ReadTask`."""


class BlockData(NamedTuple):
    """What a worker returns for one task: the columns, and the rows it skipped as bad.

    Attributes:
        columns: the rows read, less the skipped ones.
        bad: one entry per skipped row (``on_bad_rows="skip"``), in order: ``{"at": its position
            among the rows asked for, "file": path, "line": 1-based line (text formats) or
            "row": 0-based row (columnar formats) or sample, "key": a sample's key (readers of
            samples), "column": name (when known), "reason": str}``.
            A skipped row keeps its position, so a resume can place every row (NOTE [ Bad rows
            keep their positions ] in naiad/stream/ledger.py).
    """

    columns: Columns
    bad: tuple[dict[str, Any], ...] = ()

    @property
    def bad_rows(self) -> int:
        """How many rows were skipped."""
        return len(self.bad)


def default_block_rows(file_rows: int, file_bytes: int, source_bytes: int | None) -> int:
    """Rows per block of a file of ``file_rows`` rows in ``file_bytes`` bytes, for a source of
    ``source_bytes`` (None: the file alone): about 1/4096 of the source's rows, estimated from
    its bytes at this file's bytes per row, between 1,024 and 65,536 (as
    ``lines.default_block_bytes`` for text)."""
    rows = file_rows
    if source_bytes and file_bytes > 0:
        rows = file_rows * source_bytes // file_bytes
    return int(min(1 << 16, max(1 << 10, rows // 4096)))


def bad_entry(at: int, path: str, reason: str, *, line: int | None = None, row: int | None = None,
              column: str | None = None, key: str | None = None) -> dict[str, Any]:
    """One skipped row for :attr:`BlockData.bad` (``line`` for text formats, ``row`` for others,
    ``key`` for a sample of a shard; each only when known)."""
    out: dict[str, Any] = {"at": at, "file": path}
    for name, value in (("line", line), ("row", row), ("key", key), ("column", column)):
        if value is not None:
            out[name] = value
    out["reason"] = reason
    return out


@dataclass(frozen=True)
class SourceTraits:
    """What the planner, the stream and the tools know of a source besides its blocks (NOTE [
    Source traits ]). Every field defaults to what a format that says nothing does.

    Attributes:
        blocks_from_metadata: the blocks are the file's own parts, read from its metadata (row
            groups, record batches) rather than cut to a size: they may be large (see
            ``stream.default_buffer_rows``), their rows are known from a footer
            (``Source.known_rows``), and a resume reads each of them once.
        early_cut: the format cuts a file into blocks before their rows are counted
            (``_early_cut``, ``early_block``), so a fresh pass on one rank may read beside the
            count (NOTE [ Early reads ] in naiad/stream/early.py).
        reads_before_count: a fresh pass on one rank reads before the rows are counted whatever
            the source's size: counting its rows costs far more than the first reads need (a
            walk of every tar shard's headers); else only sources of ``early.EARLY_MIN_BYTES``
            or more do. Such a source's plan permutes single blocks (NOTE [ Block runs ]).
        keys_by_file: a row's key, the ``__index__`` a worker-side transform keys its randomness
            by (NOTE [ Decode in the workers ] in pipeline.py), is its file's number times 2**32
            plus its row in that file (``stream.reads.FileRowKeys``): known from its block alone
            (its ``first_line``), so those reads need no count either; else it is the row's
            number in the source, which needs every block counted.
        keeps_parsed: the format keeps its parsed blocks across epochs by default, when they fit
            the budget: parsing costs far more than reading (NOTE [ Kept blocks ] in
            sources/decoded.py).
        line_numbers: a block's ``first_line`` is the 1-based line of its first row in a text
            file (one row a line), which errors name; else it is the 0-based row (or sample) of
            its first row in the file.
    """

    blocks_from_metadata: bool = False
    early_cut: bool = False
    reads_before_count: bool = False
    keys_by_file: bool = False
    keeps_parsed: bool = False
    line_numbers: bool = False

    def __post_init__(self) -> None:
        if self.reads_before_count and not self.early_cut:
            raise ConfigError("SourceTraits(reads_before_count=True) needs early_cut=True: reads before the count "
                              "read the blocks the early cut gives.")


_OLD_FLAGS = frozenset(("blocks_from_metadata", "reads_before_count", "keys_by_file", "keeps_parsed"))


class SourceFormat(ABC):
    """The contract a file format implements (NOTE [ Format contract ]): its schema, its blocks,
    and a read of a block's rows. The optional hooks here default to "cannot"; the engine
    (:class:`~naiad.sources.engine.BlockEngine`) does the rest.

    Attributes:
        paths: the files (local paths or URLs), in the order they are planned.
        storage: how remote files are reached (docs/STORAGE.md).
        on_bad_rows: "raise" (a :class:`~naiad.SourceError`) or "skip" (each skipped row a
            :func:`bad_entry` in :attr:`BlockData.bad`).
        traits: what the planner knows of the format besides its blocks (NOTE [ Source traits ]):
            a class attribute of the format, or a source's own where an option changes it.
    """

    paths: list[str]
    storage: Storage
    on_bad_rows: OnBadRows
    traits: SourceTraits = SourceTraits()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A format written before the traits set the planner's flags as class attributes: they
        # still count, for a release, folded into its traits.
        super().__init_subclass__(**kwargs)
        old = {name: cls.__dict__[name] for name in _OLD_FLAGS if name in cls.__dict__}
        if old:
            warnings.warn(f"{cls.__name__}: the class flags {sorted(old)} are deprecated; set "
                          f"traits = SourceTraits({', '.join(f'{k}={v!r}' for k, v in sorted(old.items()))}) instead.",
                          DeprecationWarning, stacklevel=2)
            folded = {k: bool(v) for k, v in old.items()}
            if folded.get("reads_before_count"):
                folded["early_cut"] = True
            cls.traits = replace(cls.traits, **folded)

    # -- what every format provides ----------------------------------------------------------

    @abstractmethod
    def _read_schema(self) -> pa.Schema:
        """The output schema (after column selection and dtypes), from metadata or a sample."""

    @abstractmethod
    def _file_blocks(self, path: str) -> list[Block]:
        """Cut one file into blocks with exact row counts."""

    @abstractmethod
    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        """Rows ``lo:hi`` of ``block`` (row positions counted before any bad row is skipped)."""

    # -- what a format may provide where it can do it cheaper --------------------------------

    def _early_cut(self, path: str) -> list[Block] | None:
        """``path``'s blocks before their rows are counted, where the format can cut it so (a
        format that does says ``SourceTraits(early_cut=True)``)."""
        return None

    def early_rows(self, block: Block) -> int:
        """The rows of a block of ``early_blocks()``, counted alone as ``blocks()`` would."""
        raise NotImplementedError(f"{type(self).__name__} has no early blocks")

    def early_block(self, block: Block) -> Block:
        """A block of ``early_blocks()`` with its rows counted alone, as ``blocks()`` would count
        them (and its ``first_line`` where the format knows it from the block's file alone)."""
        return block._replace(rows=self.early_rows(block))

    def sample_bytes(self) -> int | None:
        """About the bytes one row holds in memory, where its values are bytes of their own
        (images, audio) and so far more than the schema's width says; None: the schema's width
        holds (``columns.row_bytes``). What the default shuffle buffer is sized by
        (``stream.default_buffer_rows``), known without counting every file."""
        return None

    def _group_table(self, parts: list[GroupPart], use_threads: bool) -> pa.Table | None:
        """The rows of several whole-range reads of local files, in order, as one Arrow table in
        the file's types, when this reader can read them together cheaper than one by one (one
        decode call, zero-copy slices); None to read them one by one (also when one of them
        fails: that path names the block)."""
        return None
