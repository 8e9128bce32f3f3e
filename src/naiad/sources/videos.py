"""A video folder: one video file per sample, labels from class sub-folders (the Kinetics and UCF101
layout) as torchvision's ImageFolder gives them: ``naiad.read_videos``.

It is the image folder's reader (``sources/images.py``: the listing made once and kept, NOTE [
Folder listing ]; blocks of runs of files; bad files named or skipped) listing video files into a
``video`` column: the files reach the batch as bytes, and ``naiad.decode_video`` decodes only the
clips it needs of them, in the workers (``media/video.py``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from naiad.errors import ConfigError, SourceError
from naiad.sources.images import MediaFolderSource
from naiad.sources.index import IndexDir
from naiad.sources.options import BadRows, StorageLike, old_storage
from naiad.sources.remote_listing import is_url_glob, pack_names, url_folder, url_listing
from naiad.sources.storage import Storage, is_remote
from naiad.trust.paths import MediaAccess

__all__ = ["VIDEO_EXTENSIONS", "VideoFolderSource", "read_videos"]

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg", ".ogv", ".flv", ".3gp")
"""The file name endings listed, matched in any case: the containers FFmpeg demuxes that video
datasets ship in (Kinetics: ``.mp4``/``.webm``/``.mkv``; UCF101 and HMDB51: ``.avi``)."""

LISTING_PARAMS: Mapping[str, Any] = {"kind": "video-folder", "version": 1, "extensions": list(VIDEO_EXTENSIONS)}


class VideoFolderSource(MediaFolderSource):
    """A lazy source over a folder of videos, in class sub-folders or flat: one sample per file,
    in blocks of runs of files: ``naiad.read_videos``.

    With one sub-folder per class (``root/archery/v1.mp4``, ``root/bowling/v2.avi``) the samples
    are labelled as ``torchvision.datasets.ImageFolder`` labels a folder: classes sorted by name,
    numbered from 0 (``source.class_to_idx``), files in sorted order, sub-folders included. A
    folder with no sub-folder is read flat, without labels. Columns: ``video`` (the file's bytes,
    to decode with ``naiad.decode_video``), ``label`` (int64; class folders only) and ``path``
    (str). The listing is kept as an image folder's (NOTE [ Folder listing ]).

    A glob (``"clips/*.mp4"``, ``"**"`` included) or a list of files is read as a flat folder
    of those files, in sorted order (a glob's) or the list's, without labels; its listing is made
    at construction and not kept (the files are named already: no folder walk to save).

    Behind URLs the same: a folder (``"s3://bucket/ucf101/train/"``, a prefix whose sub-prefixes
    are the classes), a URL glob (``"s3://bucket/clips/*.mp4"``) or a list of URLs of one
    bucket, listed when the source is made and read through ``storage`` as an image folder's
    (NOTE [ Remote folder listing ]).

    Args:
        root: the folder (local or a URL), a glob of video files (local or a URL glob), or a
            list of their paths (all local, or all URLs of one bucket).
        on_bad_rows: what a file that cannot be read (removed since it was listed, or larger than
            ``media.max_bytes``) does: as every reader's (:class:`~naiad.Source`). A file that
            reads but does not decode is the decode's to report (``naiad.decode_video``).
        block_bytes, index_dir, storage: as :class:`~naiad.sources.images.ImageFolderSource`'s.
        media: a :class:`~naiad.trust.paths.MediaAccess` whose ``max_bytes`` is the most bytes one
            file may hold (None: 256 MiB; a longer video needs a larger one).

    Attributes:
        root, classes, class_to_idx: as an image folder's (labels as torchvision's ImageFolder).

    Example:
        >>> ds = naiad.read_videos("kinetics/train/")  # doctest: +SKIP
        >>> loader = naiad.DataLoader(ds, batch_size=8, shuffle=True, num_workers=4,
        ...                           transform=naiad.decode_video("video", frames=16, size=112, crop="random"))  # doctest: +SKIP
        >>> clips = naiad.read_videos("s3://bucket/clips/*.mp4", storage={"anon": True})  # doctest: +SKIP
    """

    extensions = VIDEO_EXTENSIONS
    column = "video"
    noun = "video"
    listing_params = LISTING_PARAMS
    reader_name = "read_videos"

    def __init__(self, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, on_bad_rows: BadRows = "raise",
                 block_bytes: int | None = None, index_dir: IndexDir = None, media: MediaAccess | None = None,
                 storage: StorageLike = None, **deprecated: Any) -> None:
        storage = old_storage(self.reader_name, storage, deprecated)
        # The objects a URL glob or list names are stat'ed on a Storage of their own, dropped once
        # listed: the source's keeps no entry per object (NOTE [ Remote folder listing ]).
        self._lister: Storage | None = Storage.of(storage)
        self._files = _named_files(root, self._lister)
        self._matched = isinstance(root, (str, os.PathLike)) and self._files is not None  # a glob's: the server's answer
        # A glob's or a list's files are read as a flat folder of their closest common folder.
        folder = root if self._files is None else _common_folder(self._files)
        super().__init__(folder, on_bad_rows=on_bad_rows, block_bytes=block_bytes,  # type: ignore[arg-type]
                         index_dir=index_dir, media=media, storage=storage, **deprecated)
        self._lister = None  # listed: what it recorded is the listing's arrays now

    def listing(self) -> dict[str, np.ndarray]:
        """The files, labels and sizes: a folder's kept listing (NOTE [ Folder listing ]) or a
        prefix's (NOTE [ Remote folder listing ]), or the named files' (a glob or a list), made
        once."""
        if self._files is None:
            return super().listing()
        if self._listing is None:
            if is_remote(self.root):
                self._listing = url_listing(self._lister or self.storage, self._files, self.root, glob=self._matched)
            else:
                self._listing = _listing_of(self._files, self.root)
        return self._listing


def _common_folder(files: list[str]) -> str:
    if files and is_remote(files[0]):
        return url_folder(files)
    return os.path.commonpath([os.path.dirname(f) for f in files])


def _named_files(root: Any, lister: Storage) -> list[str] | None:
    """The files a glob or a list names, as absolute paths or URLs (None: ``root`` is a folder);
    the objects of URLs stat'ed through ``lister`` (a URL glob's in its listing)."""
    if isinstance(root, (str, os.PathLike)):
        text = os.fspath(root)
        if is_remote(text):
            return lister.expand(text) if is_url_glob(text) else None
        if not any(c in text for c in "*?["):
            return None
        files = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise SourceError("the glob matches no file.", path=text)
    elif isinstance(root, Sequence) and root:
        files = [os.fspath(p) for p in root]
        remote = [is_remote(f) for f in files]
        if any(remote):
            if not all(remote):
                raise ConfigError("`root` lists both local files and URLs; give a list of one kind.")
            if len(files) > 1:
                lister.expand_many(files)  # one listing per folder, not a HEAD per object
            return files
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise SourceError(f"not a file ({len(missing)} of the {len(files)} listed; the first shown).", path=missing[0])
    else:
        raise ConfigError(f"`root` must be a folder, a glob or a non-empty list of video files, got {root!r:.200}.")
    return [os.path.abspath(f) for f in files]


def _listing_of(files: list[str], root: str) -> dict[str, np.ndarray]:
    """A flat listing of ``files`` under ``root``, in the arrays a folder's listing has."""
    ends, blob = pack_names([os.path.relpath(f, root) for f in files])
    return {
        "classes": np.zeros(0, "<U1"),
        "labels": np.full(len(files), -1, np.int64),
        "sizes": np.array([os.stat(f).st_size for f in files], np.int64),
        "path_ends": ends,
        "path_bytes": blob,
        "dirs": np.array([root], dtype=str),
        "dir_mtimes": np.array([os.stat(root).st_mtime_ns], np.int64),
    }


read_videos = VideoFolderSource
