"""The external shuffle of ``naiad convert --shuffle``: a seeded global permutation of any number
of rows in bounded memory.

NOTE [ External shuffle ]
Every row gets a 64-bit key, a hash of (seed, its position in the input): SplitMix64 of
``state + (position + 1) * golden gamma``, a bijection of the position, so keys never collide,
and pseudo-random, so sorting by them is a uniformly random permutation. The output is the rows
sorted by key, computed in two passes:

1. *Scatter*: the input is read a chunk at a time (about ``memory_bytes / 4`` of rows); each
   row goes to bucket ``key >> (64 - bits)`` of ``K = 2**bits`` temporary Arrow IPC files (LZ4),
   with its key; one stable argsort per chunk groups the rows by bucket.
2. *Gather*: each bucket in turn is read whole, sorted by key and written out. Buckets are key
   ranges in ascending order, so bucket after bucket is the global order.

The order depends only on the seed and the input's rows: not on ``memory_bytes``, the bucket
count or how the input was cut into blocks. ``K`` is the smallest power of two that makes the
expected bucket a quarter of ``memory_bytes`` (from the first chunk's Arrow bytes per row times
the row count). Peak memory is then one chunk and its reordered copy in pass 1, one bucket and
its sorted copy in pass 2: about ``memory_bytes / 2``, and a bucket larger than its expectation
by a factor of two is improbable past a few thousand rows per bucket. The temporary files take
about the data's size in LZ4-compressed Arrow on disk, in a private folder (``mkdtemp``) that is
removed at the end, also after an error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError

__all__ = ["KEY_COLUMN", "BucketSpill", "bucket_count", "row_keys"]

KEY_COLUMN = "__naiad_shuffle_key__"

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MAX_BUCKETS = 4096


def seed_state(seed: int) -> np.uint64:
    """The 64-bit SplitMix64 state for ``seed`` (through a SeedSequence: nearby seeds differ)."""
    return np.uint64(np.random.SeedSequence([seed, 0x6E616961]).generate_state(1, np.uint64)[0])


def row_keys(positions: np.ndarray, state: np.uint64) -> np.ndarray:
    """The shuffle keys of the rows at ``positions`` (int64, 0-based in the input): SplitMix64."""
    with np.errstate(over="ignore"):
        z = (positions.astype(np.uint64) + np.uint64(1)) * _GAMMA + state
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def bucket_count(estimated_bytes: float, memory_bytes: int) -> int:
    """The power of two that makes the expected bucket a quarter of ``memory_bytes``.

    Raises:
        ConfigError: more buckets than open files allow; the fix is a larger ``memory_bytes``.
    """
    need = max(1, math.ceil(estimated_bytes / max(1, memory_bytes // 4)))
    buckets = 1 << (need - 1).bit_length()
    limit = min(_MAX_BUCKETS, _open_file_limit() - 64)
    if buckets > limit:
        raise ConfigError(
            f"shuffling about {estimated_bytes / 2**30:.1f} GiB within --memory {memory_bytes / 2**30:.2f} GiB needs "
            f"{buckets} temporary files open at once, more than the limit {limit}; give a larger --memory "
            "(or raise `ulimit -n`)."
        )
    return buckets


def _open_file_limit() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return int(soft) if soft > 0 else 1 << 16
    except (ImportError, OSError, ValueError):
        return 1024


class BucketSpill:
    """Pass 1 and 2 of NOTE [ External shuffle ]: ``scatter`` chunks into ``buckets`` files in
    ``folder``, then ``tables()`` hands each bucket back sorted by key (and deletes it)."""

    def __init__(self, folder: str, schema: pa.Schema, buckets: int, seed: int) -> None:
        self.folder = folder
        self.buckets = buckets
        self.schema = schema.append(pa.field(KEY_COLUMN, pa.uint64()))
        self._state = seed_state(seed)
        self._shift = np.uint64(64 - (buckets.bit_length() - 1))
        self._writers: dict[int, tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}
        codec = "lz4" if pa.Codec.is_available("lz4") else None
        self._options = pa.ipc.IpcWriteOptions(compression=codec)
        self.bytes_written = 0
        self._closed = False

    def _path(self, bucket: int) -> str:
        return os.path.join(self.folder, f"bucket-{bucket:05d}.arrows")

    def scatter(self, batch: pa.RecordBatch, positions: np.ndarray) -> None:
        """Append ``batch``'s rows (at input ``positions``) to their buckets, with their keys."""
        if batch.num_rows == 0:
            return
        keys = row_keys(positions, self._state)
        if self.buckets == 1:
            bucket = np.zeros(len(keys), np.int64)
        else:
            bucket = (keys >> self._shift).astype(np.int64)
        order = np.argsort(bucket, kind="stable")
        keyed = pa.RecordBatch.from_arrays([*batch.columns, pa.array(keys)], schema=self.schema)
        grouped = keyed.take(pa.array(order))
        counts = np.bincount(bucket, minlength=self.buckets)
        start = 0
        for b in np.flatnonzero(counts).tolist():
            n = int(counts[b])
            self._writer(b).write_batch(grouped.slice(start, n))
            start += n

    def _writer(self, bucket: int) -> pa.ipc.RecordBatchStreamWriter:
        entry = self._writers.get(bucket)
        if entry is None:
            sink = pa.OSFile(self._path(bucket), "wb")
            entry = self._writers[bucket] = (sink, pa.ipc.new_stream(sink, self.schema, options=self._options))
        return entry[1]

    def close(self) -> None:
        """Finish every bucket file (end of pass 1)."""
        if self._closed:
            return
        self._closed = True
        for sink, writer in self._writers.values():
            writer.close()
            self.bytes_written += sink.tell()
            sink.close()

    def tables(self) -> Iterator[pa.Table]:
        """Each bucket's rows in key order, without the key; its file is removed once read."""
        self.close()
        for b in range(self.buckets):
            if b not in self._writers:
                continue
            path = self._path(b)
            with pa.OSFile(path, "rb") as f:
                table = pa.ipc.open_stream(f).read_all()
            os.unlink(path)
            keys = table.column(KEY_COLUMN).to_numpy()
            table = table.drop_columns([KEY_COLUMN]).take(pa.array(np.argsort(keys, kind="stable")))
            yield table
