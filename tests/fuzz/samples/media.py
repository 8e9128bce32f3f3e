"""Images and audio clips for the sample fuzzers: the seeds (PNG, JPEG, GIF, BMP, WebP written by
Pillow; WAV and FLAC written by soundfile and ``wave``), their header fields (dimensions, chunk and
segment lengths, rates, channels, frame counts) found by parsing them, the damage done to those
fields, and the decodes: pixels or samples of the right shape, or a DecodeError naming the sample
(:func:`image_case`, :func:`audio_case`).
"""

from __future__ import annotations

import functools
import io
import struct
import wave
import zlib
from typing import Any

import numpy as np

import naiad
from naiad.errors import DecodeError
from tests.fuzz.samples.damage import Field, damaged_fields, mutated, set_number
from tests.fuzz.samples.rules import Pick, within_case_time

IMAGE_FORMATS = ("png", "jpeg", "gif", "bmp", "webp", "webp_lossless")
DIMENSIONS = (0, 1, 2, 255, 256, 4095, 12_000, 13_000, 16_383, 16_384, 65_535, 65_536, 2**24 - 1, 2**31 - 1, 2**32 - 1)
BUDGET_PIXELS = 16_000_000
"""The pixel budget the fuzzed images are decoded with, as images from a source one does not
trust should be (docs/SAMPLES.md, "A pixel budget"): the default, Pillow's limit (about 179
million pixels), lets one image that claims it cost a gigabyte while it decodes, by design; the
memory bound is the budget's."""


@functools.cache
def image_seed(fmt: str) -> bytes:
    """A valid 20x12 RGB image in ``fmt``, written by Pillow."""
    from PIL import Image

    img = Image.fromarray((np.arange(12 * 20 * 3).reshape(12, 20, 3) % 251).astype(np.uint8))
    out = io.BytesIO()
    if fmt == "webp_lossless":
        img.save(out, format="WEBP", lossless=True)
    else:
        img.save(out, format=fmt.upper(), **({"quality": 90} if fmt in ("jpeg", "webp") else {}))
    return out.getvalue()


def image_fields(fmt: str, data: bytes) -> list[Field]:
    """The dimension and length fields of an image seed, found by parsing it."""
    if fmt == "png":
        fields = [Field("width", 16, 4), Field("height", 20, 4), Field("bit_depth", 24, 1), Field("color_type", 25, 1),
                  Field("interlace", 28, 1)]
        at = 8
        while at + 8 <= len(data):  # every chunk's length
            fields.append(Field(f"{data[at + 4:at + 8].decode('latin-1')}_length", at, 4))
            at += 12 + int.from_bytes(data[at:at + 4], "big")
        return fields
    if fmt == "jpeg":
        fields, at = [], 2
        while at + 4 <= len(data) and data[at] == 0xFF:
            marker = data[at + 1]
            fields.append(Field(f"segment_{marker:02x}_length", at + 2, 2))
            if marker in (0xC0, 0xC1, 0xC2):
                fields += [Field("precision", at + 4, 1), Field("height", at + 5, 2), Field("width", at + 7, 2),
                           Field("components", at + 9, 1)]
            if marker == 0xDA:
                break
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
        return fields
    if fmt == "gif":
        fields = [Field("screen_width", 6, 2, "little"), Field("screen_height", 8, 2, "little"), Field("flags", 10, 1)]
        at = 13 + (3 * 2 ** ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
        while at < len(data) and data[at] == 0x21:  # extensions before the image
            at += 2
            while at < len(data) and data[at]:
                at += data[at] + 1
            at += 1
        if at < len(data) and data[at] == 0x2C:
            fields += [Field("left", at + 1, 2, "little"), Field("top", at + 3, 2, "little"), Field("width", at + 5, 2, "little"),
                       Field("height", at + 7, 2, "little"), Field("image_flags", at + 9, 1), Field("lzw_min", at + 10, 1)]
        return fields
    if fmt == "bmp":
        return [Field("file_size", 2, 4, "little"), Field("data_offset", 10, 4, "little"), Field("header_size", 14, 4, "little"),
                Field("width", 18, 4, "little"), Field("height", 22, 4, "little"), Field("planes", 26, 2, "little"),
                Field("bits", 28, 2, "little"), Field("compression", 30, 4, "little"), Field("image_size", 34, 4, "little"),
                Field("colors", 46, 4, "little")]
    fields = [Field("riff_size", 4, 4, "little"), Field("chunk_size", 16, 4, "little")]  # WebP: a RIFF of one chunk
    if data[12:16] == b"VP8 ":
        return fields + [Field("frame_tag", 20, 3, "little"), Field("width", 26, 2, "little"), Field("height", 28, 2, "little")]
    return fields + [Field("signature", 20, 1), Field("size_bits", 21, 4, "little")]  # VP8L: 14 bits each, less one


def image_of_size(fmt: str, width: int, height: int) -> bytes:
    """The seed of ``fmt`` with its header claiming ``width`` x ``height`` (every dimension field
    set; a PNG's CRCs made right)."""
    seed = image_seed(fmt)
    fields = {f.name: f for f in image_fields(fmt, seed)}
    if fmt == "webp_lossless":
        bits = int.from_bytes(seed[21:25], "little") & ~((1 << 28) - 1)
        return set_number(seed, fields["size_bits"], bits | (width - 1) % 16384 | ((height - 1) % 16384) << 14)
    data = seed
    for w, h in [("width", "height")] + ([("screen_width", "screen_height")] if fmt == "gif" else []):
        data = set_number(set_number(data, fields[w], width), fields[h], height)
    return png_crcs_fixed(data) if fmt == "png" else data


def png_crcs_fixed(data: bytes) -> bytes:
    """A PNG with every chunk's CRC made right again (so damage reaches past the check)."""
    out, at = bytearray(data[:8]), 8
    while at + 12 <= len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        if at + 12 + n > len(data):
            break
        out += data[at:at + 8 + n] + struct.pack(">I", zlib.crc32(data[at + 4:at + 8 + n]))
        at += 12 + n
    return bytes(out + data[at:])


def assert_decode_error(exc: DecodeError, keys: list[str]) -> None:
    """The DecodeError of a batch of samples ``keys``, each the same bytes, names them (the first
    key, every row) and is no allocation that failed."""
    assert keys[0] in str(exc) and exc.rows == list(range(len(keys))), f"the error does not name the samples: {exc!r}"
    assert not any(r.startswith("MemoryError") for r in exc.reasons), f"the decode ran out of memory: {exc!r}"


def decode_image(data: bytes, *, crop: str | None = "center", size: int | None = 32, rows: int = 1) -> tuple[int, ...] | None:
    """The shape ``decode_images`` gives ``rows`` copies of one image (named ``fuzz-<row>``), or
    None for a DecodeError that names them all; any other exception, or a refusal that is really
    an allocation that failed, fails."""
    kwargs: dict[str, Any] = {"size": size, "crop": crop, "seed": 0} if size is not None else {}
    transform = naiad.decode_images("image", threads=1, max_pixels=BUDGET_PIXELS, **kwargs)
    keys = [f"fuzz-{i}" for i in range(rows)]
    try:
        out = transform({"image": [data] * rows, "__key__": keys, "__index__": np.arange(rows)})["image"]
    except DecodeError as exc:
        assert_decode_error(exc, keys)
        return None
    if size is not None:
        assert tuple(out.shape) == (rows, 3, size, size) and str(out.dtype) == "torch.uint8", out.shape
        return tuple(out.shape)
    assert len(out) == rows and all(o.ndim == 3 and o.shape[0] == 3 and o.shape[1] and o.shape[2] for o in out), out
    return tuple(out[0].shape)


def image_case(pick: Pick, folder: str = "") -> None:
    """An image whose header fields (dimensions, chunk and segment lengths, depth, colour type)
    or bytes are damaged decodes to the right shape with a centre crop, a random crop and at its
    own size, or is a DecodeError naming the sample."""
    fmt = pick.choice(IMAGE_FORMATS)
    data, what = image_seed(fmt), f"{fmt}:"
    if pick.random() < 0.75:
        data, what = damaged_fields(pick, data, image_fields(fmt, data), DIMENSIONS, what)
        if fmt == "png" and pick.random() < 0.8:
            data, what = png_crcs_fixed(data), f"{what} (CRCs fixed)"
    else:
        data, damage = mutated(pick, data)
        what = f"{what} {damage}"
    crop = pick.choice(("center", "random", None))
    with within_case_time(what):
        try:
            decode_image(data, crop=crop, size=None if crop is None else 32)
        except AssertionError as exc:
            raise AssertionError(f"{what}, crop={crop}: {exc}") from None


# -- audio --------------------------------------------------------------------------------------

AUDIO_FORMATS = ("wav_pcm16", "wav_stereo", "wav_float", "wav_wave", "flac")
AUDIO_VALUES = (0, 1, 2, 3, 99, 100, 255, 256, 257, 1024, 8000, 44_100, 65_535, 384_000, 384_001, 2**24 - 1,
                2**31 - 1, 2**32 - 1)


@functools.cache
def audio_seed(fmt: str) -> bytes:
    """A valid clip of 0.25 s (a 440 Hz tone at 8 kHz): WAV written by soundfile (16-bit mono or
    stereo, float) or by Python's ``wave``, or FLAC written by soundfile."""
    t = np.arange(2000) / 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = io.BytesIO()
    if fmt == "wav_wave":
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes((tone * 32767).astype("<i2").tobytes())
        return out.getvalue()
    import soundfile

    signal = np.stack([tone, -tone], 1) if fmt == "wav_stereo" else tone
    soundfile.write(out, signal, 8000, format="FLAC" if fmt == "flac" else "WAV", subtype="FLOAT" if fmt == "wav_float" else "PCM_16")
    return out.getvalue()


def audio_fields(fmt: str, data: bytes) -> list[Field]:
    """The header fields of an audio seed: a WAV's RIFF and chunk sizes and ``fmt `` fields, or a
    FLAC's STREAMINFO (its rate, channels, bits and frame count share bytes: see
    :func:`flac_streaminfo`)."""
    if fmt == "flac":
        return [Field("streaminfo_length", 5, 3), Field("min_block", 8, 2), Field("max_block", 10, 2),
                Field("min_frame", 12, 3), Field("max_frame", 15, 3), Field("rate_channels_bits", 18, 3),
                Field("bits_frames", 21, 5)]
    fields, at = [Field("riff_size", 4, 4, "little")], 12
    while at + 8 <= len(data):
        tag, n = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        fields.append(Field(f"{tag.decode('latin-1').strip()}_size", at + 4, 4, "little"))
        if tag == b"fmt ":
            fields += [Field("format", at + 8, 2, "little"), Field("channels", at + 10, 2, "little"),
                       Field("rate", at + 12, 4, "little"), Field("byte_rate", at + 16, 4, "little"),
                       Field("block_align", at + 20, 2, "little"), Field("bits", at + 22, 2, "little")]
        at += 8 + n + (n & 1)
    return fields


def flac_streaminfo(data: bytes, *, rate: int | None = None, channels: int | None = None, frames: int | None = None) -> bytes:
    """A FLAC with STREAMINFO's sample rate (20 bits), channels (1-8) or frame count (36 bits) set."""
    bits = int.from_bytes(data[18:26], "big")  # rate 20 | channels-1 3 | bits-1 5 | frames 36
    if rate is not None:
        bits = (bits & ~(0xFFFFF << 44)) | ((rate & 0xFFFFF) << 44)
    if channels is not None:
        bits = (bits & ~(0x7 << 41)) | (((channels - 1) & 0x7) << 41)
    if frames is not None:
        bits = (bits & ~((1 << 36) - 1)) | (frames & ((1 << 36) - 1))
    return data[:18] + bits.to_bytes(8, "big") + data[26:]


def decode_clip(data: bytes, *, seconds: float | None = None) -> int | None:
    """The samples ``decode_audio("audio", sample_rate=16000)`` gives one clip (named
    ``fuzz-clip``), or None for a DecodeError naming it; any other exception fails."""
    transform = naiad.decode_audio("audio", sample_rate=16_000, seconds=seconds, threads=1)
    try:
        out = transform({"audio": [data], "__key__": ["fuzz-clip"]})["audio"]
    except DecodeError as exc:
        assert_decode_error(exc, ["fuzz-clip"])
        return None
    if seconds is not None:
        assert tuple(out.shape) == (1, round(seconds * 16_000)) and str(out.dtype) == "torch.float32", out.shape
        return int(out.shape[1])
    (clip,) = out
    assert clip.ndim == 1 and str(clip.dtype) == "torch.float32" and len(clip) <= 600 * 16_000, clip.shape
    return len(clip)


def audio_case(pick: Pick, folder: str = "") -> None:
    """A clip whose header (rate, channels, bits, frame count, chunk sizes) or bytes are damaged
    decodes to mono float32 of the right length (with and without ``seconds=``), or is a
    DecodeError naming the sample."""
    fmt = pick.choice(AUDIO_FORMATS)
    data, what = audio_seed(fmt), f"{fmt}:"
    r = pick.random()
    if fmt == "flac" and r < 0.4:
        which = pick.choice(("rate", "channels", "frames"))
        value = pick.randrange(1, 9) if which == "channels" else pick.choice(AUDIO_VALUES + (2**36 - 1, 2**20 - 1))
        data, what = flac_streaminfo(data, **{which: value}), f"{what} {which}={value}"
    elif r < 0.8:
        data, what = damaged_fields(pick, data, audio_fields(fmt, data), AUDIO_VALUES, what)
    else:
        data, damage = mutated(pick, data)
        what = f"{what} {damage}"
    seconds = pick.choice((None, 1.0, 0.01))
    with within_case_time(what):
        try:
            decode_clip(data, seconds=seconds)
        except AssertionError as exc:
            raise AssertionError(f"{what}, seconds={seconds}: {exc}") from None

