"""The member index of a tar shard: where each sample's members lie, found once by its headers.

NOTE [ Member index ]
A WebDataset shard is a plain tar: 512-byte headers, each followed by its member's bytes padded
to 512. It has no table of contents, so the only way to know where sample ``k`` is, or how many
samples a shard holds, is to walk its headers from the start (NOTE [ Header walk ] in
tarwalk.py: the pax and GNU long-name headers that ``tar`` and ``webdataset.TarWriter`` write
included, ``tarfile`` where a shard needs it). The walk is the one per-member loop of the
format, done once per shard; its result is a few NumPy
arrays (:class:`ShardIndex`): per sample its key and the byte span of its members, per
extension each sample's member offset and size. A block read is then one range read of a
run of samples and slices of it, a resume or a worker goes straight to its samples, and a
remote shard is read by ranges like a local one.

Members group into samples as WebDataset groups them (``webdataset.tariterators``): regular
files only; names ``__*__`` (metadata) are skipped; the key is the name up to the first dot of
its base name (folders included), the extension the rest, lower-cased; consecutive members with
the same key are one sample; a name without a dot is skipped. Two members of one sample with
the same extension mark the sample bad (WebDataset raises on it), read as ``on_bad_rows`` says.

The indexes are kept like the block index (NOTE [ Block index ] in index.py), one file for all
the shards of a source (``index.save_table``: an ``.npz`` of plain arrays, never a pickle, in
the index folder, keyed by the shards' paths in order), written once every shard is indexed
(``keep_indexes``), when any had to be walked. Each shard's part records the shard's identity
(size and modification time; an object's ETag) taken before its walk, so another process,
rank, worker or epoch reads one file instead of walking a thousand shards, and a changed
shard alone is walked again (a remote shard's walk downloads it once). A kept index is data:
each shard's part is checked (sizes agree, offsets ascend inside the file) before use, all
shards at once when the file is read (:class:`KeptIndexes`), else that shard is walked again;
and every read checks that it got the bytes it asked for. One file a source, not one a
shard: a thousand ``.npz`` files took 0.6 s to read (and 0.4 s to write), the one file a few
milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.sources import storage
from naiad.sources.index import (
    Identity,
    IndexDir,
    TableFile,
    load_table,
    save_table,
    table_file,
    table_stamp,
)
from naiad.sources.samples import indices
from naiad.sources.tarwalk import Member, walk_members
from naiad.trust.paths import decode_names, encode_name

__all__ = ["KeptIndexes", "ShardIndex", "index_members", "keep_indexes", "scan_shard", "table_of"]

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
        arr = pa.Array.from_buffers(pa.large_binary(), len(self), [None, pa.py_buffer(offsets), pa.py_buffer(self.key_bytes)])
        if rows is not None:
            arr = arr.take(indices(rows))
        return decode_names(arr)  # NOTE [ Names as bytes ] in naiad/trust/paths.py

    def key(self, row: int) -> str:
        """The key of sample ``row``, as :meth:`keys` gives it."""
        lo = int(self.key_ends[row - 1]) if row else 0
        return bytes(self.key_bytes[lo:int(self.key_ends[row])]).decode("utf-8", "surrogateescape")

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
    """Walk the headers of the tar shard ``path`` (local or remote) into its :class:`ShardIndex`
    (NOTE [ Header walk ] in tarwalk.py).

    Raises:
        SourceError: the file is not a tar, or is cut short (a member runs past its end).
    """
    size = storage.size(path, store=store)
    # A remote shard streams through 8 MiB range reads past the block cache: its blocks are
    # read as other ranges (NOTE [ Block cache ]).
    with storage.open_input(path, 8 << 20, store=store, cached=False) as f:
        members, _ = walk_members(f, size, path)
    return index_members(members, size)


def index_members(members: list[Member], size: int) -> ShardIndex:
    """The index of a shard of ``size`` bytes from its walked members: grouped into samples as
    WebDataset groups them (NOTE [ Member index ]). The one loop per member of the format."""
    keys: list[bytes] = []
    starts: list[int] = []
    ends: list[int] = []
    picked: list[tuple[int, int, int, int]] = []  # (sample, ext, offset, size)
    ext_ids: dict[str, int] = {}
    flags: list[int] = []
    seen: set[int] = set()
    current: str | None = None
    for name, offset, offset_data, n, regular in members:
        if not regular or ("/" not in name and name.startswith("__") and name.endswith("__")) or _META.match(name):
            continue
        m = _KEY_EXT.match(name)
        if m is None:
            continue
        key, ext = m.group(1), m.group(2).lower()
        e = ext_ids.setdefault(ext, len(ext_ids))
        if key != current:
            current = key
            keys.append(encode_name(key))
            starts.append(offset)
            ends.append(offset_data + n)
            flags.append(0)
            seen = set()
        if e in seen:
            flags[-1] = 1
            continue
        seen.add(e)
        ends[-1] = offset_data + n
        picked.append((len(keys) - 1, e, offset_data, n))
    count = len(keys)
    offsets = np.full((len(ext_ids), count), -1, np.int64)
    sizes = np.zeros((len(ext_ids), count), np.int64)
    if picked:
        m_arr = np.array(picked, np.int64)
        offsets[m_arr[:, 1], m_arr[:, 0]] = m_arr[:, 2]
        sizes[m_arr[:, 1], m_arr[:, 0]] = m_arr[:, 3]
    lens = np.fromiter(map(len, keys), np.int64, count=count)
    return ShardIndex(
        size, tuple(ext_ids), np.array(starts, np.int64), np.array(ends, np.int64), offsets, sizes,
        np.cumsum(lens).astype(np.int64), np.frombuffer(b"".join(keys), np.uint8).copy(), np.array(flags, np.int8),
    )


TABLE_PARAMS: Mapping[str, Any] = {"kind": "tar-members", "version": 2}


class KeptIndexes:
    """The member indexes kept for a source's shards, all in one file (NOTE [ Member index ]).

    Made by :meth:`load` (an empty one when nothing is kept). The stored arrays are data: each
    shard's part is checked as :meth:`ShardIndex.from_arrays` checks one index, for all shards
    at once when the file is read (a shard whose part fails is walked again); :meth:`get` gives
    a shard's index while the shard is the one it was made from."""

    def __init__(self, paths: Sequence[str] = (), idents: Sequence[Any] = (), arrays: Mapping[str, np.ndarray] | None = None,
                 stamp: tuple[int, int] | None = None) -> None:
        self.stamp = stamp  # the file's (size, modification time) when it was read
        self._where: dict[str, int] = {}
        self._idents = list(idents)
        try:
            self._check(len(paths), dict(arrays or {}))
        except (KeyError, ValueError, TypeError, IndexError):
            return
        self._where = {path: i for i, path in enumerate(paths)}

    def __len__(self) -> int:
        """The shards it holds a readable part for."""
        return len(self._where)

    def _check(self, count: int, a: dict[str, np.ndarray]) -> None:
        """Take the arrays of ``count`` shards, and mark which shards' parts are plausible (else
        raise: the whole file is unreadable)."""
        samples, exts, key_lengths = np.asarray(a["samples"]), np.asarray(a["ext_counts"]), np.asarray(a["key_lengths"])
        starts, ends, key_ends = np.asarray(a["starts"]), np.asarray(a["ends"]), np.asarray(a["key_ends"])
        offsets, sizes = np.asarray(a["offsets"]), np.asarray(a["sizes"])
        key_bytes, flags, names = np.asarray(a["key_bytes"]), np.asarray(a["flags"]), np.asarray(a["exts"])
        ints = (samples, exts, key_lengths, starts, ends, key_ends, offsets, sizes)
        if not all(x.dtype == np.int64 and x.ndim == 1 for x in ints) or key_bytes.dtype != np.uint8 or flags.dtype != np.int8:
            raise ValueError("not a table of member indexes")
        if (samples.shape != (count,) or exts.shape != (count,) or key_lengths.shape != (count,) or np.any(samples < 0)
                or np.any(exts < 0) or np.any(key_lengths < 0)):
            raise ValueError("not a table of these shards")
        rows = np.concatenate(([0], np.cumsum(samples)))
        members = np.concatenate(([0], np.cumsum(samples * exts)))
        total = int(rows[-1])
        if not (len(starts) == len(ends) == len(key_ends) == len(flags) == total and len(offsets) == len(sizes) == members[-1]
                and len(names) == int(exts.sum()) and len(self._idents) == count):
            raise ValueError("arrays of other lengths")
        key_at = np.concatenate(([0], np.cumsum(key_lengths)))
        if key_at[-1] != len(key_bytes):
            raise ValueError("keys of another length")
        size = np.array([i[1] if isinstance(i, list) and len(i) == 3 and type(i[1]) is int else -1 for i in self._idents], np.int64)
        shard = np.repeat(np.arange(count), samples)
        bad = key_lengths != np.where(samples > 0, key_ends[np.maximum(rows[1:] - 1, 0)] if total else 0, 0)
        # What from_arrays checks of one index: samples ascend inside their file, keys' ends
        # ascend, each member lies inside its sample.
        bad[shard[(starts < 0) | (ends <= starts) | (ends > size[shard]) | (key_ends < 0)]] = True
        same = shard[1:] == shard[:-1]
        bad[shard[1:][same & ((starts[1:] <= starts[:-1]) | (ends[:-1] > starts[1:]) | (key_ends[1:] < key_ends[:-1]))]] = True
        owner = np.repeat(np.arange(count), samples * exts)
        row = rows[:-1][owner] + (np.arange(len(offsets)) - members[:-1][owner]) % np.maximum(samples[owner], 1)
        have = offsets >= 0
        bad[owner[(sizes < 0) | (have & ((offsets < starts[row]) | (offsets + sizes > ends[row])))]] = True
        self._arrays = {"starts": starts, "ends": ends, "offsets": offsets, "sizes": sizes, "key_ends": key_ends,
                        "key_bytes": key_bytes, "flags": flags, "exts": names}
        self._rows, self._members, self._key_at = rows, members, key_at
        self._ext_at = np.concatenate(([0], np.cumsum(exts)))
        self._ok = ~bad

    @classmethod
    def load(cls, where: TableFile | None, paths: Sequence[str]) -> KeptIndexes:
        """What is kept for the shards ``paths`` (in this order) in the table file ``where``
        (:func:`table_of`; None: nothing is kept)."""
        stamp = None if where is None else table_stamp(where)
        stored = load_table(where) if where is not None and stamp is not None else None
        if stored is None:
            return cls(stamp=stamp)
        idents, arrays = stored
        return cls(paths, idents, arrays, stamp)

    def outdated(self, where: TableFile | None) -> bool:
        """Whether the file was written again since it was read (a process that indexed every
        shard kept them while this one was reading: worth reading again)."""
        now = None if where is None else table_stamp(where)
        return now is not None and now != self.stamp

    def get(self, path: str, now: Identity | None) -> ShardIndex | None:
        """Shard ``path``'s kept index, when it was made from the shard as it is ``now`` (its
        identity) and is a plausible index of it; else None (walk it again)."""
        i = self._where.get(path)
        if i is None or now is None or not self._ok[i] or self._idents[i] != [now[0], now[1], now[2]]:
            return None
        a = self._arrays
        lo, hi = int(self._rows[i]), int(self._rows[i + 1])
        m0, m1 = int(self._members[i]), int(self._members[i + 1])
        exts = tuple(str(e) for e in a["exts"][self._ext_at[i]:self._ext_at[i + 1]].tolist())
        if len(set(exts)) != len(exts):
            return None
        shape = (len(exts), hi - lo)
        return ShardIndex(now[1], exts, a["starts"][lo:hi], a["ends"][lo:hi], a["offsets"][m0:m1].reshape(shape),
                          a["sizes"][m0:m1].reshape(shape), a["key_ends"][lo:hi],
                          a["key_bytes"][self._key_at[i]:self._key_at[i + 1]], a["flags"][lo:hi])


def table_of(index_dir: IndexDir, paths: Sequence[str], store: storage.Storage | None = None) -> TableFile | None:
    """Where the member indexes of the shards ``paths`` (in this order) are kept, or None."""
    return table_file(index_dir, paths, TABLE_PARAMS, store)


def keep_indexes(where: TableFile | None, idents: Sequence[Identity | None], indexes: Sequence[ShardIndex]) -> None:
    """Keep the member indexes of the table's shards in one file for the next process, each
    with the shard's identity from before its walk (NOTE [ Member index ]); best effort."""
    if where is None:
        return
    parts = [index.arrays() for index in indexes]
    arrays = {
        "samples": np.array([len(index) for index in indexes], np.int64),
        "ext_counts": np.array([len(index.exts) for index in indexes], np.int64),
        "key_lengths": np.array([len(index.key_bytes) for index in indexes], np.int64),
        "exts": np.array([e for index in indexes for e in index.exts] or [""], dtype=str)[: sum(len(i.exts) for i in indexes)],
    }
    for name in ("starts", "ends", "key_ends", "key_bytes", "flags", "offsets", "sizes"):
        arrays[name] = np.concatenate([p[name].ravel() for p in parts]) if parts else np.zeros(0, np.int64)
    save_table(where, idents, arrays)
