"""What ``naiad inspect`` and ``naiad convert`` share for videos: whether a source names video
files (one file, a glob, a folder of them in ``naiad.read_videos``' layouts), their listing with
labels, and PyAV or an error naming the extra to install.

The listing is ``naiad.read_videos``' own (``sources/videos.py``: the same files, order, classes
and labels, the kept listing reused), so what inspect and convert see is what a loader reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.sources.images import IMG_EXTENSIONS
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
    """Whether ``src`` names local video files: a file or glob whose names end in a video
    extension (``.mp4``, ``.avi``... ``sources/videos.VIDEO_EXTENSIONS``), or a folder whose first
    media file (images and videos, walked in sorted order) is a video. Image folders, tables and
    URLs are not (their readers keep them)."""
    if isinstance(src, (list, tuple)):
        return bool(src) and all(isinstance(p, (str, os.PathLike)) and _is_video_name(os.fspath(p)) for p in src)
    if not isinstance(src, (str, os.PathLike)):
        return False
    text = os.fspath(src)
    if is_remote(text):
        return False
    text = local_path(text)
    if os.path.isdir(text):
        return _folder_holds_videos(text)
    return _is_video_name(text)


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
        root: the folder the files are listed under (a glob's or list's closest common folder).
        paths: each file's full path, in the reader's order.
        labels: each file's class number (-1 without class folders).
        sizes: each file's size in bytes.
        classes: the class names, sorted (empty for a flat folder, a glob or a list).
    """

    root: str
    paths: list[str]
    labels: np.ndarray
    sizes: np.ndarray
    classes: list[str]

    def __len__(self) -> int:
        return len(self.paths)


def list_videos(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> VideoFiles:
    """The video files ``src`` names, listed by ``naiad.read_videos``: a folder (class folders or
    flat), a glob or a list of files; one file is a list of one.

    Raises:
        SourceError: no such file or folder, a glob that matches nothing, a class folder without
            videos: naming it, as ``read_videos`` does.
    """
    from naiad.sources.images import listing_paths
    from naiad.sources.videos import read_videos

    if isinstance(src, (str, os.PathLike)):
        text = local_path(os.fspath(src))
        single = not os.path.isdir(text) and not any(c in text for c in "*?[")
        src = [text] if single else text
    source = read_videos(src)
    listing = source.listing()
    count = len(listing["labels"])
    paths = listing_paths(listing, np.arange(count, dtype=np.int64), source.root).tolist() if count else []
    return VideoFiles(root=source.root, paths=[str(p) for p in paths], labels=listing["labels"].copy(),
                      sizes=listing["sizes"].copy(), classes=list(source.classes))

