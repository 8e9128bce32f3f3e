"""Paths that data chooses: a table's media paths, a kept listing's names, a folder's walk.

NOTE [ Paths inside tables ]
A table may name its media by path (the ``{bytes, path}`` struct of Hugging Face ``datasets``,
NOTE [ Media structs ] in sources/media.py). The table is data, and the path is its author's
word, so it is read only where the table itself lives, or where the user says:

* a relative path is joined to the table's folder (or its URL's folder) and normalised; one that
  climbs out of that folder (``../``) is refused;
* a remote table (``s3://``, ``gs://``, ``memory://``...) reads only URLs of its own protocol and
  bucket or host, under its folder: never ``file://``, ``local://`` or a local path, and never
  another store (which it would read with the table's own credentials);
* a local table reads local files under its own folder;
* the reader's ``media=MediaAccess(roots=[...])`` names more places, local folders or URL
  prefixes, that a table's paths may reach;
* a file is read only if it is at most ``MediaAccess.max_bytes`` (256 MiB unless the user says), and a
  local one only if it is a regular file (a FIFO or a device would block or never end).

Anything else is a refusal: the row is bad (a ``SourceError`` naming the file, row and column,
or skipped into the ledger with ``on_bad_rows="skip"``), and nothing is read.

NOTE [ Names as bytes ]
Names on disk and in tars are bytes, not text: a tar written on a Latin-1 system names a member
``caf\\xe9.jpg``. naiad keeps them as the bytes they are (a listing's and a member index's name
blobs hold ``str.encode("utf-8", "surrogateescape")``) and gives them to the user as ``str``
with surrogate escapes for the bytes that are not UTF-8, exactly as ``os.walk``, ``tarfile``
and the ``webdataset`` library give them (``'caf\\udce9'``); ``os.fsencode`` turns such a name
back into the file's own bytes. :func:`decode_names` does it for a whole column at once, and
takes the per-name path only when a column holds a name that is not UTF-8.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_MEDIA_BYTES", "URL_RE", "MediaAccess", "decode_names", "encode_name", "is_remote", "is_url",
    "local_path", "locate_media", "read_local_file", "relative_names_ok", "under", "walk_once",
]

DEFAULT_MAX_MEDIA_BYTES = 256 << 20
"""The most bytes one file named by a table (or one file of an image folder) is read with."""

URL_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
"""``proto://`` at the start of a path: a URL (``file://`` and ``local://`` name local files)."""
_LOCAL_SCHEMES = ("file", "local")


def is_url(path: str) -> bool:
    """True for ``proto://...`` (``file://`` included)."""
    return URL_RE.match(path) is not None


def is_remote(path: str) -> bool:
    """True when ``path`` is a URL that is not a local file (``file://`` is local)."""
    m = URL_RE.match(path)
    return m is not None and m.group(1).lower() not in _LOCAL_SCHEMES


def local_path(url: str) -> str:
    """``file:///data/x.csv`` -> ``/data/x.csv`` (other paths unchanged)."""
    m = URL_RE.match(url)
    return url[m.end():] if m and m.group(1).lower() in _LOCAL_SCHEMES else url


@dataclass(frozen=True)
class MediaAccess:
    """Where the paths inside a table may reach, and how large a file they may name (NOTE [
    Paths inside tables ]).

    Attributes:
        roots: more places than the table's own folder: local folders (made absolute) and URL
            prefixes (``s3://bucket/images``), normalised.
        max_bytes: the most bytes one named file may hold.
        real_roots: the local roots with their links resolved (a link's target is checked
            against them).
    """

    roots: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    real_roots: tuple[str, ...] = ()  # the local roots with their links resolved

    @classmethod
    def of(cls, roots: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
           max_bytes: int | None = None) -> MediaAccess:
        """A MediaAccess with its roots normalised and its size checked (what a reader's ``media=`` becomes).

        Raises:
            ConfigError: a root that is not a non-empty str (or path), a URL that climbs above
                its bucket, or a size that is not a positive int.
        """
        if max_bytes is None:
            max_bytes = DEFAULT_MAX_MEDIA_BYTES
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigError(f"`MediaAccess.max_bytes` must be an int >= 1 or None (256 MiB), got {max_bytes!r}.")
        if roots is None:
            return cls((), max_bytes)
        listed = [roots] if isinstance(roots, (str, os.PathLike)) else list(roots)
        out = []
        for root in listed:
            text = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
            if not isinstance(text, str) or not text:
                raise ConfigError(f"`MediaAccess.roots` must be folders or URL prefixes (str), got {root!r}.")
            m = URL_RE.match(text)
            if m and m.group(1).lower() not in _LOCAL_SCHEMES:
                url = _normal_url(text)
                if url is None:
                    raise ConfigError(f"`MediaAccess.roots` entry {text!r} climbs above its bucket or host.")
                out.append(url.rstrip("/"))
            else:
                path = text[m.end():] if m else text
                out.append(os.path.normpath(os.path.abspath(os.path.expanduser(path))))
        real = tuple(os.path.realpath(r) for r in out if not URL_RE.match(r))
        return cls(tuple(out), max_bytes, real)


def under(path: str, folder: str) -> bool:
    """Whether the normalised ``path`` is ``folder`` or inside it (by whole components)."""
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder if folder.endswith("/") else folder + "/")


def _normal_url(url: str) -> str | None:
    """``url`` with its scheme lower-cased and its ``.`` and ``..`` components resolved (other
    components kept as they are: ``a//b`` is another object than ``a/b`` in a bucket); None
    when it climbs above its bucket or host."""
    m = URL_RE.match(url)
    assert m is not None
    host, _, path = url[m.end():].partition("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part == ".":
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return f"{m.group(1).lower()}://{host}/" + "/".join(parts)


def locate_media(where: str, table: str, access: MediaAccess) -> tuple[str | None, str]:
    """The file or URL a table's path names, if the table may read it (NOTE [ Paths inside
    tables ]): ``(location, "")``, else ``(None, why not)``.

    Args:
        where: the path as the table stores it.
        table: the table's file (a local path) or URL.
        access: the roots beyond the table's folder.
    """
    if "\0" in where:
        return None, f"its path {where!r:.200} holds a NUL byte"
    table_remote = is_remote(table)
    own = (_normal_url(table) or table).rsplit("/", 1)[0] if table_remote else os.path.dirname(os.path.abspath(table))
    m = URL_RE.match(where)
    target: str | None
    if is_remote(where):
        target, remote = _normal_url(where), True
    elif m is not None or os.path.isabs(where):
        if table_remote:
            return None, f"its path {where!r:.200} is a local file named by a remote table (not read)"
        target, remote = os.path.normpath(where[m.end():] if m else where), False
        if not os.path.isabs(target):
            return None, f"its path {where!r:.200} is not an absolute file URL"
    else:  # relative: to the table's folder, and inside it
        target = _normal_url(f"{own}/{where}") if table_remote else os.path.normpath(os.path.join(own, where))
        remote = table_remote
        if target is None or not under(target, own):
            return None, f"its path {where!r:.200} leaves the table's folder {own}"
    if target is None:
        return None, f"its path {where!r:.200} climbs above its bucket or host"
    if target.rstrip("/") == own.rstrip("/"):
        return None, f"its path {where!r:.200} names the table's folder, not a file"
    if (remote == table_remote and under(target, own)) or any(
            under(target, root) for root in access.roots if is_remote(root) == remote):
        linked = "" if remote else _linked_outside(target, where, table, own, access)
        return (None, linked) if linked else (target, "")
    allowed = f"the table's folder {own}" + (f" or the media roots {list(access.roots)}" if access.roots else "")
    return None, (f"its path {where!r:.200} is outside {allowed}; name its folder in the reader's media=naiad.MediaAccess(roots=[...]) to read it")


def _linked_outside(target: str, where: str, table: str, own: str, access: MediaAccess) -> str:
    """Why the local file ``target`` (lexically where it may be) is not, once its links are
    resolved: a link inside the table's folder may point anywhere (``img/cat.png -> ~/.ssh/...``);
    "" when its real path is under the table's folder, the folder of the table's own real file
    (a cache that links both the table and its files to blobs, as the Hugging Face hub's does),
    or a root."""
    real = os.path.realpath(target)
    places = (os.path.realpath(own), os.path.dirname(os.path.realpath(table)), *access.real_roots)
    if any(under(real, place) for place in places):
        return ""
    return f"its path {where!r:.200} is a link to {real!r:.200}, outside the places the table may read"


def read_local_file(path: str | bytes, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Opened without blocking (a FIFO named as an image would block ``open`` forever) and without
    following a link of another's into a device: only a regular file is read, and only as many
    bytes as it held when opened.

    Raises:
        OSError: it cannot be opened or read, is not a regular file (``EINVAL``), or is larger
            than ``max_bytes`` (``EFBIG``); the message says which.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, more than the {max_bytes:,} a sample may take")
        chunks = []
        left, offset = st.st_size, 0
        while left > 0:
            data = os.pread(fd, left, offset)
            if not data:
                break  # it shrank since: what is there
            chunks.append(data)
            left -= len(data)
            offset += len(data)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


# -- names (NOTE [ Names as bytes ]) -------------------------------------------------------------


def encode_name(name: str) -> bytes:
    """A name as the bytes it is kept as (its own bytes, for a name read with surrogate escapes)."""
    return name.encode("utf-8", "surrogateescape")


def decode_names(values: pa.Array) -> np.ndarray:
    """Names kept as bytes (a binary or string Arrow array whose bytes may not be UTF-8) as an
    object array of ``str``, surrogate escapes for the bytes that are not UTF-8 (NOTE [ Names as
    bytes ]). No loop in Python unless a name is not UTF-8."""
    out = np.empty(len(values), object)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.view(pa.large_binary() if pa.types.is_large_string(values.type) else pa.binary())
    try:
        text = values.cast(pa.large_string())  # checks UTF-8, copies nothing
    except pa.ArrowInvalid:
        out[:] = [None if v is None else v.decode("utf-8", "surrogateescape") for v in values.to_pylist()]
        return out
    out[:] = text.to_pylist()
    return out


def relative_names_ok(blob: np.ndarray, ends: np.ndarray) -> str | None:
    """Why the names packed in ``blob`` (uint8, one after another, name ``i`` ending at
    ``ends[i]``) are not all plain relative paths, or None when they are: none empty, absolute,
    with a NUL byte, or with a ``..`` component (a kept listing that names ``../outside.txt``
    would read a file outside its folder). Vectorised; a name holding ``..`` at all is looked at
    alone."""
    n = len(ends)
    if n == 0:
        return None
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    if np.any(ends <= starts):
        return "an empty name"
    if np.any(blob == 0):
        return "a name with a NUL byte"
    if np.any(blob[starts] == ord("/")):
        return "an absolute name"
    dots = np.flatnonzero((blob[:-1] == ord(".")) & (blob[1:] == ord(".")))
    if dots.size:
        rows = np.unique(np.searchsorted(ends, dots, side="right"))
        for r in rows.tolist():
            name = bytes(blob[starts[r]:ends[r]])
            if b".." in name.split(b"/"):
                return f"the name {name!r:.120} climbs out of its folder"
    return None


# -- the folder walk -----------------------------------------------------------------------------


def walk_once(top: str) -> Iterator[tuple[str, list[os.DirEntry[str]]]]:
    """``(folder, its regular files)`` for ``top`` and every folder under it, links to
    folders followed, each folder visited once by its device and inode (a link that loops back,
    or two links to one folder, are walked once), in no set order (the caller sorts). Entries
    that vanish or cannot be read are passed over, as ``os.walk`` does."""
    seen: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        files: list[os.DirEntry[str]] = []
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir():  # links followed
                    stack.append(os.path.join(folder, entry.name))
                elif entry.is_file():  # a regular file, or a link to one
                    files.append(entry)
            except OSError:
                continue
        yield folder, files
