"""The persisted block index of line-based files: the newline scan, done once per file.

NOTE [ Block index ]
Exactly-once across ranks needs every block's exact row count before the plan is made, and for
CSV, JSONL and text the only way to know it is to scan the file for newlines (about 0.1 s per
100 MB from the page cache, much longer from a cold disk or a network mount). The scan's result
is small (per block: its byte offset, its rows and its first line), so it is written as JSON to
the user's cache folder (``cache.user_cache_dir()/index``, or beside the data when asked),
and a new process, every rank of a job and a resume load it instead of scanning again.

An entry is keyed by the file's real path and everything that shapes the cut (block size,
header lines, blank-line rule, codec); it stores the file's size and modification time, and is
used only when both still match, so a changed file is rescanned. Entries are written to a
temporary file and renamed into place, so ranks that scan the same file at once each write a
whole entry and a reader never sees half of one. A missing, unreadable or malformed entry is a
cache miss, never an error; a folder that cannot be written to is skipped (the scan still works).

An entry is data naiad reads back, possibly written by someone else (a shared data folder), so
it is checked before use: JSON only (never pickle), ints that are ints, blocks that start in
ascending order inside the file and end at its size, rows no more than a block's bytes; the
caller checks that the blocks start where lines start (``scan_file``), and every reader checks
a block's row count as it parses. Anything else is a miss. The entry's name is a hash of the
path and the cut's parameters, never of the file's content; an index folder beside the data
that is a symbolic link, or is not the user's, is never written to (docs/SECURITY.md).

An object behind a URL has an index too, so a new process or rank skips the scan without
downloading the object again. Its entry lives in the source's ``cache_dir`` (``<cache_dir>/index``)
or, without one, in the user's cache folder (an object has no folder beside it), and is keyed by
the endpoint, the URL and the cut, and used only while the object's size and ETag (else its
modification time) are the ones recorded when the source was made; an object that has neither
gets no entry. Checking that every block starts a line would cost a request per block, so
the check on loading reads only the header and the blocks said to be empty, and each block is
checked to end a line as it is read (``lines.read_block_bytes``).

Readers of samples keep what they found once the same way, as ``.npz`` files of plain arrays
(``allow_pickle=False``), each checked by its reader before use: an image folder's listing
(NOTE [ Folder listing ] in images.py), one file per folder (``load_arrays``/``save_arrays``),
and the member indexes of a source's tar shards (NOTE [ Member index ] in tarindex.py), one
file for all its shards (``load_table``/``save_table``): a thousand shards are one file to
read, not a thousand. Such a table is keyed by the files it describes, in order, and records
each file's identity (real path, size, modification time or ETag), so each file's part is
used only while that file is unchanged, and a changed file alone is read again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal, NamedTuple, Union

import numpy as np

from naiad.errors import ConfigError, NaiadError
from naiad.sources import storage
from naiad.sources.cache import user_cache_dir
from naiad.trust.kept import load_npz, miss, read_kept

_LOG = logging.getLogger("naiad.index")  # hits and misses; a kept file refused: naiad.kept

__all__ = [
    "INDEX_VERSION", "Identity", "IndexDir", "identity", "index_folder", "load_arrays", "load_index", "load_table",
    "TableFile", "save_arrays", "save_index", "save_table", "table_file", "table_stamp",
]

INDEX_VERSION = 1

IndexDir = Union[str, "os.PathLike[str]", Literal["beside"], bool, None]
"""Where block indexes live: None or True (the user cache), "beside" (next to each file), a
folder, or False (never persisted)."""

Entry = tuple[int, int, int, int]
"""One block as stored: (start, stop, rows, first_line)."""


def check_index_dir(index_dir: IndexDir) -> IndexDir:
    """``index_dir`` if it is a valid setting, else a ConfigError naming the choices."""
    if index_dir is None or isinstance(index_dir, (bool, str, os.PathLike)):
        return index_dir
    raise ConfigError(
        f"`index_dir` must be None (the user cache), 'beside', a folder or False, got {index_dir!r}."
    )


def index_folder(index_dir: IndexDir, path: str, store: storage.Storage | None = None) -> Path | None:
    """The folder that holds ``path``'s index under ``index_dir`` (None: not persisted); an
    object's is in the block cache of ``store``, its source's Storage, when it has one."""
    if index_dir is False:
        return None
    if storage.is_remote(path) and (index_dir is None or index_dir is True or index_dir == "beside"):
        cache = storage.needs_store(path, store).cache_dir
        if cache is not None:
            return Path(cache) / "index"
        index_dir = None
    if index_dir is None or index_dir is True:
        return user_cache_dir() / "index"
    if index_dir == "beside":
        return Path(os.path.dirname(os.path.abspath(path))) / ".naiad-index"
    return Path(os.fspath(index_dir))


def _entry_name(real: str, params: Mapping[str, Any], where: str = "") -> str:
    key = json.dumps({"path": real, **params, **({"endpoint": where} if where else {})}, sort_keys=True)
    stem = os.path.basename(real)[:40]
    return f"{stem}.{hashlib.sha1(key.encode()).hexdigest()[:20]}.json"


Identity = tuple[str, int, dict[str, Any]]
"""What identifies one version of a file in a table: (its absolute path or URL, its size, the
modification time of a file or the endpoint and ETag of an object)."""


def identity(path: str, store: storage.Storage | None = None) -> Identity | None:
    """The :data:`Identity` of ``path`` now, with one ``stat`` for a file (a table is keyed by
    its files' absolute paths, so no link need be resolved) and an object's through ``store``,
    its source's Storage; None when it cannot be had (the file is gone; the object has neither
    ETag nor time)."""
    if storage.is_remote(path):
        return _identity(path, store)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.abspath(path), st.st_size, {"mtime_ns": st.st_mtime_ns}


def _identity(path: str, store: storage.Storage | None) -> Identity | None:
    """(the real path or URL, the size, what tells this version of it: the modification time of
    a file; the endpoint and ETag, else modification time, of an object, through ``store``), or None."""
    if storage.is_remote(path):
        store = storage.needs_store(path, store)
        try:
            size, version = store.stat(path).size, store.version(path)
        except (OSError, NaiadError):
            return None
        return None if version is None else (path, size, {"endpoint": store.endpoint, "object": version})
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_size, {"mtime_ns": st.st_mtime_ns}


def load_index(index_dir: IndexDir, path: str, params: Mapping[str, Any],
               store: storage.Storage | None = None) -> list[Entry] | None:
    """The stored blocks of ``path`` cut with ``params``, or None when there is no valid entry
    (none yet, another cut, or the file changed since: size or modification time differ); an
    object is identified through ``store``, its source's Storage."""
    folder = index_folder(index_dir, path, store)
    ident = _identity(path, store)
    if folder is None or ident is None:
        return None
    real, size, stamp = ident
    where = folder / _entry_name(real, params, stamp.get("endpoint", ""))
    data = read_kept(where)  # NOTE [ Kept files ]: this user's, a regular file, bounded
    if data is None:
        _LOG.debug("naiad: block index miss for %s: none kept in %s.", path, folder)
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict) or (
            doc.get("version") != INDEX_VERSION or doc.get("path") != real or doc.get("size") != size
            or any(doc.get(k) != v for k, v in stamp.items()) or doc.get("params") != dict(params)
        ):
            miss(where, "it describes another version of the file", level=logging.DEBUG)
            return None
        entries = _checked_entries(doc, size)
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        miss(where, f"it is not a block index ({type(exc).__name__})")
        return None
    if entries is None:
        miss(where, "its blocks are not a plausible cut of the file")
    else:
        _LOG.debug("naiad: block index hit for %s: %d blocks from %s.", path, len(entries), where)
    return entries


def _checked_entries(doc: dict[str, Any], size: int) -> list[Entry] | None:
    """The blocks an entry describes, if they are a plausible cut of a file of ``size`` bytes:
    contiguous, ascending, ending at the file's end, with no more rows than bytes."""
    starts, rows, lines, end = doc["starts"], doc["rows"], doc["first_lines"], doc["end"]
    if not (isinstance(starts, list) and isinstance(rows, list) and isinstance(lines, list)):
        return None
    if not starts or not len(starts) == len(rows) == len(lines) or end != size:
        return None
    if not all(type(v) is int for v in (*starts, *rows, *lines)):
        return None  # bools, floats and strings are not offsets
    stops = [*starts[1:], end]
    if starts[0] < 0 or lines[0] < 1:
        return None
    for a, b, n, ln, next_ln in zip(starts, stops, rows, lines, [*lines[1:], None], strict=True):
        # A block holds at least one byte, a row at least one, and a line at least its newline.
        if not (a < b and 0 <= n <= b - a and (next_ln is None or ln <= next_ln <= ln + (b - a))):
            return None
    return list(zip(starts, stops, rows, lines, strict=True))


def _writable_folder(index_dir: IndexDir, folder: Path) -> bool:
    """Whether entries may be written into ``folder``: beside the data, where others may write,
    only a real directory of this user (not a link someone planted to send writes elsewhere)."""
    if index_dir != "beside" or not hasattr(os, "geteuid"):
        return True
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def save_index(index_dir: IndexDir, path: str, params: Mapping[str, Any], entries: Sequence[Entry],
               store: storage.Storage | None = None) -> None:
    """Store the blocks of ``path`` (contiguous byte ranges) for the next process; best effort
    (an object's identity through ``store``, its source's Storage)."""
    folder = index_folder(index_dir, path, store)
    ident = _identity(path, store)
    if folder is None or ident is None or not entries:
        return
    if any(entries[i][1] != entries[i + 1][0] for i in range(len(entries) - 1)):
        return  # only contiguous cuts are stored (compressed files are one block: nothing to save)
    real, size, stamp = ident
    doc = {
        "version": INDEX_VERSION, "path": real, "size": size, **stamp, "params": dict(params),
        "starts": [e[0] for e in entries], "end": entries[-1][1],
        "rows": [e[2] for e in entries], "first_lines": [e[3] for e in entries],
    }
    text = json.dumps(doc, separators=(",", ":")).encode()  # (json.dump to a file is pure Python: 10x slower)
    _write_entry(index_dir, folder, _entry_name(real, params, stamp.get("endpoint", "")), lambda f: f.write(text))


def _write_entry(index_dir: IndexDir, folder: Path, name: str, write: Callable[[BinaryIO], Any]) -> None:
    """Write an entry whole under a temporary name, then rename it into place (a reader never
    sees half of one); best effort: a read-only or full disk leaves it for the next process."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not _writable_folder(index_dir, folder):
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=Path(name).suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, folder / name)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only or full disk: the next process scans again


ARRAYS_VERSION = 1


def load_arrays(index_dir: IndexDir, path: str, params: Mapping[str, Any],
                store: storage.Storage | None = None) -> dict[str, Any] | None:
    """The arrays stored for ``path`` under ``params`` by :func:`save_arrays` (an ``.npz`` of
    plain NumPy arrays, read with ``allow_pickle=False``), or None when there is no valid entry:
    none yet, another ``params``, or the file changed since (size, modification time or ETag
    differ); an object's through ``store``, its source's Storage. The caller checks the arrays
    themselves (NOTE [ Block index ]: an entry is data)."""
    folder = index_folder(index_dir, path, store)
    ident = _identity(path, store)
    if folder is None or ident is None:
        return None
    real, size, stamp = ident
    name = _entry_name(real, {"arrays": ARRAYS_VERSION, **params}, stamp.get("endpoint", "")).replace(".json", ".npz")
    arrays: dict[str, Any] | None = load_npz(folder / name)  # NOTE [ Kept files ]
    if arrays is None:
        _LOG.debug("naiad: block index miss for %s: none kept in %s.", path, folder)
        return None
    try:
        meta = json.loads(bytes(arrays.pop("__meta__")).decode())
    except (KeyError, ValueError, RecursionError):
        miss(folder / name, "it has no readable description")
        return None
    if not isinstance(meta, dict) or (
        meta.get("path") != real or meta.get("size") != size
        or any(meta.get(k) != v for k, v in stamp.items()) or meta.get("params") != dict(params)
    ):
        miss(folder / name, "it describes another version of the file", level=logging.DEBUG)
        return None
    arrays["__size__"] = size
    _LOG.debug("naiad: block index hit for %s: %s.", path, folder / name)
    return arrays


def save_arrays(index_dir: IndexDir, path: str, params: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                store: storage.Storage | None = None) -> None:
    """Store ``arrays`` describing ``path`` for the next process (written whole, then renamed
    into place, as :func:`save_index`); best effort: a folder that cannot be written is skipped."""
    folder = index_folder(index_dir, path, store)
    ident = _identity(path, store)
    if folder is None or ident is None:
        return
    real, size, stamp = ident
    meta = {"path": real, "size": size, **stamp, "params": dict(params)}
    name = _entry_name(real, {"arrays": ARRAYS_VERSION, **params}, stamp.get("endpoint", "")).replace(".json", ".npz")
    named: dict[str, Any] = {"__meta__": np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays}
    _write_entry(index_dir, folder, name, lambda f: np.savez(f, **named))


TABLE_VERSION = 1


class TableFile(NamedTuple):
    """Where the table describing some files together lives (:func:`table_file`)."""

    folder: Path
    name: str
    keyed: list[str]  # the files as keyed: absolute paths, or URLs
    params: dict[str, Any]
    index_dir: IndexDir


def table_file(index_dir: IndexDir, paths: Sequence[str], params: Mapping[str, Any],
               store: storage.Storage | None = None) -> TableFile | None:
    """Where the table describing ``paths`` (in this order) under ``params`` lives, or None when
    nothing is kept (``index_dir=False``, no files): named by a hash of the paths (absolute for
    files, with the endpoint for objects) and the parameters. Worked out once by its user: a
    thousand paths are hashed each time."""
    if not paths:
        return None
    folder = index_folder(index_dir, paths[0], store)
    if folder is None:
        return None
    keyed = [p if storage.is_remote(p) else os.path.abspath(p) for p in paths]
    where = storage.needs_store(paths[0], store).endpoint if storage.is_remote(paths[0]) else ""
    digest = hashlib.sha1(json.dumps({"paths": keyed, "endpoint": where, **params}, sort_keys=True).encode()).hexdigest()[:20]
    stem = os.path.basename(keyed[0])[:40]
    return TableFile(folder, f"{stem}.{len(keyed)}-files.{digest}.npz", keyed, dict(params), index_dir)


def table_stamp(where: TableFile) -> tuple[int, int] | None:
    """The (size, modification time) of the table, or None when there is none: whether another
    process has written it since it was read."""
    try:
        st = os.stat(where.folder / where.name)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def load_table(where: TableFile) -> tuple[list[Any], dict[str, np.ndarray]] | None:
    """The table :func:`save_table` kept there: the identities it recorded, one per path (an
    :data:`Identity` as a list, or None), and its arrays; None when there is none (or it is not
    a readable table of these paths). The caller uses a path's part only while :func:`identity`
    still gives what was recorded, and checks the arrays themselves (NOTE [ Block index ]: an
    entry is data)."""
    path = where.folder / where.name
    arrays = load_npz(path)  # NOTE [ Kept files ]
    if arrays is None:
        return None
    try:
        meta = json.loads(bytes(arrays.pop("__meta__")).decode())
    except (KeyError, ValueError, RecursionError):
        miss(path, "it has no readable description")
        return None
    if not isinstance(meta, dict) or (
        meta.get("version") != TABLE_VERSION or meta.get("paths") != where.keyed or meta.get("params") != where.params
    ):
        miss(path, "it describes other files", level=logging.DEBUG)
        return None
    idents = meta.get("identities")
    if not isinstance(idents, list) or len(idents) != len(where.keyed):
        miss(path, "its files' identities do not fit its files")
        return None
    return idents, arrays


def save_table(where: TableFile, idents: Sequence[Identity | None], arrays: Mapping[str, np.ndarray]) -> None:
    """Keep ``arrays`` describing the table's paths together, with each path's identity as it
    was when its part was made (None: that part is never used), for the next process: written
    whole, then renamed into place, as :func:`save_index`; best effort."""
    meta = {"version": TABLE_VERSION, "paths": where.keyed, "params": where.params,
            "identities": [None if i is None else list(i) for i in idents]}
    named: dict[str, Any] = {"__meta__": np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays}
    _write_entry(where.index_dir, where.folder, where.name, lambda f: np.savez(f, **named))
