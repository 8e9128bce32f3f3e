"""``naiad convert`` for videos: a video folder (``naiad.read_videos``' layouts: class folders, a
flat folder, a glob) to WebDataset tar shards, each video copied as it is or re-encoded to H.264
with a given keyframe interval and a largest shorter side. docs/VIDEO.md, "Convert".

NOTE [ Video shards ]
A sample is two members, as WebDataset writes a labelled video: ``<key>.mp4`` (the video's
bytes; a video copied keeps its own extension, ``.avi``, ``.mkv``...) and ``<key>.cls`` (its
class number in decimal, from the class folder as ``read_videos`` numbers it; none without
class folders). The key is the file's path under the root without its extension
(``archery/v_001``), a dot in its last part made ``_`` (WebDataset cuts a key at the first dot of
its base name) and, where two files would share one (``a.mp4`` and ``a.avi``), the later given
``_<ext>``. ``naiad.read_webdataset`` + ``naiad.decode_video("mp4")`` and the ``webdataset``
library read them. A shard is closed before the sample that would take it past ``shard_bytes``
(tar headers, padding and the end-of-archive record counted), so no shard is larger unless one
video alone is; ``samples_per_shard`` also bounds it. Shards are numbered (``train-00000.tar``)
and written as every convert writes them (NOTE [ Atomic shards ] in convert_write.py), with a
manifest that also lists the classes.

Re-encoding (``keyframe_interval`` or ``max_size``; tools/video_encode.py, NOTE [ Re-encoded
audio ]): every frame is decoded in presentation order and encoded again with libx264 (yuv420p),
a constant-rate video's frame ``i`` stamped ``i / fps`` at its average frame rate, a
variable-rate one's keeping its own timestamp, so the frame count and each frame's number
(``decode_video``'s ``_frames``) are kept, and the keyframes fall every ``keyframe_interval``
frames exactly (x264's scene cuts off). The audio is kept: copied where MP4 holds its codec,
else encoded to AAC. ``max_size`` bounds the shorter side (the aspect kept, sides even, as
yuv420p needs); a video no larger is copied as it is unless a keyframe interval is asked for.
Videos re-encode in parallel on the decode threads (NOTE [ Decode threads ] in media/rows.py),
each encoder on one thread; a video that fails is a bad row, raised naming its file or, with
``on_bad_rows="skip"``, skipped and counted in the manifest.
"""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from naiad.errors import ConfigError, SourceError
from naiad.media.rows import default_threads, run_rows
from naiad.sources.options import StorageLike
from naiad.sources.storage import Storage
from naiad.tools.convert import ConvertResult
from naiad.tools.convert_samples import safe_key, utf8_name
from naiad.tools.convert_tar import TarShardSet
from naiad.tools.convert_write import Destination, format_of
from naiad.tools.video_encode import reencode
from naiad.tools.video_files import VideoFiles, list_videos, pyav_for
from naiad.trust.paths import DEFAULT_MAX_MEDIA_BYTES, read_local_file

__all__ = ["VideoConvertOptions", "convert_videos", "reencode"]

MANIFEST_VERSION = 1
MIN_SHARD_BYTES = 16 << 10  # a tar holds at least its end-of-archive record (10 KiB)
_BLOCK = tarfile.BLOCKSIZE
_END = 2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE  # the end-of-archive blocks, then padding to a record
_BAD_EXAMPLES = 20

ProgressFn = Callable[[str, int, int, int], None]


@dataclass(frozen=True)
class VideoConvertOptions:
    """How :func:`convert_videos` writes (NOTE [ Video shards ]).

    Attributes:
        keyframe_interval: re-encode every video with a keyframe every this many frames (None:
            copy, unless ``max_size`` makes it smaller).
        max_size: re-encode videos whose shorter side is larger to this shorter side.
        crf: the H.264 quality of a re-encode (x264's constant rate factor: 0 lossless, 23 its
            default, lower is better and larger).
        shard_bytes: the most bytes a shard holds (a video larger alone gets its own shard).
        samples_per_shard: the most videos a shard holds (None: bytes alone bound it).
        shuffle, seed: write the videos in a seeded permutation (so a shard mixes the classes).
        on_bad_rows: "raise" (a SourceError naming the file) or "skip" (counted in the manifest).
        overwrite: replace shards and a manifest already at the destination.
        threads: videos re-encoded at once (None: the usable cores).
        storage_options: fsspec options for a URL destination.
    """

    keyframe_interval: int | None = None
    max_size: int | None = None
    crf: int = 23
    shard_bytes: int = 1 << 30
    samples_per_shard: int | None = None
    shuffle: bool = False
    seed: int = 0
    on_bad_rows: Literal["raise", "skip"] = "raise"
    overwrite: bool = False
    threads: int | None = None
    storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("keyframe_interval", "max_size", "samples_per_shard", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"`{name}` must be an int >= 1 or None, got {value!r}.")
        if isinstance(self.crf, bool) or not isinstance(self.crf, int) or not 0 <= self.crf <= 51:
            raise ConfigError(f"`crf` must be an int from 0 to 51 (x264's quality scale), got {self.crf!r}.")
        if not isinstance(self.shard_bytes, int) or self.shard_bytes < MIN_SHARD_BYTES:
            raise ConfigError(f"`shard_bytes` must be at least {MIN_SHARD_BYTES:,} (16 KiB), got {self.shard_bytes!r}.")
        if self.on_bad_rows not in ("raise", "skip"):
            raise ConfigError(f"`on_bad_rows` must be 'raise' or 'skip', got {self.on_bad_rows!r}.")

    @property
    def reencodes(self) -> bool:
        """Whether videos may be re-encoded (a keyframe interval or a size was asked for)."""
        return self.keyframe_interval is not None or self.max_size is not None


class VideoShardSet(TarShardSet):
    """Tar shards of whole samples, each closed before the sample that would take it past
    ``shard_bytes`` or ``samples_per_shard`` (NOTE [ Video shards ])."""

    def __init__(self, dest: Destination, *, shard_bytes: int, samples_per_shard: int | None) -> None:
        import pyarrow as pa

        super().__init__(dest, pa.schema([]), rows_per_shard=samples_per_shard)
        self.shard_bytes = shard_bytes
        self._estimate = 0  # the open shard's bytes as the tar will hold them (the stream buffers)

    def add_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        """Write one sample's members (``(extension, bytes)``) under ``key``."""
        names = [(f"{key}.{ext}", data) for ext, data in members]
        size = sum(_member_bytes(name, len(data)) for name, data in names)
        if self._writer is not None and self._rows and self._estimate + size + _END > self.shard_bytes:
            self._close_shard()
        if self._writer is None:
            self._open()
            self._estimate = 0
        for name, data in names:
            self._member(name, data)
        self._estimate += size
        self._rows += 1
        if self.rows_per_shard is not None and self._rows >= self.rows_per_shard:
            self._close_shard()


def _member_bytes(name: str, size: int) -> int:
    """A member's bytes in a PAX tar: its header, a PAX header first for a long or non-ASCII name,
    and its data padded to a block."""
    raw = name.encode("utf-8", "surrogateescape")
    pax = _BLOCK + -(-(len(raw) + 32) // _BLOCK) * _BLOCK if len(raw) > 100 or not name.isascii() else 0
    return pax + _BLOCK + -(-size // _BLOCK) * _BLOCK


def video_keys(files: VideoFiles) -> list[str]:
    """Each file's sample key (NOTE [ Video shards ]): unique, in the listing's order."""
    keys: list[str] = []
    seen: set[str] = set()
    for i in range(len(files)):
        rel = files.name(i)
        stem, ext = os.path.splitext(rel)
        key = safe_key(stem)
        if key in seen:
            key = f"{key}_{ext.lstrip('.').lower()}"
        while key in seen:
            key += "_"
        seen.add(key)
        keys.append(key)
    return keys


def convert_videos(src: str | Sequence[str], dst: str, options: VideoConvertOptions | None = None, *,
                   progress: ProgressFn | None = None, storage: StorageLike = None) -> ConvertResult:
    """Convert a video folder, glob or list of files to WebDataset tar shards at ``dst`` (NOTE
    [ Video shards ]): ``dst`` is a file name (``out/train.tar``: ``train-00000.tar``, ...) or a
    folder (``out/``: ``part-00000.tar``, ...); a manifest is written last. ``src`` may be URLs
    (a prefix, a URL glob, a list), listed and fetched through ``storage`` (a ``naiad.Storage``
    or its filesystem options) as ``naiad.read_videos`` reads them; ``options.storage_options``
    is the destination's.

    Raises:
        SourceError: a video that cannot be read or re-encoded, naming it (unless
            ``on_bad_rows="skip"``); the destination cannot be written.
        ConfigError: bad options, a destination that is not tar shards, or files already at
            ``dst`` without ``overwrite``.

    Example:
        >>> convert_videos("ucf101/train", "shards/train.tar", VideoConvertOptions(keyframe_interval=16))  # doctest: +SKIP
    """
    opts = options or VideoConvertOptions()
    began = time.monotonic()
    dest, existing = _destination(dst, opts)
    files = list_videos(src, storage=storage)
    keys = video_keys(files)
    order = np.random.default_rng(opts.seed).permutation(len(files)) if opts.shuffle else np.arange(len(files))
    shards = VideoShardSet(dest, shard_bytes=opts.shard_bytes, samples_per_shard=opts.samples_per_shard)
    try:
        counts, bad, extensions = _write_videos(files, keys, order.tolist(), opts, shards, progress)
        written = shards.finish()
    except BaseException as exc:
        shards.abort()
        if isinstance(exc, OSError):
            raise SourceError(f"cannot write the shards: {type(exc).__name__}: {exc}", path=dst) from exc
        raise
    for name in existing:  # stale shards of an earlier, larger convert
        if name not in {s.file for s in written} and name != dest.manifest_name:
            dest.remove(dest.join(name))
    rows_written = sum(s.rows for s in written)
    manifest = {
        "version": MANIFEST_VERSION, "format": "webdataset", "rows": rows_written, "bad_rows": counts["bad"],
        "bad_row_examples": bad, "shards": [s.as_dict() for s in written],
        "source": {"paths": [files.root], "rows": len(files)},
        "options": {k: v for k, v in asdict(opts).items() if k != "storage_options"},
        "samples": {"key": "__key__", "videos": sorted(extensions), "classes": files.classes,
                    "reencoded": counts["reencoded"], "copied": counts["copied"]},
        "naiad": _version(),
    }
    dest.write_json(dest.manifest_name, manifest)
    return ConvertResult(written, rows_written, counts["bad"], time.monotonic() - began,
                         dest.join(dest.manifest_name), manifest)


def _destination(dst: str, opts: VideoConvertOptions) -> tuple[Destination, list[str]]:
    """Where the shards go and the files already there; ConfigError for a destination that is
    not tar shards, files there without ``overwrite``, or a re-encode without PyAV."""
    if format_of(dst, None) != "webdataset" and not dst.endswith("/") and os.path.splitext(dst)[1]:
        raise ConfigError(f"videos convert to WebDataset tar shards: give DST as out/train.tar or a folder, got {dst!r}.")
    if opts.reencodes:  # a missing PyAV fails here, before any shard is opened
        pyav_for("re-encoding videos (`naiad convert --keyframe-interval/--max-size`)")
    dest = Destination(dst, "webdataset", sharded=True, storage=Storage(opts.storage_options))
    existing = dest.existing()
    if existing and not opts.overwrite:
        raise ConfigError(f"{dest.join(existing[0])} exists; pass --overwrite (overwrite=True) to replace "
                          f"{'it' if len(existing) == 1 else f'it and {len(existing) - 1} other file(s)'}.")
    return dest, existing


def _write_videos(files: VideoFiles, keys: list[str], order: list[int], opts: VideoConvertOptions,
                  shards: VideoShardSet, progress: ProgressFn | None
                  ) -> tuple[dict[str, int], list[dict[str, Any]], set[str]]:
    """The videos in ``order`` into ``shards``, a few at a time: the counts (``reencoded``,
    ``copied``, ``bad``), the first bad videos, and the extensions written."""
    bad: list[dict[str, Any]] = []
    counts = {"reencoded": 0, "copied": 0, "bad": 0}
    extensions: set[str] = set()
    threads = opts.threads or default_threads()
    for lo in range(0, len(order), 2 * threads):  # a few videos in memory at a time
        rows = order[lo: lo + 2 * threads]
        for i, (ext, data, status) in zip(rows, _convert_some(files, keys, rows, opts, threads), strict=True):
            if data is None:
                counts["bad"] += 1
                if opts.on_bad_rows == "raise":
                    raise SourceError(f"video {keys[i]!r}: {status}; pass --on-bad-rows skip (on_bad_rows='skip') to "
                                      "leave such videos out.", path=files.paths[i])
                if len(bad) < _BAD_EXAMPLES:
                    bad.append({"file": files.paths[i], "key": keys[i], "reason": status})
                continue
            counts[status] += 1  # "reencoded" or "copied"
            members = [(ext, data)]
            if files.classes:
                members.append(("cls", str(int(files.labels[i])).encode()))
            shards.add_sample(keys[i], members)
            extensions.add(ext)
        if progress:
            progress("convert", min(lo + 2 * threads, len(order)), len(order), shards.bytes_written)
    return counts, bad, extensions


def _convert_some(files: VideoFiles, keys: list[str], rows: list[int], opts: VideoConvertOptions,
                  threads: int) -> list[tuple[str, bytes | None, str]]:
    """Videos ``rows`` read and, where asked, re-encoded, on ``threads`` threads: for each,
    ``(extension, bytes, "reencoded" or "copied")``, or ``("", None, why it failed)``."""
    out: list[tuple[str, bytes | None, str]] = [("", None, "")] * len(rows)
    # Objects behind URLs are fetched for the batch at once, a few in flight (NOTE [ Remote folder listing ]).
    fetched = files.fetch(rows) if files.remote else None

    def work(j: int) -> None:
        i = rows[j]
        path = files.paths[i]
        if not utf8_name(keys[i]):
            raise ValueError(f"its name {keys[i]!r} is not UTF-8, which a tar member's must be; rename the file")
        if fetched is not None:
            got = fetched[j]
            if isinstance(got, str):
                raise ValueError(got)
            data = got
        else:
            try:
                data = read_local_file(path, DEFAULT_MAX_MEDIA_BYTES)
            except OSError as exc:
                raise ValueError(f"cannot read the video ({exc.strerror or exc})") from None
        ext = os.path.splitext(path)[1].lstrip(".").lower()
        if opts.reencodes:
            again = reencode(data, keyframe_interval=opts.keyframe_interval, max_size=opts.max_size, crf=opts.crf)
            if again is not None:
                out[j] = ("mp4", again, "reencoded")
                return
        out[j] = (ext, data, "copied")

    for j, exc in run_rows(work, len(rows), threads).items():
        if isinstance(exc, ConfigError):
            raise exc
        out[j] = ("", None, str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")
    return out


def _version() -> str:
    from naiad._version import __version__

    return __version__

