"""What ``naiad inspect`` and ``naiad convert`` share for videos: whether a source names video
files (one file, a glob, a folder of them in ``naiad.read_videos``' layouts, local or behind a
URL), their listing with labels, their bytes, and PyAV or an error naming the extra to install.

The listing is ``naiad.read_videos``' own (``sources/videos.py``: the same files, order, classes
and labels, the kept listing reused; a prefix's listing, NOTE [ Remote folder listing ]), so what
inspect and convert see is what a loader reads; a video behind a URL is fetched as a loader
fetches it, whole and as listed, through the source's Storage, only when it is read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from naiad.errors import ConfigError, SourceError
from naiad.sources.images import IMG_EXTENSIONS
from naiad.sources.options import StorageLike
from naiad.sources.remote_listing import fetch_objects, is_url_glob, object_infos
from naiad.sources.storage import is_remote, local_path
from naiad.sources.videos import VIDEO_EXTENSIONS

__all__ = ["VideoFiles", "is_video_source", "list_videos", "pyav_for"]

_INSTALL = "pip install 'naiad[video]'"
_WALK_FILES = 10_000  # how many files a folder's check looks at before it decides it holds no video


def pyav_for(what: str) -> Any:
    """The ``av`` module (PyAV), or a ConfigError saying that ``what`` needs it and how to install it."""
    try:
        import av
    except ImportError as exc:
        raise ConfigError(f"{what} needs PyAV, which is not installed: {_INSTALL}.") from exc
    return av


def _is_video_name(name: str) -> bool:
    return name.lower().endswith(VIDEO_EXTENSIONS)


def is_video_source(src: Any) -> bool:
    """Whether ``src`` names video files: a file, glob or list (local or URLs) whose names end in
    a video extension (``.mp4``, ``.avi``... ``sources/videos.VIDEO_EXTENSIONS``), a local folder
    whose first media file (images and videos, walked in sorted order) is a video, or a folder
    behind a URL (``s3://bucket/train/``, or a last part without a suffix), told by its name
    alone: :func:`list_videos` lists it, and one holding no video is an error naming it. Local
    image folders, tables and shards are not (their readers keep them)."""
    if isinstance(src, (list, tuple)):
        return bool(src) and all(isinstance(p, (str, os.PathLike)) and _is_video_name(os.fspath(p)) for p in src)
    if not isinstance(src, (str, os.PathLike)):
        return False
    text = os.fspath(src)
    if is_remote(text):
        return _is_video_name(text) or _is_url_folder(text)
    text = local_path(text)
    if os.path.isdir(text):
        return _folder_holds_videos(text)
    return _is_video_name(text)


def _is_url_folder(url: str) -> bool:
    """Whether ``url`` names a folder (a prefix) by its form: it ends with ``/``, or its last part
    has no suffix and no pattern (``s3://bucket/train``)."""
    if url.endswith("/"):
        return True
    last = url.rsplit("/", 1)[-1]
    return not is_url_glob(url) and "." not in last and "{" not in last


def _folder_holds_videos(root: str) -> bool:
    """Whether the first media file under ``root`` (sorted walk; hidden entries skipped) is a video;
    a folder whose own files include one a table reader reads is a table's, as for images."""
    from naiad.sources.auto import READERS, _suffix

    if any(_suffix(name) in READERS for name in os.listdir(root) if not name.startswith((".", "_"))):
        return False
    seen = 0
    for _, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            seen += 1
            low = name.lower()
            if low.endswith(VIDEO_EXTENSIONS):
                return True
            if low.endswith(IMG_EXTENSIONS) or seen > _WALK_FILES:
                return False
    return False


@dataclass(frozen=True)
class VideoFiles:
    """Video files as ``naiad.read_videos`` lists them.

    Attributes:
        root: the folder the files are listed under (a glob's or list's closest common folder;
            a URL for files behind one).
        paths: each file's full path (or URL), in the reader's order.
        labels: each file's class number (-1 without class folders).
        sizes: each file's size in bytes.
        classes: the class names, sorted (empty for a flat folder, a glob or a list).
        source: the ``read_videos`` source that listed them (its Storage fetches URLs).
    """

    root: str
    paths: list[str]
    labels: np.ndarray
    sizes: np.ndarray
    classes: list[str]
    source: Any = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def remote(self) -> bool:
        """Whether the files are objects behind URLs (read with :meth:`fetch`)."""
        return is_remote(self.root)

    def name(self, i: int) -> str:
        """File ``i``'s path under the root, with ``/`` between its parts (``archery/v_001.mp4``)."""
        path = self.paths[i]
        if self.remote:
            return path[len(self.root) + 1:] if path.startswith(self.root + "/") else path
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def fetch(self, rows: Sequence[int]) -> list[bytes | str]:
        """The bytes of the objects ``rows`` behind URLs, as ``read_videos`` reads them (NOTE [
        Remote folder listing ]): each fetched whole as it was listed, through the source's
        Storage (its retries and cache), a few at once; one larger than the source's
        ``media.max_bytes`` not fetched. Where one cannot be read, why (a bad row's reason)."""
        listing = self.source.listing()
        picked = np.asarray(rows, dtype=np.int64)
        return fetch_objects(self.source.storage, [self.paths[i] for i in rows], object_infos(listing, picked),
                             self.source.max_media_bytes, "video")


def list_videos(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                storage: StorageLike = None) -> VideoFiles:
    """The video files ``src`` names, listed by ``naiad.read_videos``: a folder (class folders or
    flat), a glob or a list of files; one file is a list of one. URLs (a prefix, a URL glob, an
    object or a list of them) are listed through ``storage`` (a ``naiad.Storage`` or its
    filesystem options), their bytes left on the server until :meth:`VideoFiles.fetch`.

    Raises:
        SourceError: no such file or folder, a glob that matches nothing, a class folder without
            videos, a folder behind a URL that holds no video: naming it, as ``read_videos`` does.
    """
    from naiad.sources.images import listing_paths
    from naiad.sources.videos import read_videos

    if isinstance(src, (str, os.PathLike)):
        text = os.fspath(src)
        if is_remote(text):
            single = not _is_url_folder(text) and not is_url_glob(text)
        else:
            text = local_path(text)
            single = not os.path.isdir(text) and not any(c in text for c in "*?[")
        src = [text] if single else text
    try:
        source = read_videos(src, storage=storage)
    except SourceError as exc:
        if isinstance(src, str) and is_remote(src) and "holds no video file" in str(exc):
            # A prefix is taken for a video folder by its name alone (is_video_source): say how
            # to name the tables or shards it may hold instead.
            said = str(exc).removeprefix(f"{exc.path}: ").rstrip(".")
            raise SourceError(f"{said}; to inspect or convert the tables or shards under a prefix, name them "
                              f"with a glob ({src.rstrip('/')}/*.parquet, .../*.tar).", path=exc.path) from None
        raise
    listing = source.listing()
    count = len(listing["labels"])
    sep = "/" if is_remote(source.root) else os.sep
    paths = listing_paths(listing, np.arange(count, dtype=np.int64), source.root, sep).tolist() if count else []
    return VideoFiles(root=source.root, paths=[str(p) for p in paths], labels=listing["labels"].copy(),
                      sizes=listing["sizes"].copy(), classes=list(source.classes), source=source)
