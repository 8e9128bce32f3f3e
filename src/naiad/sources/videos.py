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
from naiad.sources.options import BadRows
from naiad.sources.storage import is_remote
from naiad.trust.paths import MediaAccess, encode_name

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

    Args:
        root: the folder (local), a glob of video files, or a list of their paths.
        on_bad_rows: what a file that cannot be read (removed since it was listed, or larger than
            ``media.max_bytes``) does: as every reader's (:class:`~naiad.Source`). A file that
            reads but does not decode is the decode's to report (``naiad.decode_video``).
        block_bytes, index_dir: as :class:`~naiad.sources.images.ImageFolderSource`'s.
        media: a :class:`~naiad.trust.paths.MediaAccess` whose ``max_bytes`` is the most bytes one
            file may hold (None: 256 MiB; a longer video needs a larger one).

    Attributes:
        root, classes, class_to_idx: as an image folder's (labels as torchvision's ImageFolder).

    Example:
        >>> ds = naiad.read_videos("kinetics/train/")  # doctest: +SKIP
        >>> loader = naiad.DataLoader(ds, batch_size=8, shuffle=True, num_workers=4,
        ...                           transform=naiad.decode_video("video", frames=16, size=112, crop="random"))  # doctest: +SKIP
    """

    extensions = VIDEO_EXTENSIONS
    column = "video"
    noun = "video"
    listing_params = LISTING_PARAMS
    reader_name = "read_videos"

    def __init__(self, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, on_bad_rows: BadRows = "raise",
                 block_bytes: int | None = None, index_dir: IndexDir = None, media: MediaAccess | None = None,
                 **deprecated: Any) -> None:
        self._files = _named_files(root)
        # A glob's or a list's files are read as a flat folder of their closest common folder.
        folder = root if self._files is None else os.path.commonpath([os.path.dirname(f) for f in self._files])
        super().__init__(folder, on_bad_rows=on_bad_rows, block_bytes=block_bytes,  # type: ignore[arg-type]
                         index_dir=index_dir, media=media, **deprecated)

    def listing(self) -> dict[str, np.ndarray]:
        """The files, labels and sizes: a folder's kept listing (NOTE [ Folder listing ]), or the
        named files' (a glob or a list), made once."""
        if self._files is None:
            return super().listing()
        if self._listing is None:
            self._listing = _listing_of(self._files, self.root)
        return self._listing


def _named_files(root: Any) -> list[str] | None:
    """The files a glob or a list names, as absolute paths (None: ``root`` is a folder)."""
    if isinstance(root, (str, os.PathLike)):
        text = os.fspath(root)
        if is_remote(text) or not any(c in text for c in "*?["):
            return None
        files = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not files:
            raise SourceError("the glob matches no file.", path=text)
    elif isinstance(root, Sequence) and root:
        files = [os.fspath(p) for p in root]
        if any(is_remote(f) for f in files):
            raise ConfigError("`root` lists URLs; video files behind URLs are not read yet: pack them into tar shards "
                              "and use naiad.read_webdataset.")
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise SourceError(f"not a file ({len(missing)} of the {len(files)} listed; the first shown).", path=missing[0])
    else:
        raise ConfigError(f"`root` must be a folder, a glob or a non-empty list of video files, got {root!r:.200}.")
    return [os.path.abspath(f) for f in files]


def _listing_of(files: list[str], root: str) -> dict[str, np.ndarray]:
    """A flat listing of ``files`` under ``root``, in the arrays a folder's listing has."""
    blobs = [encode_name(os.path.relpath(f, root)) for f in files]
    return {
        "classes": np.zeros(0, "<U1"),
        "labels": np.full(len(files), -1, np.int64),
        "sizes": np.array([os.stat(f).st_size for f in files], np.int64),
        "path_ends": np.cumsum(np.fromiter(map(len, blobs), np.int64, count=len(blobs))).astype(np.int64),
        "path_bytes": np.frombuffer(b"".join(blobs), np.uint8).copy(),
        "dirs": np.array([root], dtype=str),
        "dir_mtimes": np.array([os.stat(root).st_mtime_ns], np.int64),
    }


read_videos = VideoFolderSource
