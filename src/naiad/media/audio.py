"""Batched audio decoding: ``naiad.decode_audio``.

``decode_audio(column, ...)`` returns a picklable transform: given a batch whose ``batch[column]``
holds each sample's encoded audio (WAV, FLAC, OGG and whatever else libsndfile reads, through
``soundfile``), it returns the batch with that column decoded to mono float32 in [-1, 1] and every
other column kept: with ``seconds``, one ``[B, T]`` tensor (each clip cropped or zero-padded to
``T = round(seconds * sample_rate)``); without, a list of ``[T_i]`` tensors. The samples are
decoded on the thread pool of ``media/rows.py`` (NOTE [ Decode threads ]).

A clip longer than ``seconds`` is cropped before it is decoded: the file is opened, its length
read from the header, and only the frames of the crop are decoded (``SoundFile.seek`` and
``read``), so a 30 s file bound for a 2 s crop decodes 2 s. Which frames: the start, the centre,
or a random offset keyed per sample (NOTE [ Keyed sample randomness ] in ``media/keys.py``).

Resampling (only when ``sample_rate`` is given and a file has another rate) is linear
interpolation, after a Kaiser-windowed sinc low-pass at 0.95 of the new Nyquist frequency when
downsampling (an FFT convolution), so downsampling does not alias. It is cheap and good enough
for training features (spectrograms, learned front ends); linear interpolation attenuates the top
of the band slightly (-1 dB near 0.6 of Nyquist, more above) and upsampling leaves faint images
above the old Nyquist. For reference-quality resampling, resample the files offline.

A header is checked before it is trusted (NOTE [ Decode bounds ] in ``trust/bounds.py``): its
rate and channel count must be plausible, and without ``seconds`` a clip longer than
``max_seconds`` is refused before it is decoded. The frames are read in chunks, each mixed to
mono at once, so memory follows what decodes, not what the header claims.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from naiad.errors import ConfigError
from naiad.media.keys import KeyedBatchTransform, sample_uniforms
from naiad.media.rows import default_threads, encoded, raise_failures, run_rows
from naiad.trust import bounds

__all__ = ["AudioOptions", "DecodeAudio", "decode_audio", "resample"]

_INSTALL = "pip install 'naiad[audio]'"


def soundfile() -> Any:
    """The ``soundfile`` module, or a ConfigError saying how to install it."""
    try:
        import soundfile as module
    except (ImportError, OSError) as exc:  # OSError: the wheel's libsndfile failed to load
        raise ConfigError(f"decode_audio needs soundfile, which is not installed or not loading ({exc}): {_INSTALL}.") from exc
    return module


@dataclass(frozen=True)
class AudioOptions:
    """What :func:`decode_audio` does to each clip (see its arguments)."""

    sample_rate: int | None = None
    seconds: float | None = None
    crop: str = "start"
    max_seconds: float | None = bounds.DEFAULT_MAX_AUDIO_SECONDS


class DecodeAudio(KeyedBatchTransform):
    """The transform :func:`decode_audio` returns: ``t(batch) -> batch``; picklable.

    Attributes as :class:`naiad.media.images.DecodeImages`'s.
    """

    options: AudioOptions

    @property
    def keyed(self) -> bool:
        """Whether it draws per-sample randomness (a random crop) from the key column."""
        return self.options.crop == "random"

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with ``batch[column]`` decoded: float32 ``[B, T]`` with ``seconds``, else a
        list of float32 ``[T_i]`` tensors.

        Raises:
            DecodeError: some clips did not decode (``rows``, ``keys``, ``reasons``, ``kept``).
            ConfigError: the batch lacks the column or the key column (random crops), or clips of
                different sample rates were asked for a fixed length without ``sample_rate``.
        """
        if not isinstance(batch, Mapping) or self.column not in batch:
            columns = sorted(map(str, batch)) if isinstance(batch, Mapping) else type(batch).__name__
            raise ConfigError(f"decode_audio: the batch has no column {self.column!r} (columns: {columns}).")
        opts = self.options
        values = batch[self.column]
        rows = len(values)
        sf = soundfile()
        drawn = self.draw_keys(batch, rows, why="decode_audio(crop='random')")
        keys, seed, epoch = drawn if drawn is not None else (None, None, None)
        clips: list[np.ndarray | None] = [None] * rows
        rates = np.zeros(rows, dtype=np.int64)

        def work(i: int) -> None:
            offset = None
            if keys is not None:
                assert seed is not None and epoch is not None
                offset = float(sample_uniforms(seed, epoch, int(keys[i]), 1)[0])
            clips[i], rates[i] = _decode(sf, encoded(values[i]), opts, offset)

        failures = run_rows(work, rows, self.threads or default_threads())
        result = dict(batch)
        if opts.seconds is None:
            result[self.column] = [None if c is None else torch.from_numpy(c) for c in clips]
        else:
            good = [i for i in range(rows) if i not in failures]
            lengths = {len(clips[i]) for i in good}  # type: ignore[arg-type]
            if len(lengths) > 1:
                found = sorted({int(rates[i]) for i in good})
                raise ConfigError(
                    f"decode_audio(seconds={opts.seconds}) without `sample_rate` gives clips of "
                    f"different lengths: the batch's files have sample rates {found}. Give "
                    "`sample_rate=` to resample them to one rate."
                )
            length = lengths.pop() if lengths else 0
            out = torch.zeros((rows, length), dtype=torch.float32)
            for i in good:
                out[i] = torch.from_numpy(clips[i])
            result[self.column] = out
        raise_failures(failures, what="clips", column=self.column, batch=batch, decoded=result, rows=rows, key=self.key)
        return result


def _decode(sf: Any, data: bytes | memoryview, opts: AudioOptions, offset: float | None) -> tuple[np.ndarray, int]:
    """One clip as mono float32 at the target rate, cropped and padded: ``(samples, file's rate)``.
    Its header is checked first (NOTE [ Decode bounds ])."""
    with sf.SoundFile(io.BytesIO(data)) as f:
        rate, frames, channels = int(f.samplerate), int(f.frames), int(f.channels)
        # Without `seconds` the length is the header's word, so it is bounded; a crop bounds itself.
        most = bounds.audio_frame_budget(rate, channels, frames, opts.max_seconds if opts.seconds is None else None)
        target = opts.sample_rate or rate
        length: int | None = None
        need: int | None = None  # frames to read; None: to the end, however far that is
        if opts.seconds is not None:
            length = int(round(opts.seconds * target))
            # the source frames that cover `length` output samples (+1: the last interpolation's
            # right neighbour)
            need = min(frames, math.ceil(length * rate / target) + (rate != target))
            if frames > need:
                f.seek(_crop_start(frames, need, opts.crop, offset))
        mono = _read_mono(f, need, most, opts.max_seconds)
    if rate != target:
        mono = resample(mono, rate, target)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if length is None:
        return mono, rate
    out = np.zeros(length, dtype=np.float32)
    out[: min(length, len(mono))] = mono[:length]
    return out, rate


def _crop_start(frames: int, need: int, crop: str, offset: float | None) -> int:
    """The first of ``need`` frames to read out of ``frames``, as ``crop`` says."""
    if crop == "center":
        return (frames - need) // 2
    if crop == "random":
        assert offset is not None  # drawn whenever the crop is random
        return min(int(offset * (frames - need + 1)), frames - need)
    return 0


def _read_mono(f: Any, need: int | None, most: int | None, max_seconds: float | None) -> np.ndarray:
    """Up to ``need`` frames (None: to the end) from ``f``'s position, mixed to mono float32, read
    a chunk at a time (``f.read`` allocates the frames it is asked for up front); refused once
    more than ``most`` frames have come."""
    chunk = bounds.audio_chunk_frames(int(f.channels))
    parts: list[np.ndarray] = []
    read = 0
    while need is None or read < need:
        block = f.read(chunk if need is None else min(chunk, need - read), dtype="float32", always_2d=True)
        if len(block) == 0:
            break
        read += len(block)
        bounds.check_audio_frames(read, most, int(f.samplerate), max_seconds)
        parts.append(block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0])
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """``samples`` (1-D) from ``rate_in`` to ``rate_out`` Hz: linear interpolation, after a
    low-pass when downsampling (see the module's docstring); ``floor(n * rate_out / rate_in)``
    samples, the first at the same instant as the input's first."""
    if rate_in == rate_out or len(samples) == 0:
        return samples
    x = samples.astype(np.float64)
    if rate_out < rate_in:
        x = _lowpass(x, 0.5 * 0.95 * rate_out / rate_in)
    count = len(samples) * rate_out // rate_in
    positions = np.arange(count) * (rate_in / rate_out)
    out: np.ndarray = np.interp(positions, np.arange(len(x)), x).astype(np.float32)
    return out


def _lowpass(x: np.ndarray, cutoff: float) -> np.ndarray:
    """``x`` through a Kaiser-windowed sinc low-pass at ``cutoff`` cycles per sample (zero
    phase: the output lines up with the input), by FFT convolution."""
    half = int(math.ceil(8.0 / cutoff))  # 16 zero crossings of the sinc on each side
    t = np.arange(-half, half + 1)
    taps = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(len(t), 8.6)
    taps /= taps.sum()
    size = 1 << int(math.ceil(math.log2(len(x) + len(taps) - 1)))
    full = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(taps, size), size)
    return full[half : half + len(x)]


def decode_audio(
    column: str,
    *,
    sample_rate: int | None = None,
    seconds: float | None = None,
    crop: str = "start",
    seed: int | None = None,
    key: str = "__index__",
    epoch_key: str | None = "__epoch__",
    threads: int | None = None,
    max_seconds: float | None = bounds.DEFAULT_MAX_AUDIO_SECONDS,
) -> DecodeAudio:
    """A transform that decodes a batch's audio clips to mono float32, in threads (needs
    ``naiad[audio]``).

    Args:
        column: the batch column holding each clip's encoded bytes (WAV, FLAC, OGG...).
        sample_rate: the output rate in Hz; files at another rate are resampled (see the
            module's docstring). None: each file's own rate.
        seconds: the output length: each clip cropped (per ``crop``) or zero-padded at the end to
            ``round(seconds * rate)`` samples, in one ``[B, T]`` tensor. None: whole clips, in a
            list of ``[T_i]`` tensors.
        crop: which part of a longer clip: ``"start"``, ``"center"`` or ``"random"`` (keyed per
            sample by ``seed``, ``key`` and ``epoch_key``, as in ``decode_images``).
        seed, key, epoch_key: see ``naiad.decode_images``.
        threads: threads decoding one batch (None: the usable cores, divided among workers).
        max_seconds: without ``seconds``, the longest clip decoded: a clip whose header says it
            is longer is refused before it is decoded (a failed sample), and so is one that
            decodes more frames than that, so the output never passes ``max_seconds`` at the
            output rate. None: no limit. With ``seconds``, the crop bounds the output instead.
            Whatever it is, a header rate outside 100 Hz to 384 kHz or more than 256 channels
            is refused (NOTE [ Decode bounds ] in ``trust/bounds.py``).

    Example::

        t = naiad.decode_audio("flac", sample_rate=16000, seconds=2.0, crop="random", seed=0)
        t({"flac": [clip_bytes, ...], "__index__": np.arange(n)})["flac"].shape  # [n, 32000]
    """
    if not isinstance(column, str) or not column:
        raise ConfigError(f"`column` must be a column name (a non-empty str), got {column!r}.")
    if sample_rate is not None and (not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate < 1):
        raise ConfigError(f"`sample_rate` must be None or a positive int (Hz), got {sample_rate!r}.")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0):
        raise ConfigError(f"`seconds` must be None or a positive number, got {seconds!r}.")
    if max_seconds is not None and (
        isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not 0 < max_seconds < math.inf
    ):
        raise ConfigError(f"`max_seconds` must be None (no limit) or a positive finite number, got {max_seconds!r}.")
    if crop not in ("start", "center", "random"):
        raise ConfigError(f"`crop` must be 'start', 'center' or 'random', got {crop!r}.")
    if crop != "start" and seconds is None:
        raise ConfigError(f"`crop={crop!r}` needs `seconds`, the length to crop to.")
    soundfile()  # fail here, not in a worker, when the extra is missing
    options = AudioOptions(
        sample_rate=sample_rate,
        seconds=None if seconds is None else float(seconds),
        crop=crop,
        max_seconds=None if max_seconds is None else float(max_seconds),
    )
    return DecodeAudio(column, options, seed=seed, key=key, epoch_key=epoch_key, threads=threads)
