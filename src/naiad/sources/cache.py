"""The local cache of remote byte ranges: fetched once, then read from disk.

NOTE [ Block cache ]
A source over URLs given ``cache_dir=`` keeps every byte range it fetches from an object (a
text block, a Parquet row group's column chunks, a footer, an Arrow record batch, an ``.npy``
row range) as one file under ``<cache_dir>/blocks``, so a later epoch, a resume, another worker
or another rank on the machine reads it from disk, and works while the server is unreachable.

*Keys.* An entry's name is a hash of (the endpoint, the URL, the object's size, its ETag or
else its modification time, the byte range). The identity is the one recorded when the source
was made, so a source made after an object changed never meets the old object's bytes: they
sit under another key until evicted. The readers ask for the same ranges for the same block
(a text block's range comes from its cut; PyArrow reads a row group's selected column chunks
as the same coalesced ranges), so one block read by several workers or ranks is one entry.
An object with neither an ETag nor a modification time is not cached (its bytes could not be
told from a later version's).

*Writes.* An entry is written to a temporary file in its folder and renamed into place
(``os.replace``), so a reader sees a whole entry or none; its length is checked on every read,
so a file cut short (a crash, a full disk) is a miss, removed, never data.

*One download per entry.* The first process (or thread) to miss an entry creates
``<entry>.lock`` with ``O_CREAT | O_EXCL`` and fetches; the others wait for the entry to appear
(polling) and read it. A lock older than ``LOCK_STALE_S`` (its holder died, or its fetch is
still retrying) is removed and the waiter fetches itself: a rare second download of the same
bytes, harmless since both writes are whole and equal.

*Chunks.* Small reads of an object (text blocks of 64 KiB: one range request each costs a
round trip and, on a busy server, milliseconds of its time) go through aligned chunks of
``CHUNK_BYTES`` instead, when the source's objects fit in half of ``cache_bytes``: a missing
chunk is fetched whole (one request for 128 such blocks) and kept, and a block is one
``pread`` inside it. The newline scan of a text object reads it through the same chunks, so
the bytes it reads once are the first epoch's too. A shuffled first epoch then fetches each
chunk once, in the order its blocks are first asked for, and the rest of the object's blocks
are hits. When the objects do not fit, chunks would be evicted before their other blocks are
read, so each block is its own entry.

*Eviction.* A hit sets the entry's modification time to now (access times are unreliable:
``noatime``, ``relatime``), so modification times order the entries by last use. Each process
counts what it writes; when its count says the cache may be past ``cache_bytes`` (and after
every eighth of ``cache_bytes`` written, to see other processes' writes) it lists the cache and
removes the least recently used entries until the total is under 90% of ``cache_bytes``.
Removal is an ``unlink``: a process that has the entry open reads it to the end (POSIX keeps
the data until the last descriptor closes), one that opens it after gets a miss and fetches
again. ``cache_bytes`` is a soft bound: entries being written by several processes at once may
pass it for a moment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

from naiad.errors import ConfigError
from naiad.process_state import ProcessLocal, per_process

__all__ = ["CHUNK_BYTES", "BlockCache", "CacheDir", "CacheStats", "block_cache", "cache_key", "cache_stats", "resolve_cache_dir", "user_cache_dir"]

CacheDir = Union[str, "os.PathLike[str]", Literal["auto"], None]
"""Where remote byte ranges are cached: a folder, "auto" (naiad's user cache folder), or None
(no cache)."""

CHUNK_BYTES = 8 << 20
"""The aligned chunks through which small reads go when the objects fit (NOTE [ Block cache ])."""

LOCK_STALE_S = 60.0
"""A lock file older than this is taken to be a dead or stuck fetch's."""

_LOW_WATER = 0.9  # eviction goes down to this share of cache_bytes, so it is not run per write
_TEMP_STALE_S = 3600.0  # a temporary file this old is a killed writer's


def user_cache_dir() -> Path:
    """naiad's cache folder: ``$NAIAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/naiad``, else ``~/.cache/naiad``."""
    env = os.environ.get("NAIAD_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "naiad"


def resolve_cache_dir(cache_dir: CacheDir, cache_bytes: int | None) -> str | None:
    """The cache folder as an absolute path (None: no cache), checking both arguments."""
    if cache_bytes is not None and (isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 1):
        raise ConfigError(f"`cache_bytes` must be an int >= 1 or None, got {cache_bytes!r}.")
    if cache_dir is None:
        if cache_bytes is not None:
            raise ConfigError("`cache_bytes` bounds the cache in `cache_dir`; pass cache_dir= too (a folder or 'auto').")
        return None
    if cache_dir == "auto":
        return str((user_cache_dir() / "remote").absolute())
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise ConfigError(f"`cache_dir` must be a folder, 'auto' or None, got {cache_dir!r}.")
    return os.path.abspath(os.fspath(cache_dir))


def cache_key(where: str, url: str, size: int, version: str, start: int, stop: int) -> str:
    """The entry name of bytes ``start:stop`` of one version of an object (NOTE [ Block cache ])."""
    text = json.dumps([where, url, size, version, start, stop])
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass
class CacheStats:
    """What this process's cache did: entries read from disk, fetched, written, removed."""

    hits: int = 0
    misses: int = 0
    waits: int = 0
    bytes_fetched: int = 0
    evicted: int = 0


class BlockCache:
    """Byte ranges on local disk, shared by the processes of a machine (NOTE [ Block cache ]).

    Args:
        folder: the cache folder (entries go under ``folder/blocks``).
        max_bytes: the soft bound on the entries' total size; None: half the disk's free space
            when the cache is opened.
    """

    def __init__(self, folder: str, max_bytes: int | None) -> None:
        self.root = Path(folder) / "blocks"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.root).free
            self.usable = True
        except OSError:
            free, self.usable = 0, False  # a folder that cannot be made: every read fetches
        self.max_bytes = max_bytes if max_bytes is not None else max(free // 2, 1)
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._known: int | None = None  # the total at the last listing, plus what we wrote since
        self._since_listing = 0
        self._written = 0  # bytes this object has written, ever: what a listing in progress misses
        self._evicting = threading.Lock()  # one eviction at a time; a write meanwhile is counted

    def path(self, key: str) -> Path:
        """Where entry ``key`` lives."""
        return self.root / key[:2] / key[2:]

    def get(self, key: str, nbytes: int, start: int = 0, stop: int | None = None) -> bytes | None:
        """Bytes ``start:stop`` (default: all) of the entry if it is there and whole (``nbytes``
        long), its use time set to now; else None. One ``pread``, so a small block inside a big
        chunk costs its own bytes (NOTE [ Block cache ], chunks)."""
        stop = nbytes if stop is None else stop
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there never blocks the read
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
                self._remove(path)  # cut short, or not a file: never data
                return None
            data = os.pread(fd, stop - start, start)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) != stop - start:
            return None
        try:
            os.utime(path)
        except OSError:
            pass  # evicted since: the bytes read are still whole
        return data

    def holds(self, total: int) -> bool:
        """Whether ``total`` bytes fit comfortably (half the bound): worth fetching whole chunks."""
        return self.usable and total <= self.max_bytes // 2

    def get_or_fetch(self, key: str, nbytes: int, fetch: Callable[[], bytes], start: int = 0,
                     stop: int | None = None) -> bytes:
        """Bytes ``start:stop`` (default: all) of the entry, which is fetched whole and stored by
        one process when missing (the others wait)."""
        data = self.get(key, nbytes, start, stop)
        if data is not None:
            self._count(hits=1)
            return data
        if not self.usable or nbytes > self.max_bytes:
            self._count(misses=1, fetched=nbytes)
            return fetch()[start:stop]
        path = self.path(key)
        lock = path.with_name(path.name + ".lock")
        waited = False
        while True:
            try:
                path.parent.mkdir(exist_ok=True)
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                waited = True
                if not self._wait(lock):
                    _remove_if_older(lock, LOCK_STALE_S)
                data = self.get(key, nbytes, start, stop)
                if data is not None:
                    self._count(hits=1, waits=1)
                    return data
                continue  # the holder failed or went stale: take the lock
            except OSError:
                self._count(misses=1, fetched=nbytes)
                return fetch()[start:stop]  # a read-only or full disk: no cache, still the bytes
            try:
                data = self.get(key, nbytes, start, stop)  # written between our miss and our lock
                if data is not None:
                    self._count(hits=1, waits=int(waited))
                    return data
                data = fetch()
                self._count(misses=1, fetched=len(data))
                self._write(path, data)
                return data[start:stop]
            finally:
                os.close(fd)
                self._remove(lock)

    def _wait(self, lock: Path) -> bool:
        """Wait while ``lock`` is held; False when it went stale first."""
        pause = 0.005
        while True:
            try:
                age = time.time() - os.stat(lock).st_mtime
            except OSError:
                return True  # released
            if age > LOCK_STALE_S:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _write(self, path: Path, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                self._remove(Path(tmp))
                raise
        except OSError:
            return  # a full disk: the bytes are still returned
        with self._lock:
            self._written += len(data)
            self._since_listing += len(data)
            if self._known is not None:
                self._known += len(data)
            due = self._known is None or self._known > self.max_bytes or self._since_listing > self.max_bytes // 8
        if due:
            self.evict()

    def evict(self) -> None:
        """List the cache; past ``max_bytes``, remove the least recently used entries down to 90%
        of it (and temporary files and locks left by killed processes). While one thread lists,
        another's write does not start a second listing: the bytes written meanwhile are added
        to the listing's total, and a total still past ``max_bytes`` lists again."""
        if not self._evicting.acquire(blocking=False):
            return  # the eviction in progress counts this write at its end
        try:
            while True:
                with self._lock:
                    written = self._written
                total, removed = self._evict_once()
                with self._lock:
                    late = self._written - written  # written during the listing, maybe not in it
                    self._known, self._since_listing = total + late, late
                    self.stats.evicted += removed
                    again = late and self._known > self.max_bytes
                if not again:
                    return
        finally:
            self._evicting.release()

    def _evict_once(self) -> tuple[int, int]:
        """One listing and the removals it calls for: the total left and the entries removed."""
        entries: list[tuple[float, int, str]] = []
        now = time.time()
        try:
            folders = [d.path for d in os.scandir(self.root) if d.is_dir(follow_symlinks=False)]
        except OSError:
            return 0, 0
        for folder in folders:
            try:
                listing = list(os.scandir(folder))
            except OSError:
                continue
            for e in listing:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if e.name.startswith(".tmp-") or e.name.endswith(".lock"):
                    if now - st.st_mtime > _TEMP_STALE_S:
                        self._remove(Path(e.path))
                    continue
                entries.append((st.st_mtime, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        removed = 0
        if total > self.max_bytes:
            target = int(self.max_bytes * _LOW_WATER)
            for _, size, path in sorted(entries):
                if total <= target:
                    break
                if self._remove(Path(path)):
                    total -= size
                    removed += 1
        return total, removed

    def total_bytes(self) -> int:
        """The entries' total size on disk now (a listing)."""
        total = 0
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            for e in os.scandir(folder):
                if not (e.name.startswith(".tmp-") or e.name.endswith(".lock")):
                    try:
                        total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        return total

    def _count(self, hits: int = 0, misses: int = 0, waits: int = 0, fetched: int = 0) -> None:
        with self._lock:
            self.stats.hits += hits
            self.stats.misses += misses
            self.stats.waits += waits
            self.stats.bytes_fetched += fetched

    @staticmethod
    def _remove(path: Path) -> bool:
        try:
            os.unlink(path)
            return True
        except OSError:
            return False


def _remove_if_older(path: Path, age_s: float) -> None:
    try:
        if time.time() - os.stat(path).st_mtime > age_s:
            os.unlink(path)
    except OSError:
        pass  # gone already, or taken by another waiter


# (folder, max_bytes) -> the cache; per process, like the filesystems (a forked worker makes its
# own, with its own counts: NOTE [ Per-process state ]).
_CACHES: ProcessLocal[dict[tuple[str, int | None], BlockCache]] = per_process("naiad.sources.cache block caches", dict)


def block_cache(folder: str, max_bytes: int | None) -> BlockCache:
    """This process's :class:`BlockCache` over ``folder``."""
    caches, key = _CACHES.get(), (folder, max_bytes)
    cache = caches.get(key)
    if cache is None:
        with _CACHES.lock:
            cache = caches.get(key)
            if cache is None:
                cache = caches[key] = BlockCache(folder, max_bytes)
    return cache


def cache_stats(folder: str | os.PathLike[str]) -> CacheStats:
    """This process's counts for the cache over ``folder``, summed (for tests and benchmarks)."""
    where, out = os.path.abspath(os.fspath(folder)), CacheStats()
    for (f, _), cache in list(_CACHES.get().items()):
        if f == where:
            for name in ("hits", "misses", "waits", "bytes_fetched", "evicted"):
                setattr(out, name, getattr(out, name) + getattr(cache.stats, name))
    return out
