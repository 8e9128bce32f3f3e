"""An image folder: one file per sample, labels from class sub-folders as torchvision's ImageFolder.

NOTE [ Folder listing ]
A folder of a million images costs a million directory entries and a ``stat`` each to list (1-3
s from a warm disk, minutes on a network mount), and every rank and process that lists it again
pays it again. So the listing is made once and kept like the block index (NOTE [ Block index ]
in index.py): the files' paths (relative to the root, one UTF-8 blob and its offsets), labels
and sizes as an ``.npz`` of plain arrays in the index folder, keyed by the root's real path,
and used while every listed folder's modification time is the one recorded (adding, removing or
renaming a file changes its folder's). The listing is a few NumPy arrays, so it travels to
process workers inside the source, and a block (a run of files) reads its files without a
Python object per file until their bytes. A folder behind a URL is a prefix, listed in each
process that makes the source and never kept (no folder modification times tell a kept one is
stale), its objects fetched through the source's Storage (NOTE [ Remote folder listing ] in
remote_listing.py).

The files are ordered and labelled as ``torchvision.datasets.ImageFolder`` orders and labels
them, so a model trained on either gets the same classes: the classes are the root's
sub-folders, sorted by name, numbered from 0 (``class_to_idx``); each class's files are those of
its folder and its sub-folders (links followed), walked in sorted order, whose names end (in any
case) with one of torchvision's ``IMG_EXTENSIONS``; a class with no such file is an error, as in
torchvision. A root without sub-folders is a flat folder: its own image files, with no ``label``
column (``class_to_idx`` empty): a label of -1 would pass unseen into a loss that ignores it.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources.base import Source
from naiad.sources.columns import Columns
from naiad.sources.contract import Block, BlockData, GroupPart, bad_entry
from naiad.sources.index import IndexDir, check_index_dir, load_arrays, save_arrays
from naiad.sources.media import media_access
from naiad.sources.options import BadRows, StorageLike
from naiad.sources.remote_listing import fetch_objects, list_prefix, object_infos, pack_names
from naiad.sources.samples import grid_blocks, indices, sample_block_bytes
from naiad.sources.storage import is_remote, local_path
from naiad.trust.listings import MAX_LISTED_BYTES, check_listing
from naiad.trust.paths import MediaAccess, decode_names, encode_name, read_local_file, walk_once

__all__ = ["IMG_EXTENSIONS", "MAX_LISTED_BYTES", "ImageFolderSource", "MediaFolderSource", "read_images"]

_LOG = logging.getLogger("naiad.index")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""torchvision's ``datasets.folder.IMG_EXTENSIONS`` (torchvision 0.28), matched in any case."""

LISTING_PARAMS: Mapping[str, Any] = {"kind": "image-folder", "version": 2, "extensions": list(IMG_EXTENSIONS)}


class MediaFolderSource(Source):
    """A folder of media files, one sample per file, in class sub-folders or flat (NOTE [ Folder
    listing ]); what it lists is set by class attributes, so :class:`ImageFolderSource` lists
    images and ``naiad.read_videos`` (``sources/videos.py``) video files. Its arguments and
    instance attributes are :class:`ImageFolderSource`'s.

    Attributes (of the class):
        extensions: the file name endings listed, matched in any case.
        column: the bytes column's name.
        noun: what one file is, in messages.
        listing_params: what the kept listing is keyed by besides the root: a listing kept by
            another kind of folder reader is not this one's.
    """

    extensions: tuple[str, ...] = IMG_EXTENSIONS
    column = "image"
    noun = "image"
    listing_params: Mapping[str, Any] = LISTING_PARAMS

    reader_name = "read_images"

    def __init__(self, root: str | os.PathLike[str], *, on_bad_rows: BadRows = "raise", block_bytes: int | None = None,
                 index_dir: IndexDir = None, media: MediaAccess | None = None, storage: StorageLike = None,
                 **deprecated: Any) -> None:
        text = os.fspath(root)
        remote = is_remote(text)
        if remote and not text.split("://", 1)[1].strip("/"):
            raise ConfigError(f"`root` must name a folder of {self.noun}s (a bucket or a prefix in one), got {text!r}.")
        text = text.rstrip("/") if remote else local_path(text)
        if block_bytes is not None and (isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1):
            raise ConfigError(f"`block_bytes` must be an int >= 1 or None, got {block_bytes!r}.")
        access = media_access(media)
        if access.roots:
            raise ConfigError(f"`media` roots {list(access.roots)} do not apply to an {self.noun} folder, which reads only "
                              "the files under its root; give MediaAccess(max_bytes=...) alone.")
        super().__init__([text if remote else os.path.abspath(text)], on_bad_rows=on_bad_rows, storage=storage,
                         expand=False, deprecated=deprecated)
        if not remote and not os.path.isdir(text):
            raise SourceError(f"not a folder: `root` must be a folder of {self.noun}s (or of class folders).", path=text)
        self.root = self.paths[0]
        self.max_media_bytes = access.max_bytes
        self.block_bytes = block_bytes
        self.index_dir = check_index_dir(index_dir)
        self._listing: dict[str, np.ndarray] | None = None
        listing = self.listing()
        self.classes: list[str] = [str(c) for c in listing["classes"].tolist()]
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        self.schema()

    # -- the listing --------------------------------------------------------------------------

    def _list_files(self) -> dict[str, np.ndarray]:
        """The folder listed now (NOTE [ Folder listing ])."""
        return _list_folder(self.root, self.extensions, self.noun)

    def listing(self) -> dict[str, np.ndarray]:
        """The files, labels and sizes (NOTE [ Folder listing ]): kept, or listed now and kept; a
        folder behind a URL listed now, never kept (NOTE [ Remote folder listing ])."""
        if self._listing is None and is_remote(self.root):
            t0 = time.perf_counter()
            self._listing = list_prefix(self.storage, self.root, self.extensions, self.noun)
            _LOG.info("naiad: listed %s: %d files in %.2f s (a prefix: listed by each process that makes the source).",
                      self.root, len(self._listing["labels"]), time.perf_counter() - t0)
        elif self._listing is None:
            stored = load_arrays(self.index_dir, self.root, self.listing_params)
            why = None if stored is None else check_listing(stored, self.root)
            if stored is not None and why is None:
                self._listing = stored
                _LOG.debug("naiad: reused the kept listing of %s (%d files).", self.root, len(stored["labels"]))
            else:
                t0 = time.perf_counter()
                self._listing = self._list_files()
                _LOG.info("naiad: listed %s: %d files in %.2f s (%s).", self.root, len(self._listing["labels"]),
                          time.perf_counter() - t0, "none kept" if stored is None else f"the kept listing was refused: {why}")
                save_arrays(self.index_dir, self.root, self.listing_params, self._listing)
        return self._listing

    def __len__(self) -> int:
        return len(self.listing()["labels"])

    def known_rows(self) -> int | None:
        """The files listed (the listing is made at construction)."""
        return len(self)

    # -- the format contract ------------------------------------------------------------------

    def _read_schema(self) -> pa.Schema:
        fields = [pa.field(self.column, pa.binary())]
        if self.classes:
            fields.append(pa.field("label", pa.int64()))
        fields.append(pa.field("path", pa.string()))
        return pa.schema(fields)

    def _file_blocks(self, path: str) -> list[Block]:
        # Each file weighs at least a byte on the grid (an empty file at the end of the listing
        # would start at the grid's end, in no block, and never be read), and at most what a read
        # takes of it (a larger one is a bad row): the grid stays a few blocks a file.
        sizes = np.maximum(self._sizes(), 1)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        total = int(sizes.sum())
        step = self.block_bytes or sample_block_bytes(total)
        return [b for b in grid_blocks(path, starts, total, step) if b.rows]

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        return self._read_files(np.arange(block.first_line + lo, block.first_line + hi, dtype=np.int64))

    def _read_rows_many(self, parts: list[tuple[Block, np.ndarray]], use_threads: bool) -> BlockData:
        rows = np.concatenate([block.first_line + r for block, r in parts])
        return self._read_files(rows)

    def _read_group(self, parts: list[GroupPart], use_threads: bool) -> BlockData:
        # A group's files in one read: an object's round trips overlap across the whole group.
        rows = np.concatenate([b.first_line + (np.arange(lo, hi, dtype=np.int64) if take is None else lo + take)
                               for b, lo, hi, take in parts])
        return self._read_files(rows)

    def _sizes(self) -> np.ndarray:
        """The files' sizes as a read takes them: a larger file than ``media.max_bytes`` is a
        bad row, so it weighs no more than that (and a kept listing's sizes sum bounded)."""
        sizes: np.ndarray = np.minimum(self.listing()["sizes"], self.max_media_bytes + 1)
        return sizes

    def sample_bytes(self) -> int | None:
        """The files' mean size."""
        sizes = self._sizes()
        return max(1, int(sizes.sum()) // max(len(sizes), 1))

    def parsed_bytes(self) -> int:
        """The files' bytes together."""
        return int(self._sizes().sum())

    def empty_columns(self) -> Columns:
        """Zero rows of every column."""
        out: Columns = {self.column: np.zeros(0, object)}
        if self.classes:
            out["label"] = np.zeros(0, np.int64)
        out["path"] = np.zeros(0, object)
        return out

    def _read_files(self, rows: np.ndarray) -> BlockData:
        """Files ``rows`` (numbers in the listing): their bytes, labels and paths (URLs behind one)."""
        listing = self.listing()
        remote = is_remote(self.root)
        paths = listing_paths(listing, rows, self.root, "/" if remote else os.sep)
        names: list[str] = paths.tolist()
        read = (fetch_objects(self.storage, names, object_infos(listing, rows), self.max_media_bytes, self.noun)
                if remote else [_local_bytes(p, self.max_media_bytes, self.noun) for p in names])
        images: list[bytes | None] = []
        bad: list[dict[str, Any]] = []
        for i, (p, got) in enumerate(zip(names, read)):
            if isinstance(got, bytes):
                images.append(got)
                continue
            if self.on_bad_rows == "raise":
                raise SourceError(f"{got}{'' if got.endswith('?') else '.'} Pass on_bad_rows='skip' to skip such files.",
                                  path=p)
            images.append(None)
            bad.append(bad_entry(i, p, got, row=int(rows[i]), column=self.column))
        columns: Columns = {self.column: np.fromiter(images, object, count=len(images))}
        if self.classes:
            columns["label"] = listing["labels"][rows]
        columns["path"] = paths
        if bad:
            keep = np.ones(len(rows), bool)
            keep[[e["at"] for e in bad]] = False
            columns = {k: v[keep] for k, v in columns.items()}
        return BlockData(columns, tuple(bad))


class ImageFolderSource(MediaFolderSource):
    """A lazy source over a folder of images, in class sub-folders or flat: one sample per
    file, in blocks of runs of files: ``naiad.read_images``.

    With one sub-folder per class (``root/cat/1.jpg``, ``root/dog/2.png``) the samples are
    labelled as ``torchvision.datasets.ImageFolder`` labels them: classes sorted by name,
    numbered from 0 (``source.class_to_idx``), files in sorted order, the same extensions
    (NOTE [ Folder listing ]). A folder with no sub-folder is read flat, without labels. Columns:
    ``image`` (the file's bytes, to decode), ``label`` (int64; class folders only) and
    ``path`` (str: the file's path, or its URL). The listing is made once and kept like the
    block index, so a million files are not listed again every epoch, rank or process. The root
    is the source's one "file" (its ``paths``), its blocks runs of the files listed under it.

    A folder behind a URL (``"s3://bucket/train/"``) is a prefix: its sub-prefixes are the
    classes, as sub-folders are, and its objects are listed with one recursive listing when the
    source is made (in each process that makes it: it is not kept), checked as the server's
    answer, and read whole through ``storage`` (retries, the local cache), a few at a time
    (NOTE [ Remote folder listing ]).

    Args:
        root: the folder: a local one, or a URL (a bucket or a prefix in one).
        on_bad_rows: what a file that cannot be read (removed since it was listed, or larger
            than ``media.max_bytes``) does: as every reader's (:class:`~naiad.Source`).
        block_bytes: about how many bytes of files a block holds (None: about 1/4096 of the
            folder, between 1 MiB and 32 MiB).
        index_dir: where the listing of a local folder is kept, as every reader's ("beside":
            next to ``root``).
        media: a :class:`~naiad.trust.paths.MediaAccess` whose ``max_bytes`` is the most bytes
            one file may hold (None: 256 MiB); a folder reads only the files under it, so its
            ``roots`` must be empty.
        storage: where the objects of a URL live and how they are fetched, as every reader
            takes it (:class:`~naiad.Source`): a ``naiad.Storage`` (its ``cache_dir`` keeps the
            fetched objects for later epochs) or a dict of the filesystem's options.

    Attributes:
        root: the folder (a URL without its trailing ``/``).
        classes: the class names, sorted (empty for a flat folder).
        class_to_idx: class name -> label, as ImageFolder's.

    Example:
        >>> ds = naiad.read_images("train/")  # doctest: +SKIP
        >>> ds.class_to_idx  # doctest: +SKIP
        {'cat': 0, 'dog': 1}
        >>> remote = naiad.read_images("s3://bucket/train/", storage=naiad.Storage(cache_dir="auto"))  # doctest: +SKIP
    """

    reader_name = "read_images"

    def _list_files(self) -> dict[str, np.ndarray]:
        return _list_folder(self.root)  # the module's function, as tests count its calls


def listing_paths(listing: Mapping[str, np.ndarray], rows: np.ndarray, root: str, sep: str = os.sep) -> np.ndarray:
    """The full paths (or URLs, ``sep`` "/") of files ``rows`` as an object array of str (Arrow
    slices the blob)."""
    import pyarrow.compute as pc  # on first use: its import is a third of naiad's
    ends = listing["path_ends"]
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    arr = pa.Array.from_buffers(pa.large_string(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(listing["path_bytes"])])
    rel = arr.take(indices(rows)).view(pa.large_binary())  # names kept as bytes (NOTE [ Names as bytes ])
    joined = pc.binary_join_element_wise(pa.scalar(encode_name(root), pa.large_binary()), rel,
                                         pa.scalar(sep.encode(), pa.large_binary()))
    return decode_names(joined)


def _list_folder(root: str, extensions: tuple[str, ...] = IMG_EXTENSIONS, noun: str = "image") -> dict[str, np.ndarray]:
    """List ``root`` as ImageFolder does (NOTE [ Folder listing ]): the arrays that are kept. Each
    class folder's walk visits every folder once (``trust.walk_once``: a link that loops is
    walked once), and only regular files whose names end with one of ``extensions`` are listed
    (``noun`` names such a file in errors)."""
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    classes = [e.name for e in entries if e.is_dir()]
    rel: list[str] = []
    labels: list[int] = []
    sizes: list[int] = []
    dirs: list[str] = [root]
    if classes:
        for label, name in enumerate(classes):
            count = len(rel)
            for folder, files in sorted(walk_once(os.path.join(root, name)), key=lambda walked: walked[0]):
                dirs.append(folder)
                for entry in sorted(files, key=lambda e: e.name):
                    if entry.name.lower().endswith(extensions):
                        rel.append(os.path.relpath(entry.path, root))
                        labels.append(label)
                        sizes.append(_size(entry))
            if len(rel) == count:
                raise SourceError(f"the class folder {name!r} holds no {noun} file (extensions {', '.join(extensions)}); "
                                  f"remove it or add its {noun}s, as torchvision's ImageFolder requires.",
                                  path=os.path.join(root, name))
    else:
        for e in entries:
            if e.name.lower().endswith(extensions) and e.is_file():
                rel.append(e.name)
                labels.append(-1)
                sizes.append(_size(e))
        if not rel:
            raise SourceError(f"the folder holds no {noun} file (extensions {', '.join(extensions)}) and no class "
                              "folder.", path=root)
    ends, blob = pack_names(rel)
    return {
        "classes": np.array(classes, dtype=str) if classes else np.zeros(0, "<U1"),
        "labels": np.array(labels, np.int64),
        "sizes": np.array(sizes, np.int64),
        "path_ends": ends,
        "path_bytes": blob,
        "dirs": np.array(dirs, dtype=str),
        "dir_mtimes": np.array([os.stat(d).st_mtime_ns for d in dirs], np.int64),
    }


def _local_bytes(path: str, max_bytes: int, noun: str) -> bytes | str:
    """A local file's bytes (a regular file, bounded), or why it is a bad row."""
    try:
        return read_local_file(path, max_bytes)
    except OSError as exc:
        return f"cannot read the {noun} ({exc.strerror or exc})" + (
            "; was it removed since the folder was listed?" if exc.errno == errno.ENOENT else "")


def _size(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_size
    except OSError:
        return 0  # read later, where a missing file is named


read_images = ImageFolderSource
