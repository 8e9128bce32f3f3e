"""Where the bytes live: local files, or objects behind fsspec URLs (``s3://``, ``gs://``, ...).

Every reader goes through this seam for three things: finding files (a path, a glob, a URL or a
URL glob), reading a byte range, and opening a file for PyArrow. A local path keeps the exact
code path it had before (``open``/``seek``/``read``, memory maps); a URL goes to the fsspec
filesystem of its protocol, one range request per read.

NOTE [ Remote files in workers ]
A source crosses into each worker by pickle, and a live filesystem holds sockets, an event loop
thread and credentials caches that must not cross. So a source keeps a :class:`Storage`: plain
data (the ``storage_options``, the retry policy, the cache settings, each object's size and
ETag), and every read of a remote file names the Storage it goes through (the ``store=`` of the
functions below): the source's own. Nothing maps a URL to a Storage, so two sources of one URL
with other options, retries or caches each read with theirs, in the process that made them and
in every worker. The first read in a process builds the filesystem for (protocol, options) and
keeps it for every Storage of those options, as this process's (NOTE [ Per-process state ]): a
forked worker never reuses its parent's connections, and sources that share options share one.

With ``cache_dir=`` every range read goes through the local block cache first (NOTE [ Block
cache ] in cache.py), keyed by the identity recorded here; small reads go through its aligned
chunks when the objects fit, and a newline scan then fills those chunks (else it bypasses the
cache: its ranges are not what blocks read).
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, TypeVar

import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.process_state import ProcessLocal, per_process
from naiad.sources.cache import (
    CHUNK_BYTES,
    BlockCache,
    CacheDir,
    block_cache,
    cache_key,
    resolve_cache_dir,
)
from naiad.sources.retries import RetryPolicy, retrying
from naiad.trust.paths import URL_RE, is_remote, is_url, local_path

__all__ = [
    "ObjectInfo", "RangeFile", "RetryPolicy", "Storage", "input_stream", "is_remote", "is_url", "local_path",
    "needs_store", "object_info", "object_path", "open_input", "read_range", "size", "stat",
]

T = TypeVar("T")


# protocol -> the extra that installs its filesystem
EXTRAS = {
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
    "abfss": "azure", "adl": "azure", "http": "http", "https": "http",
}


class ObjectInfo(NamedTuple):
    """What identifies one version of an object: its size and ETag (or modification time); and
    whether it is one (``is_file``: a prefix, or folder, is not)."""

    size: int
    etag: str | None
    mtime: str | None
    is_file: bool = True


# (protocol, options as JSON) -> filesystem, this process's (NOTE [ Per-process state ])
_FILESYSTEMS: ProcessLocal[dict[tuple[str, str], Any]] = per_process("naiad.sources.storage filesystems", dict)

Cached = bool | Literal["chunks"]
"""How a read uses the block cache: True (when there is one), False (never), "chunks"."""


class Storage:
    """Where a source's bytes live and how they are fetched: the filesystem's options, the retry
    policy, the local cache of remote byte ranges (docs/STORAGE.md). A reader's ``storage=``.

    Plain data, so it pickles; the filesystem is rebuilt in each process (NOTE [ Remote files
    in workers ]). A source keeps its own copy (:meth:`of`), in which it records the size and
    ETag of each object it lists, so one Storage may be given to many readers.

    Args:
        options: passed to the fsspec filesystem (``key``/``secret``, ``anon``,
            ``endpoint_url``, ``client_kwargs``...); None: credentials from the usual places.
        retry: the retry policy for transient errors (None: ``RetryPolicy()``, NOTE [ Retries ]).
        cache_dir: where fetched byte ranges are kept on local disk (a folder, or "auto":
            naiad's user cache folder), shared by the workers and processes of the machine, so
            later epochs read them locally; None: no cache (NOTE [ Block cache ] in cache.py).
        cache_bytes: the cache's soft bound in bytes, least recently used entries evicted past
            it; None: half the disk's free space when the cache is first used.

    Example:
        >>> Storage({"anon": True}, cache_dir=None)
        Storage(options=['anon'])
    """

    def __init__(
        self, options: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None, *,
        cache_dir: CacheDir = None, cache_bytes: int | None = None,
    ) -> None:
        if options is not None and not isinstance(options, Mapping):
            raise ConfigError(f"`options` (the filesystem's storage_options) must be a dict, got {type(options).__name__}.")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"`retry` must be a naiad RetryPolicy, got {type(retry).__name__}.")
        self.options: dict[str, Any] = dict(options or {})
        self.retry = retry or RetryPolicy()
        self.cache_dir = resolve_cache_dir(cache_dir, cache_bytes)
        self.cache_bytes = cache_bytes
        self.infos: dict[str, ObjectInfo] = {}
        client = self.options.get("client_kwargs")
        # Which server: the same bucket and key on two endpoints are two objects.
        self.endpoint = str(self.options.get("endpoint_url") or (client.get("endpoint_url") if isinstance(client, Mapping) else "") or "")
        try:
            self._key = json.dumps(self.options, sort_keys=True, default=repr)
        except (TypeError, ValueError):
            self._key = repr(sorted(self.options.items()))

    @classmethod
    def of(cls, storage: Storage | Mapping[str, Any] | None) -> Storage:
        """A source's own Storage from a reader's ``storage=``: a copy of a Storage (with the
        objects it has listed: ``naiad.read`` hands over the files it found), a dict of
        filesystem options, or None (the defaults).

        Raises:
            ConfigError: anything else.
        """
        if isinstance(storage, Storage):
            return storage.copy()
        if storage is None or isinstance(storage, Mapping):
            return cls(storage)
        raise ConfigError(f"`storage` must be a naiad.Storage or a dict (the filesystem's storage_options), "
                          f"got {type(storage).__name__}.")

    def copy(self) -> Storage:
        """The same settings and the objects recorded so far, recorded apart from here on."""
        out = copy.copy(self)
        out.infos = dict(self.infos)
        out.__dict__.pop("_total", None)
        return out

    def __repr__(self) -> str:
        # The options' names only: their values are credentials as often as not.
        parts = [f"options={sorted(self.options)}"] if self.options else []
        if self.retry != RetryPolicy():
            parts.append(f"retry={self.retry!r}")
        if self.cache_dir is not None:
            parts.append(f"cache_dir={self.cache_dir!r}")
        if self.cache_bytes is not None:
            parts.append(f"cache_bytes={self.cache_bytes}")
        return f"Storage({', '.join(parts)})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_total", None)  # derived from infos (_chunks_fit)
        return state

    # -- filesystems -------------------------------------------------------------------------

    def filesystem(self, url: str) -> Any:
        """The fsspec filesystem for ``url``'s protocol in this process (built once per process)."""
        protocol = _protocol(url)
        made, key = _FILESYSTEMS.get(), (protocol, self._key)
        fs = made.get(key)
        if fs is None:  # two threads may build one at once: the first kept is every later read's
            fs = made.setdefault(key, _make_filesystem(protocol, self.options, url))
        return fs

    # -- finding files -----------------------------------------------------------------------

    def expand(self, url: str) -> list[str]:
        """The objects a URL or URL glob names, sorted, with their size and ETag recorded.

        Raises:
            SourceError: the object or bucket does not exist, the glob matches nothing, or the
                credentials were refused.
        """
        fs = self.filesystem(url)
        path = object_path(url)
        if _has_magic(path):
            found = self.call(url, None, lambda: fs.glob(path, detail=True))
            entries = {p: i for p, i in found.items() if i.get("type", "file") == "file"}
            # The listing is the server's answer: an object outside the pattern's fixed part
            # (another bucket, host or prefix) is refused, not read (docs/SECURITY.md).
            fixed = path[: min(path.find(c) for c in "*?[" if c in path)]
            outside = [p for p in entries if not p.startswith(fixed)]
            if outside:
                raise SourceError(f"the listing returned {outside[0]!r:.200}, outside the pattern.", path=url)
            if not entries:
                raise SourceError("the pattern matches no object.", path=url)
            urls = []
            for p in sorted(entries):
                u = _unstrip(fs, url, p)
                self.infos[u] = object_info(entries[p])
                urls.append(u)
        elif url in self.infos:  # listed already (naiad.read hands its reader the files it found)
            urls = [url]
        else:
            info = self.call(url, None, lambda: fs.info(path))
            if info.get("type", "file") != "file":
                raise SourceError("is a directory (a prefix), not an object; use a glob such as "
                                  f"{url.rstrip('/')}/*.csv.", path=url)
            self.infos[url] = object_info(info)
            urls = [url]
        return urls

    def expand_many(self, urls: list[str]) -> None:
        """Record the size and ETag of many named objects with one listing per folder (a brace
        range of 1,000 shards is 1,000 requests one by one); a name the listing lacks is left
        for :meth:`expand` to ask about, and say is missing."""
        folders: dict[str, list[str]] = {}
        for url in urls:
            if url not in self.infos:
                folders.setdefault(url.rsplit("/", 1)[0], []).append(url)
        for folder, wanted in folders.items():
            if len(wanted) < 2:
                continue
            fs = self.filesystem(folder)
            try:
                listed = self.call(folder, None, functools.partial(fs.ls, object_path(folder), detail=True))
            except SourceError:
                continue  # each object is asked about on its own, and named if missing
            by_name = {str(e.get("name", "")).rstrip("/"): e for e in listed if e.get("type", "file") == "file"}
            for url in wanted:
                entry = by_name.get(object_path(url))
                if entry is not None:
                    self.infos[url] = object_info(entry)

    def stat(self, url: str) -> ObjectInfo:
        """Size, ETag and modification time of ``url`` (recorded at expansion, else a HEAD)."""
        info = self.infos.get(url)
        if info is None:
            fs = self.filesystem(url)
            info = self.infos[url] = object_info(self.call(url, None, lambda: fs.info(object_path(url))))
        return info

    # -- reading -----------------------------------------------------------------------------

    def version(self, url: str) -> str | None:
        """What tells this version of ``url`` from another: its ETag, else its modification
        time; None when the store gives neither (its bytes are then never cached)."""
        info = self.stat(url)
        if info.etag:
            return f"etag:{info.etag}"
        return f"mtime:{info.mtime}" if info.mtime else None

    def read_range(self, url: str, start: int, stop: int, *, cached: Cached = True) -> bytes:
        """Bytes ``start:stop`` of the object: from the local cache when there is one and it
        holds them (NOTE [ Block cache ]), else one range request, retried (NOTE [ Retries ]).

        Args:
            cached: False reads past the cache (a scan that reads the whole object once);
                "chunks" reads through the cache's chunks whatever the size (a scan whose
                bytes the first epoch reads again).
        """
        if stop <= start:
            return b""
        if cached and self.cache_dir is not None:
            version = self.version(url)
            if version is not None:
                size = self.stat(url).size
                cache = block_cache(self.cache_dir, self.cache_bytes)
                if cached == "chunks" or (stop - start <= CHUNK_BYTES // 4 and self._chunks_fit(cache)):
                    return self._read_chunks(cache, url, size, version, start, stop)
                key = cache_key(self.endpoint, url, size, version, start, stop)
                return cache.get_or_fetch(key, stop - start, lambda: self._fetch(url, start, stop))
        return self._fetch(url, start, stop)

    def chunked(self, url: str) -> bool:
        """Whether small reads of ``url`` go through cached chunks (NOTE [ Block cache ])."""
        if self.cache_dir is None or self.version(url) is None:
            return False
        return self._chunks_fit(block_cache(self.cache_dir, self.cache_bytes))

    def _chunks_fit(self, cache: BlockCache) -> bool:
        """Whether this source's objects fit in ``cache`` whole (their total kept per listing:
        a read asks on every block)."""
        count, total = getattr(self, "_total", (-1, 0))  # (objects, bytes), made on first use
        if count != len(self.infos):
            count, total = len(self.infos), sum(i.size for i in self.infos.values())
            self._total = (count, total)
        return cache.holds(total)

    def _read_chunks(self, cache: BlockCache, url: str, size: int, version: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` from the aligned chunks that hold them, each fetched whole once."""
        parts = []
        for c in range(start // CHUNK_BYTES, (stop - 1) // CHUNK_BYTES + 1):
            lo, hi = c * CHUNK_BYTES, min((c + 1) * CHUNK_BYTES, size)
            key = cache_key(self.endpoint, url, size, version, lo, hi)
            fetch = functools.partial(self._fetch, url, lo, hi)
            parts.append(cache.get_or_fetch(key, hi - lo, fetch, max(start, lo) - lo, min(stop, hi) - lo))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _fetch(self, url: str, start: int, stop: int) -> bytes:
        fs = self.filesystem(url)
        path = object_path(url)
        data: bytes = self.call(url, (start, stop), lambda: fs.cat_file(path, start=start, end=stop))
        if len(data) != stop - start:
            raise SourceError(
                f"expected {stop - start} bytes at offset {start}, read {len(data)}: the object "
                "changed after it was listed.", path=url,
            )
        return data

    def call(self, url: str, byte_range: tuple[int, int] | None, op: Callable[[], T]) -> T:
        """``op()``, retried on transient errors; other errors become a SourceError naming ``url``."""
        return retrying(self.retry, url, byte_range, op)


def object_path(url: str) -> str:
    """``url`` as its filesystem's calls and listings name it: without its protocol
    (``"s3://bucket/key"`` -> ``"bucket/key"``), through fsspec's public ``strip_protocol``."""
    from fsspec.core import strip_protocol  # fsspec is there: a filesystem was made for the URL

    return str(strip_protocol(url))


def _protocol(url: str) -> str:
    m = URL_RE.match(url)
    return m.group(1).lower() if m else "file"


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _unstrip(fs: Any, url: str, path: str) -> str:
    """The URL of a listed ``path``, with the protocol the user wrote (``s3a``, ``abfss``...)."""
    protocol = _protocol(url)
    full = str(fs.unstrip_protocol(path))
    m = URL_RE.match(full)
    return f"{protocol}://{full[m.end():]}" if m else f"{protocol}://{path}"


def object_info(info: Mapping[str, Any]) -> ObjectInfo:
    """An fsspec listing's or ``info``'s entry as the ObjectInfo of its version."""
    etag = info.get("ETag") or info.get("etag")
    mtime = info.get("LastModified") or info.get("last_modified") or info.get("mtime") or info.get("created")
    return ObjectInfo(int(info.get("size") or 0), str(etag).strip('"') if etag else None,
                      str(mtime) if mtime is not None else None, info.get("type", "file") == "file")


def _make_filesystem(protocol: str, options: Mapping[str, Any], url: str) -> Any:
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"reading {url} needs fsspec: pip install 'naiad[{EXTRAS.get(protocol, 's3')}]'.") from None
    try:
        # Not fsspec's instance cache: ours is keyed by process id (NOTE [ Remote files in workers ]).
        return fsspec.filesystem(protocol, skip_instance_cache=True, **options)
    except ImportError as exc:
        extra = EXTRAS.get(protocol)
        fix = f"pip install 'naiad[{extra}]'" if extra else "install the fsspec implementation for it"
        raise ConfigError(f"reading {url} needs a package that is not installed ({exc}): {fix}.") from None
    except ValueError as exc:
        raise ConfigError(f"no filesystem for the protocol {protocol!r} of {url} ({exc}).") from None
    except TypeError as exc:
        raise ConfigError(f"`storage_options` {sorted(options)} do not fit the {protocol!r} filesystem: {exc}") from None


# -- the module-level seam the readers call: local paths keep their code path ---------------
# A remote path is read through the ``store`` its caller names, its source's Storage (NOTE
# [ Remote files in workers ]); a local path needs none.


def needs_store(path: str, store: Storage | None) -> Storage:
    """``store``, the Storage a read of the object ``path`` goes through; a TypeError without one
    (there is no URL -> Storage table to guess from, and guessing reads with other options)."""
    if store is None:
        raise TypeError(f"reading the object {path} needs the Storage of its source (store=).")
    return store


def stat(url: str, *, store: Storage | None) -> ObjectInfo:
    """Size, ETag and modification time of a remote object, through ``store``."""
    return needs_store(url, store).stat(url)


def size(path: str, *, store: Storage | None = None) -> int:
    """The size of a file, or of an object through ``store`` (its source's Storage)."""
    if is_remote(path):
        return stat(path, store=store).size
    return os.path.getsize(path)


def read_range(path: str, start: int, stop: int, *, store: Storage | None = None, cached: Cached = True) -> bytes:
    """Bytes ``start:stop`` of a file or object (``stop`` < 0: to the end); an object is read
    through ``store``, its source's Storage, and ``cached=False`` reads it past the block cache."""
    if is_remote(path):
        store = needs_store(path, store)
        if stop < 0:
            stop = store.stat(path).size
        return store.read_range(path, start, stop, cached=cached)
    # os.pread on a raw descriptor: a block read costs a third of open()/seek()/read() through
    # a buffered file object, which a CSV's thousands of small blocks per epoch notice.
    fd = os.open(path, os.O_RDONLY)
    try:
        n = (os.fstat(fd).st_size - start) if stop < 0 else stop - start
        data = os.pread(fd, max(n, 0), start)
        while len(data) < n:  # a short read (a pipe, a network mount): the rest
            more = os.pread(fd, n - len(data), start + len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def open_input(path: str, buffer_bytes: int = 8 << 20, *, store: Storage | None = None,
               cached: Cached = True) -> io.BufferedIOBase:
    """A sequential binary file: ``open(path, "rb")`` locally, range reads of ``buffer_bytes``
    at a time for an object through ``store`` (a scan for newlines reads a whole file this way,
    ``cached=False``: past the block cache, which would only fill with ranges no block read asks for)."""
    if is_remote(path):
        return io.BufferedReader(RangeFile(path, needs_store(path, store), cached=cached), buffer_size=buffer_bytes)
    return open(path, "rb")


def input_stream(path: str, compression: str | None = None, buffer_bytes: int = 1 << 20, *,
                 store: Storage | None = None) -> pa.NativeFile:
    """``pyarrow.input_stream`` over a file or an object (read through ``store``), decompressing
    ``compression``.

    An object that is not compressed is read unbuffered (a header's 64 KiB is one request of
    64 KiB); a compressed one through ``buffer_bytes`` requests (the codec reads 64 KiB at a time).
    """
    if is_remote(path):
        store = needs_store(path, store)
        raw: io.RawIOBase | io.BufferedIOBase = (
            RangeFile(path, store) if compression is None else open_input(path, buffer_bytes, store=store))
        return pa.input_stream(raw, compression=compression)
    return pa.input_stream(path, compression=compression)


class RangeFile(io.RawIOBase):
    """A seekable, read-only object whose every read is one range request (retried), through
    ``store``, its source's Storage.

    What PyArrow opens for Parquet and Arrow IPC objects: it reads the footer, then only the
    row groups' column chunks or the record batches asked for.
    """

    def __init__(self, url: str, store: Storage, *, cached: Cached = True) -> None:
        super().__init__()
        self.url = url
        self._cached = cached
        self._storage = store
        self._size = self._storage.stat(url).size
        self._pos = 0

    def readable(self) -> bool:
        """Always true."""
        return True

    def seekable(self) -> bool:
        """Always true."""
        return True

    def tell(self) -> int:
        """The current offset."""
        return self._pos

    def size(self) -> int:
        """The object's size in bytes."""
        return self._size

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move to ``offset`` (from the start, the current offset or the end)."""
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the current offset with one range request."""
        view = memoryview(buffer).cast("B")
        stop = min(self._size, self._pos + len(view))
        if stop <= self._pos:
            return 0
        data = self._storage.read_range(self.url, self._pos, stop, cached=self._cached)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left when negative), with one range request."""
        stop = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if stop <= self._pos:
            return b""
        data = self._storage.read_range(self.url, self._pos, stop, cached=self._cached)
        self._pos += len(data)
        return data
