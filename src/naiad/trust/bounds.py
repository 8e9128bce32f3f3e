"""What a decode may allocate: an image's pixels and its resize's, an audio clip's samples.

NOTE [ Decode bounds ]
An encoded sample is a few bytes that say how large it is: a PNG's header names its width and
height, a WAV's its rate and length, a FLAC's STREAMINFO its frame count. Memory follows these
numbers before any pixel or frame is read, so a tiny file can claim gigabytes (a 102-byte
1x8000 PNG resized for a 224 centre crop would be 224 x 1,792,000 pixels; a WAV at 1 Hz resampled
to 16 kHz becomes 16,000 samples per frame). So each decode compares what the header claims with
a budget *before* it allocates, and refuses a sample over it. A refusal is an ordinary exception
inside the sample's decode, which ``decode_images`` and ``decode_audio`` report as a
``DecodeError`` naming the sample (skipped with ``on_bad_rows="skip"``), never a crash.

Images (``decode_images(max_pixels=)``): one budget of pixels, by default Pillow's own refusal
limit (twice ``PIL.Image.MAX_IMAGE_PIXELS``, read when the batch is decoded, so a change of it
counts; None there means no limit), applied to each array the decode makes:

* the image's full size from its header (not the size after the JPEG DCT shrink: the header is
  what the file claims and what Pillow checks at open);
* each resize torch computes: its output and the intermediate of its first pass (the resize is
  separable: ``in_h x out_w`` or ``out_h x in_w``, whichever pass goes first);
* the output canvas (without ``size=``, ``resize=N`` makes it the image's own resized size).

Video (``decode_video(max_pixels=)``, by default :data:`DEFAULT_MAX_VIDEO_PIXELS`): the stream's
frame size (each decoded frame is that many pixels), each resize FFmpeg's scaler makes, and the
clips' output, frames times output pixels, all checked once the container's header is read and
before any frame is decoded. A clip's frame count is the caller's (``frames`` times
``clips_per_video``), not the file's, so a header claiming a billion frames allocates nothing.

Audio (``decode_audio(max_seconds=)``): the header's rate must lie in
:data:`SAMPLE_RATE_RANGE_HZ` and its channels in ``1..``:data:`MAX_CHANNELS`, always (a crop's
frame arithmetic follows the rate too); without ``seconds``, a clip whose header says it is
longer than ``max_seconds`` is refused before decoding, and the decode stops with the same
refusal once it has read more frames than that (a header may understate its length). The clip is
read in chunks of :func:`audio_chunk_frames`, each mixed to mono at once, so memory follows the
frames that actually decode (one chunk and the mono samples), not the frames the header claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "AUDIO_CHUNK_SAMPLES",
    "DEFAULT_MAX_AUDIO_SECONDS",
    "DEFAULT_MAX_VIDEO_PIXELS",
    "MAX_CHANNELS",
    "SAMPLE_RATE_RANGE_HZ",
    "PixelBudget",
    "audio_chunk_frames",
    "audio_frame_budget",
    "check_audio_frames",
    "pixel_budget",
    "video_budget",
]

DEFAULT_MAX_VIDEO_PIXELS = 1 << 28
"""The most pixels ``decode_video`` gives one video (its clips' frames times their output pixels,
768 MiB of RGB) and one decoded frame, unless told otherwise: 128 clips of 16 frames at 360x360,
or a frame of 16384x16384."""

DEFAULT_MAX_AUDIO_SECONDS = 600.0
"""The longest clip ``decode_audio`` decodes whole (without ``seconds``) unless told otherwise."""

SAMPLE_RATE_RANGE_HZ = (100, 384_000)
"""The header rates a clip may have. Audio is recorded at 8 kHz (telephony) and above; 100 Hz
leaves room for slow sensor recordings kept as WAV. 384 kHz is the highest rate of PCM
recorders and converters (DXD's 352.8 kHz, ultrasonic recorders' 384 kHz). A rate outside is a
broken or hostile header: at 1 Hz, each frame resampled to 16 kHz becomes 16,000 samples."""

MAX_CHANNELS = 256
"""The most channels a clip may have: 15th-order ambisonics, above any microphone array stored
as one file in practice (libsndfile itself allows 1,024)."""

AUDIO_CHUNK_SAMPLES = 1 << 20
"""Samples (frames times channels) read at a time: 4 MiB of float32, a 10 s stereo clip at
48 kHz in one read."""


@dataclass(frozen=True)
class PixelBudget:
    """The most pixels any one array of an image's decode may hold (NOTE [ Decode bounds ]).

    Attributes:
        pixels: the budget, or None for no limit.
        by_default: whether it is Pillow's limit (``max_pixels`` not given), which the message's
            fix names.
        error: the exception a refusal raises (``decode_images`` raises Pillow's
            ``DecompressionBombError``, as Pillow does at open).
        owner, noun: the transform whose ``max_pixels`` it is and what it decodes, for the
            message.
    """

    pixels: int | None
    by_default: bool = True
    error: type[Exception] = ValueError
    owner: str = "decode_images"
    noun: str = "image"

    def check(self, what: str, width: int, height: int) -> None:
        """Raise :attr:`error` when ``width * height`` pixels are over the budget.

        ``what`` names the array in the message, e.g. ``"the image"`` or ``"its resize"``.
        """
        if self.pixels is None or width * height <= self.pixels:
            return
        if self.by_default:
            where = (
                "twice PIL.Image.MAX_IMAGE_PIXELS, the default of decode_images' `max_pixels`"
            )
            fix = (
                "give decode_images a larger `max_pixels=` (an image Pillow opens must also be "
                "under twice PIL.Image.MAX_IMAGE_PIXELS: raise that too)"
            )
        else:
            where = f"{self.owner}' `max_pixels`"
            fix = "give a larger `max_pixels=`"
        raise self.error(
            f"{what} is {width}x{height} = {width * height:,} pixels, over the decode's budget of "
            f"{self.pixels:,} ({where}): a decompression bomb? If the {self.noun} is genuine, {fix}"
        )


def pixel_budget(
    max_pixels: int | None, pillow_max_image_pixels: int | float | None, *, error: type[Exception] = ValueError
) -> PixelBudget:
    """The pixel budget of a decode: ``max_pixels`` when given, else twice Pillow's
    ``MAX_IMAGE_PIXELS`` (passed in: this module does not import Pillow), or no limit when that
    is None.

    Example:
        >>> pixel_budget(None, 89_478_485).pixels
        178956970
        >>> pixel_budget(10_000, 89_478_485).pixels
        10000
    """
    if max_pixels is not None:
        return PixelBudget(int(max_pixels), by_default=False, error=error)
    if pillow_max_image_pixels is None:
        return PixelBudget(None, error=error)
    return PixelBudget(2 * int(pillow_max_image_pixels), error=error)


def audio_frame_budget(rate: int, channels: int, frames: int, max_seconds: float | None) -> int | None:
    """Check a clip's header (NOTE [ Decode bounds ]) and return the most frames its decode may
    read: ``floor(max_seconds * rate)``, or None without ``max_seconds``.

    Args:
        rate, channels, frames: what the header says.
        max_seconds: the longest clip allowed, or None (the rate and channels are checked still).

    Raises:
        ValueError: the rate or channel count is implausible, or the header's length is over
            ``max_seconds``.
    """
    low, high = SAMPLE_RATE_RANGE_HZ
    if not low <= rate <= high:
        raise ValueError(
            f"the header's sample rate is {rate:,} Hz, outside the {low:,}-{high:,} Hz that audio "
            "is recorded at: a broken or hostile header (resample the file offline if it is genuine)"
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(
            f"the header says {channels:,} channels; a clip may have 1 to {MAX_CHANNELS}: a broken "
            "or hostile header"
        )
    if max_seconds is None:
        return None
    most = math.floor(max_seconds * rate)
    if frames > most:
        raise ValueError(
            f"the header says {frames:,} frames at {rate:,} Hz ({frames / rate:,.1f} s), longer "
            f"than `max_seconds`={max_seconds:g}: give decode_audio a larger `max_seconds=` (or "
            "None) to decode it whole, or `seconds=` to decode a crop"
        )
    return most


def check_audio_frames(read: int, most: int | None, rate: int, max_seconds: float | None) -> None:
    """Raise once a decode has read more frames than its budget (the header understated them).

    Raises:
        ValueError: ``read`` is over ``most``.
    """
    if most is not None and read > most:
        raise ValueError(
            f"decoded more than {most:,} frames at {rate:,} Hz, past `max_seconds`={max_seconds:g}, "
            "although the header said fewer: give decode_audio a larger `max_seconds=` (or None)"
        )


def audio_chunk_frames(channels: int) -> int:
    """Frames to read at a time from a clip of ``channels`` channels (:data:`AUDIO_CHUNK_SAMPLES`
    samples, at least one frame)."""
    return max(1, AUDIO_CHUNK_SAMPLES // max(1, channels))


def video_budget(max_pixels: int | None) -> PixelBudget:
    """The pixel budget of a video decode (NOTE [ Decode bounds ]): ``max_pixels``, else
    :data:`DEFAULT_MAX_VIDEO_PIXELS`."""
    return PixelBudget(DEFAULT_MAX_VIDEO_PIXELS if max_pixels is None else int(max_pixels), by_default=False,
                       owner="decode_video", noun="video")
