"""The member index of a tar shard: where each sample's members lie, found once by its headers.

NOTE [ Member index ]
A WebDataset shard is a plain tar: 512-byte headers, each followed by its member's bytes padded
to 512. It has no table of contents, so the only way to know where sample ``k`` is, or how many
samples a shard holds, is to walk its headers from the start (Python's ``tarfile``, which also
reads the pax and GNU long-name headers that ``tar`` and ``webdataset.TarWriter`` may write). The
walk is the one per-member loop of the format, done once per shard; its result is a few NumPy
arrays (:class:`ShardIndex`): per sample its key and the byte span of its members, per
extension each sample's member offset and size. A block read is then one range read of a
run of samples and slices of it, a resume or a worker goes straight to its samples, and a
remote shard is read by ranges like a local one.

Members group into samples as WebDataset groups them (``webdataset.tariterators``): regular
files only; names ``__*__`` (metadata) are skipped; the key is the name up to the first dot of
its base name (folders included), the extension the rest, lower-cased; consecutive members with
the same key are one sample; a name without a dot is skipped. Two members of one sample with
the same extension mark the sample bad (WebDataset raises on it), read as ``on_bad_rows`` says.

The index is kept like the block index (NOTE [ Block index ] in index.py): an ``.npz`` of plain
arrays (never a pickle) in the index folder, keyed by the file's path and identity (size and
modification time; an object's ETag), so another process, rank, worker or epoch loads it instead
of walking the headers again (a remote shard's walk downloads it once). A stored index is data:
it is checked (sizes agree, offsets ascend inside the file) before use, else the shard is walked
again; and every read checks that it got the bytes it asked for.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import SourceError
from naiad.sources import storage
from naiad.sources.index import IndexDir, load_arrays, save_arrays

__all__ = ["ShardIndex", "load_or_scan", "scan_shard"]

INDEX_PARAMS: Mapping[str, Any] = {"kind": "tar-members", "version": 1}

# webdataset.tariterators.base_plus_ext: the key is the name up to the first dot of the base name.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


@dataclass(frozen=True)
class ShardIndex:
    """Where the samples of one tar shard lie (NOTE [ Member index ]).

    Attributes:
        size: the shard's bytes.
        exts: the extensions found in the shard, in order of first appearance.
        starts: per sample, the offset of its first member's header (ascending).
        ends: per sample, the end of its last member's bytes.
        offsets: ``[len(exts), samples]``: each sample's member of that extension, its first
            byte (-1: the sample has none).
        sizes: the same members' sizes.
        key_ends: per sample, the end of its key in ``key_bytes`` (UTF-8, one after another).
        key_bytes: the keys.
        flags: per sample, 0, or 1 when two of its members share an extension.
    """

    size: int
    exts: tuple[str, ...]
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    key_ends: np.ndarray
    key_bytes: np.ndarray
    flags: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def keys(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The keys of samples ``rows`` (all: None) as an object array of str (no loop here)."""
        offsets = np.concatenate(([0], self.key_ends)).astype(np.int64)
        arr = pa.Array.from_buffers(pa.large_string(), len(self), [None, pa.py_buffer(offsets), pa.py_buffer(self.key_bytes)])
        if rows is not None:
            arr = arr.take(pa.array(rows, pa.int64()))
        return arr.to_numpy(zero_copy_only=False)

    def key(self, row: int) -> str:
        """The key of sample ``row``."""
        lo = int(self.key_ends[row - 1]) if row else 0
        return bytes(self.key_bytes[lo:int(self.key_ends[row])]).decode("utf-8", "replace")

    def ext_row(self, ext: str) -> int:
        """The row of ``offsets`` for ``ext``, or -1 when no sample of the shard has one."""
        return self.exts.index(ext) if ext in self.exts else -1

    def member_bytes(self) -> int:
        """The bytes of every sample's members together."""
        return int(self.sizes.sum())

    def arrays(self) -> dict[str, np.ndarray]:
        """What is stored (:func:`~naiad.sources.index.save_arrays`)."""
        return {
            "exts": np.array(self.exts if self.exts else [""], dtype=str)[: len(self.exts)],
            "starts": self.starts, "ends": self.ends, "offsets": self.offsets, "sizes": self.sizes,
            "key_ends": self.key_ends, "key_bytes": self.key_bytes, "flags": self.flags,
        }

    @classmethod
    def from_arrays(cls, a: Mapping[str, Any], size: int) -> ShardIndex | None:
        """An index from stored arrays, or None when they are not a plausible index of a file of
        ``size`` bytes (NOTE [ Member index ]: a stored index is data)."""
        try:
            exts = tuple(str(e) for e in np.asarray(a["exts"]).tolist())
            starts, ends = np.asarray(a["starts"]), np.asarray(a["ends"])
            offsets, sizes = np.asarray(a["offsets"]), np.asarray(a["sizes"])
            key_ends, key_bytes, flags = np.asarray(a["key_ends"]), np.asarray(a["key_bytes"]), np.asarray(a["flags"])
        except (KeyError, TypeError, ValueError):
            return None
        n = len(starts)
        if not all(x.dtype == np.int64 for x in (starts, ends, offsets, sizes, key_ends)):
            return None
        if key_bytes.dtype != np.uint8 or flags.dtype != np.int8 or len(set(exts)) != len(exts):
            return None
        if ends.shape != (n,) or key_ends.shape != (n,) or flags.shape != (n,) or offsets.shape != (len(exts), n) or sizes.shape != offsets.shape:
            return None
        if n and (starts[0] < 0 or np.any(np.diff(starts) <= 0) or np.any(ends[:-1] > starts[1:]) or ends[-1] > size
                  or np.any(ends <= starts)):
            return None
        have = offsets >= 0
        if np.any(sizes < 0) or np.any(offsets[have] < np.broadcast_to(starts, offsets.shape)[have]) or np.any(
                (offsets + sizes)[have] > np.broadcast_to(ends, offsets.shape)[have]):
            return None
        if n and (key_ends[0] < 0 or np.any(np.diff(key_ends) < 0) or key_ends[-1] != len(key_bytes)):
            return None
        return cls(size, exts, starts, ends, offsets, sizes, key_ends, key_bytes, flags)


def scan_shard(path: str, store: storage.Storage | None = None) -> ShardIndex:
    """Walk the headers of the tar shard ``path`` (local or remote) into its :class:`ShardIndex`.

    Raises:
        SourceError: the file is not a tar, or is cut short (a member runs past its end).
    """
    size = storage.size(path, store=store)
    keys: list[bytes] = []
    starts: list[int] = []
    ends: list[int] = []
    members: list[tuple[int, int, int, int]] = []  # (sample, ext, offset, size)
    ext_ids: dict[str, int] = {}
    flags: list[int] = []
    seen: set[int] = set()
    current: str | None = None
    try:
        # A remote shard streams through 8 MiB range reads past the block cache: its blocks are
        # read as other ranges (NOTE [ Block cache ]).
        with storage.open_input(path, 8 << 20, store=store, cached=False) as f:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                while True:
                    info = tar.next()
                    if info is None:
                        break
                    tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every member; the index is what is kept
                    if info.offset_data + info.size > size:
                        raise SourceError(
                            f"the tar is cut short: member {info.name!r} needs bytes up to "
                            f"{info.offset_data + info.size:,}, the file has {size:,}; is the shard truncated?",
                            path=path)
                    name = info.name
                    if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")) or _META.match(name):
                        continue
                    m = _KEY_EXT.match(name)
                    if m is None:
                        continue
                    key, ext = m.group(1), m.group(2).lower()
                    e = ext_ids.setdefault(ext, len(ext_ids))
                    if key != current:
                        current = key
                        keys.append(key.encode("utf-8", "surrogateescape"))
                        starts.append(info.offset)
                        ends.append(info.offset_data + info.size)
                        flags.append(0)
                        seen = set()
                    if e in seen:
                        flags[-1] = 1
                        continue
                    seen.add(e)
                    ends[-1] = info.offset_data + info.size
                    members.append((len(keys) - 1, e, info.offset_data, info.size))
                # tarfile ends quietly at a header it cannot read past the first one: a shard cut
                # inside a header, or a damaged one, ends where the end-of-archive marker (a
                # zero block) should be, and it is checked there.
                f.seek(tar.offset)
                end = f.read(512)
                if len(end) < 512 or any(end):
                    what = "cut short" if len(end) < 512 else "damaged"
                    raise SourceError(f"the tar is {what} at byte {tar.offset:,} of {size:,} (no end-of-archive "
                                      "marker after the last member read); is the shard truncated?", path=path)
    except tarfile.TarError as exc:
        raise SourceError(f"not a readable tar ({exc}); is the shard truncated or damaged?", path=path) from None
    n = len(keys)
    offsets = np.full((len(ext_ids), n), -1, np.int64)
    sizes = np.zeros((len(ext_ids), n), np.int64)
    if members:
        m_arr = np.array(members, np.int64)
        offsets[m_arr[:, 1], m_arr[:, 0]] = m_arr[:, 2]
        sizes[m_arr[:, 1], m_arr[:, 0]] = m_arr[:, 3]
    lens = np.fromiter(map(len, keys), np.int64, count=n)
    return ShardIndex(
        size, tuple(ext_ids), np.array(starts, np.int64), np.array(ends, np.int64), offsets, sizes,
        np.cumsum(lens).astype(np.int64), np.frombuffer(b"".join(keys), np.uint8).copy(), np.array(flags, np.int8),
    )


def load_or_scan(path: str, index_dir: IndexDir, store: storage.Storage | None = None) -> ShardIndex:
    """The shard's index: the stored one when it still describes the file, else walked now and
    stored for the next process (NOTE [ Member index ])."""
    stored = load_arrays(index_dir, path, INDEX_PARAMS, store)
    if stored is not None:
        index = ShardIndex.from_arrays(stored, int(stored["__size__"]))
        if index is not None:
            return index
    index = scan_shard(path, store)
    save_arrays(index_dir, path, INDEX_PARAMS, index.arrays(), store)
    return index
