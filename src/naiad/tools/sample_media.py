"""What ``naiad convert`` and ``naiad inspect`` need to know about encoded samples: the format
of some bytes (by their magic numbers), an image's size from its header (Pillow reads the
header only), an image made smaller and encoded again, and whether a folder is an image folder.

Each function takes one sample; the callers spread a batch of them over the decode threads
(NOTE [ Decode threads ] in ``naiad/media/rows.py``): Pillow's decoders, resize and encoders
release the GIL.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

from naiad.errors import ConfigError
from naiad.sources.auto import READERS, _suffix
from naiad.sources.storage import is_remote, local_path

__all__ = ["ImageHeader", "image_header", "is_image_folder", "media_format", "shrink", "video_format"]

# (magic at offset 0, or a predicate, format name, file extension). The extension is what
# WebDataset's decoders key on (``jpg``, ``png``...).
_FORMATS: tuple[tuple[bytes, str, str], ...] = (
    (b"\xff\xd8\xff", "JPEG", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "PNG", "png"),
    (b"GIF87a", "GIF", "gif"),
    (b"GIF89a", "GIF", "gif"),
    (b"BM", "BMP", "bmp"),
    (b"II*\x00", "TIFF", "tiff"),
    (b"MM\x00*", "TIFF", "tiff"),
    (b"P5", "PGM", "pgm"),
    (b"P6", "PPM", "ppm"),
    (b"fLaC", "FLAC", "flac"),
    (b"OggS", "OGG", "ogg"),
    (b"\x93NUMPY", "NPY", "npy"),
)
IMAGE_FORMATS = frozenset({"JPEG", "PNG", "GIF", "BMP", "TIFF", "PGM", "PPM", "WEBP"})
"""The formats :func:`media_format` names that are images (Pillow opens them)."""

EXTENSIONS = {"JPEG": ("jpg", "jpeg"), "TIFF": ("tiff", "tif"), "WEBP": ("webp",), "WAV": ("wav",)}
"""Each format's file extensions where it has several; the first is the one written."""


def media_format(data: bytes | bytearray | memoryview | None) -> tuple[str, str] | None:
    """``(format, extension)`` of encoded bytes by their magic number (``("JPEG", "jpg")``), or
    None for bytes of no known format."""
    if not data:
        return None
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP", "webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "WAV", "wav"
    for magic, fmt, ext in _FORMATS:
        if head.startswith(magic):
            return fmt, ext
    return None


# ISO base media brands of still images (HEIF, AVIF) and of audio alone (M4A): an `ftyp` box
# that is not a video's.
_NOT_VIDEO_BRANDS = frozenset({b"avif", b"avis", b"heic", b"heix", b"hevc", b"hevx", b"mif1", b"msf1", b"M4A ",
                               b"M4B ", b"M4P "})
_MPEG_TS_PACKET = 188


def video_format(data: bytes | bytearray | memoryview | None) -> tuple[str, str] | None:
    """``(format, extension)`` of a video container by its magic number (``("MP4", "mp4")``,
    ``("Matroska", "mkv")``, ``("WebM", "webm")``, ``("AVI", "avi")``...), or None. Kept apart
    from :func:`media_format`, whose formats name the members ``naiad convert`` writes."""
    if not data:
        return None
    head = bytes(data[:64])
    if head[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free"):
        return _iso_media(head)
    if head.startswith(b"\x1a\x45\xdf\xa3"):  # EBML: the DocType says which
        return ("WebM", "webm") if b"webm" in head else ("Matroska", "mkv")
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "AVI", "avi"
    if head.startswith(b"FLV\x01"):
        return "FLV", "flv"
    if head.startswith(b"\x00\x00\x01\xba"):
        return "MPEG-PS", "mpg"
    if len(data) > 2 * _MPEG_TS_PACKET and all(data[k * _MPEG_TS_PACKET] == 0x47 for k in range(3)):
        return "MPEG-TS", "ts"
    return None


def _iso_media(head: bytes) -> tuple[str, str] | None:
    """An ISO base media file (MP4, MOV, 3GP) by its ``ftyp`` brand; QuickTime without one."""
    if head[4:8] != b"ftyp":
        return "MOV", "mov"
    brand = head[8:12]
    if brand in _NOT_VIDEO_BRANDS:
        return None
    if brand == b"qt  ":
        return "MOV", "mov"
    return ("3GP", "3gp") if brand.startswith(b"3g") else ("MP4", "mp4")


def same_format(extension: str, fmt: str) -> bool:
    """Whether a file extension (``jpeg``, ``seg.png``) names format ``fmt``."""
    last = extension.rsplit(".", 1)[-1].lower()
    return last in EXTENSIONS.get(fmt, (fmt.lower(),))


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: Pillow's format name, width, height and mode."""

    format: str
    width: int
    height: int
    mode: str


def pillow() -> Any:
    """``PIL.Image``, or a ConfigError naming the extra to install."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ConfigError("images need Pillow, which is not installed: pip install 'naiad[images]'.") from exc
    return Image


def image_header(data: bytes | memoryview) -> ImageHeader:
    """The image's format, size and mode from its header, without decoding its pixels.

    Raises:
        ValueError: not an image Pillow can open (the reason says what the bytes begin with).
    """
    image_mod = pillow()
    try:
        with image_mod.open(io.BytesIO(data)) as image:
            return ImageHeader(str(image.format), int(image.width), int(image.height), str(image.mode))
    except image_mod.UnidentifiedImageError:
        raise ValueError(f"not an image Pillow can read ({len(data)} bytes beginning {bytes(data[:8])!r})") from None


def shrink(data: bytes | memoryview, max_size: int, quality: int) -> bytes | None:
    """The image made smaller so that its longer side is ``max_size``, encoded again: JPEG as
    JPEG at ``quality`` (its EXIF and ICC profile kept), anything else as PNG (lossless). None
    when the image is no larger than that already (its bytes are kept as they are).

    A JPEG is decoded already reduced in the DCT (``Image.draft``: by the largest power of two
    that keeps it at least the target size), as naiad's decoder does, then resized with
    Pillow's antialiased Lanczos filter.

    Raises:
        ValueError: the bytes are not an image, or do not decode.
    """
    image_mod = pillow()
    try:
        opened = image_mod.open(io.BytesIO(data))
    except image_mod.UnidentifiedImageError:
        raise ValueError(f"not an image Pillow can read ({len(data)} bytes beginning {bytes(data[:8])!r})") from None
    with opened as image:
        width, height = image.size
        if max(width, height) <= max_size:
            return None
        scale = max_size / max(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        fmt = image.format
        info = dict(image.info)
        if fmt == "JPEG":
            image.draft("L" if image.mode == "L" else "RGB", size)
        image.load()
        resized = image.resize(size, image_mod.Resampling.LANCZOS)
    out = io.BytesIO()
    if fmt == "JPEG":
        if resized.mode not in ("L", "RGB", "CMYK"):
            resized = resized.convert("RGB")
        extra = {k: info[k] for k in ("exif", "icc_profile") if info.get(k)}
        resized.save(out, "JPEG", quality=quality, **extra)
    else:
        if resized.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
            resized = resized.convert("RGBA" if "A" in resized.mode else "RGB")
        extra = {"icc_profile": info["icc_profile"]} if info.get("icc_profile") else {}
        resized.save(out, "PNG", **extra)
    return out.getvalue()


def decode_mode(mode: str, transparency: bool = False) -> str:
    """The mode ``--decode`` stores an image of Pillow mode ``mode`` in: ``"L"`` (one channel)
    for grayscale, ``"RGBA"`` with an alpha channel, else ``"RGB"``."""
    if "A" in mode or transparency:
        return "RGBA"
    if mode in ("1", "L", "I", "I;16", "I;16B", "I;16L", "F"):
        return "L"
    return "RGB"


def is_image_folder(src: Any) -> bool:
    """Whether ``src`` is a local folder to read as images (``naiad.read_images``): a folder whose
    own files include none that a table reader reads (``.parquet``, ``.tar``, ``.csv``...)."""
    if not isinstance(src, (str, os.PathLike)):
        return False
    text = os.fspath(src)
    if is_remote(text):
        return False
    text = local_path(text)
    if not os.path.isdir(text):
        return False
    for name in os.listdir(text):
        if name.startswith((".", "_")) or not os.path.isfile(os.path.join(text, name)):
            continue
        if _suffix(name) in READERS:
            return False
    return True
