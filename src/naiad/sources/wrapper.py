"""A source made of another: its plan the inner source's, its reads the inner's, transformed.

NOTE [ Format wrappers ]
Some sources are another source read differently: ``TokenizedSource`` (naiad/tokens/text.py) is
a text source whose reads come back tokenized. Every question the planner asks of such a source
(its blocks and their counts, the count beside the first reads, the early cut, its traits, its
size in bytes and rows, its keys) must get the inner source's answer, or the plan changes under
it: a wrapper that answered with a new format's defaults planned block runs over tar shards
whose own plan permutes single blocks, and counted the files a second time. So a wrapper has no
engine state of its own: :class:`FormatWrapper` answers each of those questions with the inner
source's (its cached blocks, its count, its kept blocks), derives its traits from the inner's
(:meth:`FormatWrapper.wrap_traits`), and turns each of the inner's reads into its own
(:meth:`FormatWrapper.transform`). A wrapper writes at most three things: ``_read_schema``
(when its reads change the columns), ``transform`` and ``wrap_traits`` (when its reads change
what a trait says). tests/unit/test_wrapper_parity.py asks every wrapper and its inner source
every planner question over several formats, and checks that each public method of a source is
answered here or derived from what is.

A transform sees one read at a time, a pure function of the block and the rows asked, as the
inner's reads are: what depends on the pass (its epoch, its seed: a random crop) is not a
wrapper's to do (NOTE [ Small samples decode in the reads ] in naiad/stream/decode.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from naiad.sources.base import Source
from naiad.sources.columns import Columns
from naiad.sources.contract import Block, BlockData, GroupPart, SourceTraits
from naiad.sources.decoded import KeptBlocks

__all__ = ["Asked", "FormatWrapper"]

Asked = Callable[[], list[tuple[Block, int]]]
"""The rows a read asked for, in order, as ``(block, row in the block)``, a skipped row's too:
called only where a transform needs them (to name a row in an error)."""


class FormatWrapper(Source):
    """A source over ``inner`` whose planning is the inner's and whose reads are the inner's,
    transformed (NOTE [ Format wrappers ]). Its files, bad rows policy and storage are the
    inner's; the base itself transforms nothing (a wrapper class overrides :meth:`transform`).

    Attributes:
        inner: the source wrapped.
    """

    def __init__(self, inner: Source) -> None:
        super().__init__(inner.paths, on_bad_rows=inner.bad_rows, storage=inner.storage, expand=False)
        self.inner = inner
        self.traits = self.wrap_traits(inner.traits)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    # -- what a wrapper may write -------------------------------------------------------------

    def wrap_traits(self, traits: SourceTraits) -> SourceTraits:
        """This wrapper's traits from the inner source's: the same, unless its reads change what
        one of them says."""
        return traits

    def transform(self, data: BlockData, asked: Asked) -> BlockData:
        """One of the inner's reads as this wrapper's: ``data``, the inner's read (its columns,
        its skipped rows), and ``asked()``, the rows it asked for. The default: as it is."""
        return data

    def _read_schema(self) -> pa.Schema:
        return self.inner.schema()

    # -- the planner's questions: the inner's answers -----------------------------------------

    def _file_blocks(self, path: str) -> list[Block]:
        return [b for b in self.inner.blocks() if b.path == path]

    def blocks(self) -> list[Block]:
        """The inner source's blocks (counted once, there)."""
        return self.inner.blocks()

    def count_threads(self) -> int:
        """The inner source's."""
        return self.inner.count_threads()

    def count_beside(self) -> None:
        """The inner source's count, started beside the reads."""
        self.inner.count_beside()

    def counted(self) -> bool:
        """Whether the inner source's rows are counted."""
        return self.inner.counted()

    def early_blocks(self) -> list[Block] | None:
        """The inner source's early blocks."""
        return self.inner.early_blocks()

    def early_rows(self, block: Block) -> int:
        """The inner source's count of an early block."""
        return self.inner.early_rows(block)

    def early_block(self, block: Block) -> Block:
        """An early block as the inner source counts it."""
        return self.inner.early_block(block)

    def prepare(self) -> None:
        """The inner source's blocks and schema, at once; then this wrapper's schema."""
        self.inner.prepare()
        self.schema()

    def kept_blocks(self) -> KeptBlocks | None:
        """None: the inner source keeps its parsed blocks, and this wrapper reads through it."""
        return None

    def keep_nothing(self) -> None:
        """The inner source keeps nothing (a process worker's copy)."""
        self.inner.keep_nothing()

    def parsed_bytes(self) -> int:
        """The inner source's."""
        return self.inner.parsed_bytes()

    def sample_bytes(self) -> int | None:
        """The inner source's."""
        return self.inner.sample_bytes()

    def local_bytes(self) -> int | None:
        """The inner source's."""
        return self.inner.local_bytes()

    def known_rows(self) -> int | None:
        """The inner source's."""
        return self.inner.known_rows()

    def __len__(self) -> int:
        """The inner source's rows."""
        return len(self.inner)

    def empty_columns(self) -> Columns:
        """The inner source's, where this wrapper keeps its columns; else from this schema."""
        if self.schema().equals(self.inner.schema()):
            return self.inner.empty_columns()
        return super().empty_columns()

    # -- the reads: the inner's, transformed --------------------------------------------------

    def read_block(self, block: Block, lo: int = 0, hi: int | None = None, *, use_threads: bool = False) -> BlockData:
        """The inner source's read of rows ``lo:hi`` of ``block``, transformed."""
        data = self.inner.read_block(block, lo, hi, use_threads=use_threads)
        stop = block.rows if hi is None else hi
        return self.transform(data, lambda: [(block, r) for r in range(lo, stop)])

    def read_group(self, parts: Sequence[GroupPart], *, use_threads: bool = False) -> BlockData:
        """The inner source's read of a group, transformed."""
        data = self.inner.read_group(parts, use_threads=use_threads)
        return self.transform(data, lambda: [(b, int(r)) for b, lo, hi, take in parts
                                             for r in (range(lo, hi) if take is None else lo + np.asarray(take))])

    def read_rows_many(self, parts: Sequence[tuple[Block, np.ndarray]], *, use_threads: bool = False) -> BlockData:
        """The inner source's read of scattered rows, transformed."""
        data = self.inner.read_rows_many(parts, use_threads=use_threads)
        return self.transform(data, lambda: [(b, int(r)) for b, rows in parts for r in rows])

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        return self.read_block(block, lo, hi, use_threads=use_threads)
