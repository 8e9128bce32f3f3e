"""naiad.decode_audio on WAV and FLAC files written with soundfile: crops, padding, mixdown,
resampling (tone frequencies kept, aliasing removed), keyed random crops and errors."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch

sf = pytest.importorskip("soundfile")

import naiad  # noqa: E402
from naiad.errors import ConfigError, DecodeError  # noqa: E402
from naiad.media import audio  # noqa: E402
from naiad.media.keys import sample_uniforms  # noqa: E402


def encode(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def ramp(frames: int) -> np.ndarray:
    """Distinct values, exactly representable in 16-bit PCM: shows which frames were read."""
    return ((np.arange(frames) % 30000) / 32768.0).astype(np.float32)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_clips_are_cropped_from_the_start_or_zero_padded(fmt: str) -> None:
    rate = 8000
    long, short = ramp(3 * rate), ramp(rate // 2)
    batch = {"audio": [encode(long, rate, fmt), encode(short, rate, fmt)], "label": [1, 2]}
    out = naiad.decode_audio("audio", seconds=1.0)(batch)
    assert out["label"] == [1, 2]
    x = out["audio"]
    assert x.shape == (2, rate) and x.dtype == torch.float32
    assert np.array_equal(x[0].numpy(), long[:rate])
    assert np.array_equal(x[1, : rate // 2].numpy(), short) and not x[1, rate // 2 :].any()


def test_centre_crop_reads_the_middle_frames() -> None:
    rate = 8000
    samples = ramp(10_000)
    x = naiad.decode_audio("audio", seconds=0.5, crop="center")({"audio": [encode(samples, rate)]})["audio"]
    start = (10_000 - 4000) // 2
    assert np.array_equal(x[0].numpy(), samples[start : start + 4000])


def test_random_crop_is_keyed_per_sample_and_reads_the_keyed_offset() -> None:
    rate = 8000
    samples = ramp(20_000)
    data = encode(samples, rate, "FLAC")
    keys = np.arange(10, 18)
    t = naiad.decode_audio("audio", seconds=0.25, crop="random", seed=4)
    x = t({"audio": [data] * 8, "__index__": keys, "__epoch__": 1})["audio"]
    for row, key in enumerate(keys):
        u = sample_uniforms(4, 1, int(key), 1)[0]
        start = int(u * (20_000 - 2000 + 1))
        assert np.array_equal(x[row].numpy(), samples[start : start + 2000])
    assert len({float(v[0]) for v in x}) >= 6  # different offsets for different keys
    alone = pickle.loads(pickle.dumps(t))({"audio": [data], "__index__": keys[3:4], "__epoch__": 1})["audio"]
    assert torch.equal(alone[0], x[3])
    with pytest.raises(ConfigError, match="no column '__index__'"):
        t({"audio": [data]})


def test_stereo_is_mixed_down_to_mono() -> None:
    rate = 8000
    left, right = ramp(4000), ramp(4000)[::-1].copy()
    x = naiad.decode_audio("audio")({"audio": [encode(np.stack([left, right], 1), rate)]})["audio"]
    assert isinstance(x, list) and x[0].shape == (4000,)
    assert np.allclose(x[0].numpy(), (left + right) / 2, atol=1e-6)


def test_whole_clips_without_seconds_come_as_a_list_of_their_own_lengths() -> None:
    rate = 16000
    clips = [ramp(n) for n in (100, 16000, 3)]
    x = naiad.decode_audio("audio")({"audio": [encode(c, rate, "FLAC") for c in clips]})["audio"]
    assert [tuple(t.shape) for t in x] == [(100,), (16000,), (3,)]
    assert all(np.array_equal(t.numpy(), c) for t, c in zip(x, clips, strict=True))


def test_resampling_keeps_a_tone_and_its_length() -> None:
    # 1 kHz at 44.1 kHz to 16 kHz: the same sine at the new rate, within 1% of full scale.
    samples = tone(1000, 44100, 1.0)
    x = naiad.decode_audio("audio", sample_rate=16000, seconds=0.5)({"audio": [encode(samples, 44100, subtype="FLOAT")]})["audio"][0]
    expected = tone(1000, 16000, 0.5)
    assert x.shape == (8000,)
    assert np.abs(x.numpy()[200:-200] - expected[200:-200]).max() < 0.01
    up = audio.resample(tone(440, 8000, 0.5), 8000, 22050)
    assert len(up) == 0.5 * 22050
    assert np.abs(up[100:-100] - tone(440, 22050, 0.5)[100:-100]).max() < 0.01


def test_downsampling_filters_out_what_would_alias() -> None:
    # 12 kHz at 44.1 kHz is above 16 kHz's Nyquist (8 kHz): plain interpolation would fold it to
    # 4 kHz at full strength; after the low-pass under 1% of its RMS remains.
    samples = tone(12000, 44100, 1.0)
    x = audio.resample(samples, 44100, 16000)
    naive = np.interp(np.arange(16000) * 44100 / 16000, np.arange(len(samples)), samples)
    rms = lambda v: float(np.sqrt(np.mean(v[500:-500] ** 2)))  # noqa: E731
    assert rms(naive) > 0.2  # the aliased tone, somewhat attenuated by the interpolation
    assert rms(x) < 0.01 * rms(samples)
    passband = audio.resample(tone(3000, 44100, 1.0), 44100, 16000)
    assert abs(rms(passband) - rms(tone(3000, 16000, 1.0))) < 0.02 * rms(tone(3000, 16000, 1.0))


def test_mixed_rates_need_a_sample_rate_for_a_fixed_length() -> None:
    batch = {"audio": [encode(ramp(8000), 8000), encode(ramp(16000), 16000)]}
    with pytest.raises(ConfigError, match=r"sample rates \[8000, 16000\].*`sample_rate=`"):
        naiad.decode_audio("audio", seconds=0.5)(batch)
    x = naiad.decode_audio("audio", seconds=0.5, sample_rate=8000)(batch)["audio"]
    assert x.shape == (2, 4000)


def test_corrupt_clip_raises_decode_error_naming_the_sample() -> None:
    good = encode(ramp(800), 8000)
    batch = {"audio": [good, b"RIFF....WAVEjunk", good[:30]], "__key__": ["a", "b", "c"]}
    with pytest.raises(DecodeError, match=r"2 of 3 clips did not decode: __key__ 'b' \(row 1\)") as info:
        naiad.decode_audio("audio", seconds=0.1)(batch)
    assert info.value.rows == [1, 2]
    kept = info.value.kept
    assert kept is not None and kept["__key__"] == ["a"] and kept["audio"].shape == (1, 800)


def test_bad_arguments_are_config_errors() -> None:
    for kwargs, match in [
        (dict(sample_rate=0), "`sample_rate` must be"),
        (dict(seconds=-1), "`seconds` must be"),
        (dict(crop="end"), "`crop` must be"),
        (dict(crop="random"), "needs `seconds`"),
    ]:
        with pytest.raises(ConfigError, match=match):
            naiad.decode_audio("audio", **kwargs)  # type: ignore[arg-type]
