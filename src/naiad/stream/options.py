"""How a stream is read: :class:`StreamOptions` (the loader builds them from its arguments), the
default shuffle buffer (:func:`default_buffer_rows`) and :class:`StreamCounters` (what a stream
records for the loader's stats)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from naiad.errors import ConfigError
from naiad.sources.base import Source
from naiad.sources.columns import row_bytes
from naiad.stream.ledger import BadRowLedger

__all__ = [
    "BUFFER_BYTES_BUDGET",
    "DEFAULT_SHUFFLE_BUFFER_ROWS",
    "FEW_BLOCKS",
    "MIN_SAMPLE_BUFFER_ROWS",
    "Batch",
    "Imap",
    "StreamCounters",
    "StreamOptions",
    "default_buffer_rows",
]

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 17
"""131,072 rows: about 9 MB for ten float64 columns; raise it for better mixing on big data."""

BUFFER_BYTES_BUDGET = 256 << 20
"""The most memory a default shuffle buffer grows to for a source in big blocks, or of samples."""

MIN_SAMPLE_BUFFER_ROWS = 64
"""The fewest rows a default buffer of big samples holds (64 photos of 2 MB: 128 MB)."""

FEW_BLOCKS = 256
"""Below this many blocks, a source read from metadata whose rows fit ``BUFFER_BYTES_BUDGET`` is
shuffled whole (see :func:`default_buffer_rows`): about 200 blocks leave the stratified block
order a correlation of 0.02 with the file's, fewer more."""


def default_buffer_rows(source: Source, *, decoded_bytes: int | None = None) -> int:
    """The shuffle buffer a stream gets when none is given.

    ``DEFAULT_SHUFFLE_BUFFER_ROWS``, or, for a source whose blocks metadata describes and may be
    big (Parquet row groups, Arrow record batches: ``pq.write_table`` writes groups of 1 Mi
    rows), room for two of its largest blocks, up to about 256 MiB of rows. A buffer smaller
    than a block hands out a block's rows nearly in file order (measured with 1 Mi-row groups and
    the 131,072-row buffer: correlation of epoch position with row number 0.996, batch span
    0.065); two blocks' worth mixes them (bench/RESULTS.md, "Defaults").

    Such a source with fewer than ``FEW_BLOCKS`` blocks whose rows all fit in the same 256 MiB
    gets room for every row: a full permutation. Few blocks leave the block order close to the
    file's whatever it is (31 row groups of 64 Ki rows, two of them in the buffer: correlation
    -0.042, batch span 0.916), and the whole table costs no more memory than the budget already
    allows one big block.

    A source of samples (images, audio, ragged rows of tokens: ``Source.sample_bytes()``, known
    without counting every file) gets what fits the same 256 MiB at its bytes per row, between ``MIN_SAMPLE_BUFFER_ROWS``
    and ``DEFAULT_SHUFFLE_BUFFER_ROWS``: 131,072 ImageNet JPEGs would hold 14 GB (WebDataset's
    default buffer is 1,000 samples; this is about 2,400 of 110 KB). Samples decoded before the
    buffer (``decoded_bytes`` each: NOTE [ Small samples decode in the reads ] in decode.py) count
    at the larger of their two sizes.
    """
    samples = source.sample_bytes() if decoded_bytes is None else max(source.sample_bytes() or 0, decoded_bytes)
    width = max(row_bytes(source.schema()), samples or 0, 1)
    if not source.traits.blocks_from_metadata:
        if samples is None:
            return DEFAULT_SHUFFLE_BUFFER_ROWS
        return int(max(MIN_SAMPLE_BUFFER_ROWS, min(DEFAULT_SHUFFLE_BUFFER_ROWS, BUFFER_BYTES_BUDGET // width)))
    blocks = source.blocks()
    biggest = max((b.rows for b in blocks), default=0)
    cap = BUFFER_BYTES_BUDGET // width
    total = sum(b.rows for b in blocks)
    floor = DEFAULT_SHUFFLE_BUFFER_ROWS if samples is None else min(
        DEFAULT_SHUFFLE_BUFFER_ROWS, max(MIN_SAMPLE_BUFFER_ROWS, cap))
    if len(blocks) < FEW_BLOCKS and total <= cap:
        return int(max(floor, total))
    return int(max(floor, min(2 * biggest, cap)))


Batch = dict[str, Any]
Imap = Callable[[Iterable[Any]], Iterator[Any]]


@dataclass(frozen=True)
class StreamOptions:
    """How to stream a source (the loader builds this from its own arguments).

    Attributes:
        batch_size: rows per batch.
        shuffle: permute blocks per (seed, epoch) and pass rows through the shuffle buffer.
        seed: the base of every random draw.
        shuffle_buffer: buffer capacity in rows (None: ``DEFAULT_SHUFFLE_BUFFER_ROWS``; the
            loader first replaces None by :func:`default_buffer_rows` of its source).
        drop_last: yield only full batches (the same number on every rank).
        rank: this process's rank (None: from torch.distributed when initialised, else 0).
        world_size: number of ranks (None: from torch.distributed when initialised, else 1).
        transform: called on every whole batch dict (after conversion to tensors).
        index_column: when set, every batch carries this int64 column, each sample's key
            (``reads.row_keys``: its row number in the source, its blocks in source order, or
            its file's number and its row in the file), read beside its columns, and
            ``__epoch__`` (NOTE [ Decode in the workers ] in pipeline.py).
    """

    batch_size: int = 1
    shuffle: bool = False
    seed: int = 0
    shuffle_buffer: int | None = None
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    transform: Callable[[Batch], Any] | None = None
    index_column: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"`batch_size` must be an int >= 1, got {self.batch_size!r}.")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ConfigError(f"`shuffle_buffer` must be >= 1, got {self.shuffle_buffer}.")
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError(f"give both `rank` and `world_size` or neither, got rank={self.rank}, world_size={self.world_size}.")
        if self.world_size is not None and self.rank is not None and not 0 <= self.rank < self.world_size:
            raise ConfigError(f"`rank` must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}.")

    @property
    def buffer_rows(self) -> int:
        """The shuffle buffer's capacity in rows."""
        return self.shuffle_buffer or DEFAULT_SHUFFLE_BUFFER_ROWS

    def topology(self) -> tuple[int, int]:
        """(rank, world_size): as given, else torch.distributed's when initialised, else (0, 1)."""
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def with_topology(self) -> StreamOptions:
        """These options with the rank and world size read now, once (see :meth:`topology`).

        A pass plans with the topology it began on: a state taken after
        ``torch.distributed.destroy_process_group()`` (as a script's last checkpoint often is)
        still names the world size the pass was planned with, not the 1 read there.
        """
        rank, world_size = self.topology()
        return replace(self, rank=rank, world_size=world_size)


@dataclass
class StreamCounters:
    """What a stream records for the loader's stats; updated in the calling process.

    Attributes:
        ledger: the rows skipped by ``on_bad_rows="skip"`` in yielded batches.
    """

    ledger: BadRowLedger = field(default_factory=BadRowLedger)

    @property
    def bad_rows(self) -> int:
        """Rows skipped by ``on_bad_rows="skip"``."""
        return self.ledger.total

    @property
    def bad_rows_by_file(self) -> dict[str, int]:
        """Rows skipped, per file."""
        return self.ledger.by_file()
