"""An image or video folder behind a URL: the prefix listed once and checked, its objects fetched.

NOTE [ Remote folder listing ]
A folder on object storage is a prefix. One recursive listing of it (fsspec's ``find``: a LIST
request per 1,000 objects, retried through the source's Storage) gives every object's name, size
and ETag, and from them the order and labels of a local folder (NOTE [ Folder listing ] in
images.py): the classes are the first-level sub-prefixes, sorted; a class's objects are those
under it whose names end with one of the extensions (in any case), in the order of a sorted
walk (by folder, then by name); a class with none is an error; a prefix without sub-prefixes is
flat, its own objects without labels. A key that ends with ``/`` (a "folder" made in a console)
makes its folder exist and is no file, as an empty local folder.

The listing is the server's answer, so it is checked before it says what to read
(docs/SECURITY.md; ``trust/listings.py``): every name lies under the prefix, below it a plain key
(no empty component, no ``.`` or ``..``, no NUL), and every size is an int from 0 to
``MAX_LISTED_BYTES``; anything else refuses the listing with a SourceError naming the URL and
the name. A glob's matches and a
list of URLs (``read_videos``) are checked the same way against their common folder.

The listing is not kept, unlike a local folder's: an object store has no folder modification
times, so a kept listing could not tell that objects were added, removed or replaced since. Each
process that makes the source (a rank, a new job) lists the prefix again; the process workers
get the listing inside the source, as arrays: names, labels, sizes, and each object's ETag and
modification time.

A read fetches its objects whole, one range request each (``Storage.read_range(url, 0, size)``:
retried, and through the block cache, keyed by the listed size and ETag), ``FETCH_WINDOW`` of
them in flight at once on the I/O threads (NOTE [ Remote read-ahead ] in readahead.py), in the
listing's order. An object over ``media.max_bytes`` is not fetched. Each read goes through a copy
of the source's Storage recording that read's objects as listed, so the Storage that crosses into
the workers does not carry an entry per object (a million of them would weigh more than the
listing's arrays).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from naiad.errors import ConfigError, SourceError
from naiad.sources.readahead import io_map
from naiad.sources.storage import ObjectInfo, Storage, object_info, object_path
from naiad.trust.listings import MAX_LISTED_BYTES, checked_entries, name_problem
from naiad.trust.paths import URL_RE, encode_name

__all__ = [
    "FETCH_WINDOW", "fetch_objects", "is_url_glob", "list_prefix", "object_infos", "pack_names", "url_folder",
    "url_listing",
]

FETCH_WINDOW = 8
"""The objects of one read in flight at once: small objects cost a round trip each, and a few
at a time hide it without one request per object queued at once."""


def list_prefix(store: Storage, root: str, extensions: tuple[str, ...], noun: str) -> dict[str, np.ndarray]:
    """The listing of the folder ``root`` (a URL) as ImageFolder orders and labels a local one
    (NOTE [ Remote folder listing ]): the arrays of a local listing, and the objects' versions.

    Raises:
        SourceError: the listing fails or is refused, the prefix holds nothing or only an
            object, a class holds no file of ``extensions``, or a flat prefix none.
    """
    fs = store.filesystem(root)
    prefix = object_path(root).rstrip("/")
    found = store.call(root, None, lambda: fs.find(prefix, detail=True))
    if prefix in found:
        raise SourceError(f"is an object, not a folder (a prefix) of {noun}s.", path=root)
    listed, markers = checked_entries(found, prefix, root)
    objects = {n: object_info(i) for n, i in listed.items()}
    if not objects and not markers:
        raise SourceError(f"no object under the prefix: `root` must be a folder of {noun}s (or of class folders).",
                          path=root)
    classes = sorted({n.split("/", 1)[0] for n in objects if "/" in n} | {m.split("/", 1)[0] for m in markers})
    named = [n for n in objects if n.lower().endswith(extensions)]
    if classes:
        label_of = {c: i for i, c in enumerate(classes)}
        # A sorted walk: class, then folder, then name (os.walk's order, as the local listing's).
        keyed = sorted((label_of[n.split("/", 1)[0]], n.rpartition("/")[0], n.rpartition("/")[2], n)
                       for n in named if "/" in n)
        names, labels = [k[3] for k in keyed], [k[0] for k in keyed]
        empty = sorted(set(classes) - {classes[k] for k in set(labels)})
        if empty:
            raise SourceError(f"the class folder {empty[0]!r} holds no {noun} file (extensions {', '.join(extensions)}); "
                              f"remove it or add its {noun}s, as torchvision's ImageFolder requires.",
                              path=f"{root}/{empty[0]}")
    else:
        names = sorted(named)
        labels = [-1] * len(names)
        if not names:
            raise SourceError(f"the folder holds no {noun} file (extensions {', '.join(extensions)}) and no class "
                              "folder.", path=root)
    return _arrays(names, [objects[n] for n in names], classes, labels)


def url_folder(urls: Sequence[str]) -> str:
    """The closest folder (a URL) holding every one of ``urls``: their common leading components,
    at least a bucket or host.

    Raises:
        ConfigError: the URLs are of several protocols, buckets or hosts.
    """
    split = [u.split("://", 1) for u in urls]
    if len({s[0].lower() for s in split}) > 1 or any(len(s) < 2 for s in split):
        raise ConfigError(f"`root` lists URLs of several protocols ({urls[0]!r:.100}, ...); name objects of one store.")
    folders = [s[1].split("/")[:-1] for s in split]
    common = os.path.commonprefix(folders)
    if not common or not common[0]:
        raise ConfigError(f"`root` lists objects of several buckets or hosts ({urls[0]!r:.100}, ...); "
                          "name objects of one bucket.")
    return f"{split[0][0]}://" + "/".join(common)


def url_listing(store: Storage, urls: Sequence[str], root: str, *, glob: bool) -> dict[str, np.ndarray]:
    """A flat listing of the objects ``urls`` under the folder ``root``, in their order, their
    sizes and versions from ``store`` (recorded by its glob's listing, else one HEAD each).

    Raises:
        SourceError: an object is missing or is a prefix, or a name below ``root`` is not a
            plain key (NOTE [ Remote folder listing ]).
    """
    infos = []
    for url in urls:
        rel = url[len(root) + 1:] if url.startswith(root + "/") else None
        why = "outside the folder" if rel is None else name_problem(rel)
        if why is not None:
            raise SourceError(f"{'the glob matched' if glob else '`root` lists'} a name {why}: refused.", path=url)
        info = store.stat(url)
        if not info.is_file:
            raise SourceError("is a prefix (a folder), not an object.", path=url)
        if not 0 <= info.size <= MAX_LISTED_BYTES:
            raise SourceError(f"the listing gives the size {info.size}, not a byte count: refused.", path=url)
        infos.append(info)
    return _arrays([u[len(root) + 1:] for u in urls], infos, [], [-1] * len(urls))


def pack_names(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Names as a listing keeps them (NOTE [ Names as bytes ]): each one's end in one blob, and the blob."""
    blobs = [encode_name(n) for n in names]
    ends = np.cumsum(np.fromiter(map(len, blobs), np.int64, count=len(blobs))).astype(np.int64)
    return ends, np.frombuffer(b"".join(blobs), np.uint8).copy()


def _arrays(names: list[str], infos: list[ObjectInfo], classes: list[str], labels: list[int]) -> dict[str, np.ndarray]:
    ends, blob = pack_names(names)
    return {
        "classes": np.array(classes, dtype=str) if classes else np.zeros(0, "<U1"),
        "labels": np.array(labels, np.int64),
        "sizes": np.array([i.size for i in infos], np.int64),
        "path_ends": ends,
        "path_bytes": blob,
        # Fixed-width bytes: one buffer each, no Python object per object, into every worker's pickle.
        "etags": np.array([(i.etag or "").encode() for i in infos], dtype="S"),
        "mtimes": np.array([(i.mtime or "").encode() for i in infos], dtype="S"),
    }


def object_infos(listing: Mapping[str, np.ndarray], rows: np.ndarray) -> list[ObjectInfo]:
    """The listed version of each of the objects ``rows``."""
    return [ObjectInfo(size, etag.decode() or None, mtime.decode() or None)
            for size, etag, mtime in zip(listing["sizes"][rows].tolist(), listing["etags"][rows].tolist(),
                                         listing["mtimes"][rows].tolist())]


def fetch_objects(store: Storage, urls: Sequence[str], infos: Sequence[ObjectInfo], max_bytes: int,
                  noun: str) -> list[bytes | str]:
    """Each object's bytes, or why it is a bad row, in order (NOTE [ Remote folder listing ]):
    at most ``FETCH_WINDOW`` requests at once, each whole object read through ``store``'s retries
    and cache as it was listed; one over ``max_bytes`` not fetched."""
    view = store.copy()
    view.infos.update(zip(urls, infos))

    def one(k: int) -> bytes | str:
        url, size = urls[k], infos[k].size
        if size > max_bytes:
            return f"cannot read the {noun} ({size:,} bytes, more than the {max_bytes:,} a sample may take)"
        try:
            return view.read_range(url, 0, size)
        except SourceError as exc:
            said = str(exc)
            said = said[len(url) + 2:] if said.startswith(f"{url}: ") else said
            gone = isinstance(exc.__cause__, FileNotFoundError)
            return f"cannot read the {noun}: {said.rstrip('.')}" + ("; was it removed since the folder was listed?" if gone else "")

    return io_map(one, range(len(urls)), window=FETCH_WINDOW)


def is_url_glob(text: str) -> bool:
    """Whether the URL ``text`` is a pattern (``*``, ``?`` or ``[`` after its protocol)."""
    m = URL_RE.match(text)
    return m is not None and any(c in text[m.end():] for c in "*?[")
