"""What a folder's listing may say before it decides which files are samples: a kept listing's
arrays, and a server's listing of a prefix (docs/SECURITY.md).

A kept listing (NOTE [ Folder listing ] in sources/images.py) is data anyone who can write to the
index folder may have written (NOTE [ Kept files ] in kept.py); a prefix's listing (NOTE [ Remote
folder listing ] in sources/remote_listing.py) is the server's answer. Either may name a file
outside its folder, give impossible sizes or mislabel files, so each is checked here, in the trust
layer, before a reader uses it: a kept listing that fails is a miss (listed again, the reason
logged), a server's listing that fails is refused (a SourceError naming the URL and the name).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from naiad.errors import SourceError
from naiad.trust.kept import miss
from naiad.trust.paths import encode_name, relative_names_ok, under

__all__ = ["MAX_LISTED_BYTES", "check_listing", "checked_entries", "name_problem"]

MAX_LISTED_BYTES = 1 << 50
"""The largest file or object size a listing may give (a petabyte: anything above is a lie)."""


def check_listing(stored: Mapping[str, Any], root: str) -> str | None:
    """Why a kept listing may not be used for ``root``, or None when it may (NOTE [ Folder
    listing ]). A listing is data anyone who can write to the index folder may have written
    (NOTE [ Kept files ] in naiad/trust/kept.py), so before it says which files are samples,
    and with which labels: its arrays have the types and lengths a listing has; its paths are
    plain relative names (no ``..``, not absolute), each inside the folder of its class; its
    labels number its classes, which are folder names; every folder it walked lies under the
    root and still has its recorded modification time (a file added, removed or renamed changes
    its folder's). Anything else is logged and the folder listed again."""
    why = _implausible(stored, root)
    if why is not None:
        miss(root, f"it is implausible: {why}", what="the kept listing of")
        return why
    for d, m in zip(stored["dirs"].tolist(), stored["dir_mtimes"].tolist()):
        try:
            st = os.stat(d)
        except OSError:
            return "a folder it walked is gone"
        if not stat.S_ISDIR(st.st_mode) or st.st_mtime_ns != m:
            return "a folder it walked has changed"
    return None


_LISTING_ARRAYS = ("labels", "sizes", "path_ends", "path_bytes", "classes", "dirs", "dir_mtimes")


def _implausible(a: Mapping[str, Any], root: str) -> str | None:
    """What makes a listing's arrays no listing of ``root``, or None (check_listing's checks)."""
    missing = [k for k in _LISTING_ARRAYS if k not in a]
    if missing:
        return f"no {missing[0]!r} array"
    return (_arrays_wrong(a) or relative_names_ok(a["path_bytes"], a["path_ends"]) or _folders_wrong(a, root)
            or _labels_wrong(a))


def _arrays_wrong(a: Mapping[str, Any]) -> str | None:
    """The arrays' types, shapes and lengths; the names' offsets; the sizes."""
    labels, sizes, ends, blob = a["labels"], a["sizes"], a["path_ends"], a["path_bytes"]
    ints = (labels, sizes, ends, a["dir_mtimes"])
    if not (all(x.dtype == np.int64 for x in ints) and blob.dtype == np.uint8
            and a["classes"].dtype.kind == "U" and a["dirs"].dtype.kind == "U"):
        return "arrays of other types"
    if any(a[k].ndim != 1 for k in _LISTING_ARRAYS):
        return "arrays of other shapes"
    if not (len(sizes) == len(ends) == len(labels) > 0 and len(a["dirs"]) == len(a["dir_mtimes"])):
        return "arrays of other lengths"
    if np.any(np.diff(ends) <= 0) or ends[0] <= 0 or int(ends[-1]) != len(blob):
        return "name offsets out of order"
    if np.any(sizes < 0) or np.any(sizes > MAX_LISTED_BYTES):
        return "file sizes out of range"
    return None


def _folders_wrong(a: Mapping[str, Any], root: str) -> str | None:
    """The class names are folder names; every folder walked lies under the root."""
    names = a["classes"].tolist()
    if names != sorted(set(names)) or any(not c or "/" in c or "\0" in c or c in (".", "..") for c in names):
        return "class names that are not folder names"
    dirs = a["dirs"]
    if not dirs.size or dirs[0] != root or any(not under(d, root) or "/../" in d + "/" for d in dirs.tolist()):
        return "a walked folder outside the root"
    return None


def _labels_wrong(a: Mapping[str, Any]) -> str | None:
    """Labels number the classes in order, each class has files, and each file's name lies in its
    class's folder (a flat folder: no labels, no sub-folders)."""
    labels, ends, blob, names = a["labels"], a["path_ends"], a["path_bytes"], a["classes"].tolist()
    if not names:
        return None if np.all(labels == -1) and not np.any(blob == ord("/")) else "labels or sub-folders in a flat folder"
    if labels[0] < 0 or np.any(np.diff(labels) < 0) or labels[-1] >= len(names):
        return "labels outside the classes"
    starts = np.concatenate(([0], ends[:-1]))
    bounds = np.searchsorted(labels, np.arange(len(names) + 1))
    for label, name in enumerate(names):
        lo, hi = int(bounds[label]), int(bounds[label + 1])
        prefix = np.frombuffer(encode_name(name) + b"/", np.uint8)
        if lo == hi:
            return f"no file in class {name!r}"
        if np.any(ends[lo:hi] - starts[lo:hi] <= len(prefix)) or not np.all(
                blob[starts[lo:hi, None] + np.arange(len(prefix))] == prefix):
            return f"a name outside its class folder {name!r}"
    return None


def name_problem(rel: str) -> str | None:
    """Why ``rel`` is not a plain key below a prefix (an empty, ``.`` or ``..`` component, a
    NUL), or None."""
    if "\0" in rel:
        return "a name with a NUL"
    parts = rel.split("/")
    if "" in parts:
        return "a name with an empty component"
    if "." in parts or ".." in parts:
        return "a name with a '.' or '..' component"
    return None


def checked_entries(entries: Mapping[str, Mapping[str, Any]], prefix: str, url: str
                    ) -> tuple[dict[str, Mapping[str, Any]], list[str]]:
    """A server's listing of ``prefix`` (fsspec's ``find(..., detail=True)``: name -> info)
    checked: its objects by their names below the prefix, and the folders its ``/``-ending
    markers name (the prefix's own marker left out).

    Raises:
        SourceError: a name outside the prefix, with an empty, ``.`` or ``..`` component or a
            NUL, or a size that is not an int from 0 to ``MAX_LISTED_BYTES``; naming ``url``.
    """
    head = prefix.rstrip("/") + "/"
    objects: dict[str, Mapping[str, Any]] = {}
    markers: list[str] = []
    for name, info in entries.items():
        if not isinstance(name, str) or not name.startswith(head):
            raise SourceError(f"the listing returned {name!r:.200}, outside the prefix {head!r:.200}: refused.", path=url)
        rel = name[len(head):]
        marker = rel.endswith("/")
        why = name_problem(rel[:-1] if marker else rel) if rel else None
        if why is not None:
            raise SourceError(f"the listing returned {name!r:.200}, {why}: refused.", path=url)
        if marker or not rel or info.get("type", "file") != "file":
            if rel:
                markers.append(rel.rstrip("/"))
            continue
        size = info.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_LISTED_BYTES:
            raise SourceError(f"the listing gives {name!r:.200} the size {size!r:.40}, not a byte count: refused.",
                              path=url)
        objects[rel] = info
    return objects, markers
