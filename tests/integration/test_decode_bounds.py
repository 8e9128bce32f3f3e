"""What a decode may allocate (NOTE [ Decode bounds ] in trust/bounds.py): extremely elongated
images decode in little memory, images over the pixel budget and clips over ``max_seconds`` or
with implausible headers are refused before they are decoded, as failed samples naming the
sample. Memory is measured in a subprocess (its peak RSS before and after the decode), under an
address-space limit so that a regression fails instead of taking the machine's memory."""

from __future__ import annotations

import io
import json
import struct
import sys
import wave
from types import SimpleNamespace

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import naiad  # noqa: E402
from naiad.errors import ConfigError, DecodeError  # noqa: E402
from naiad.media import images  # noqa: E402
from naiad.trust import bounds  # noqa: E402
from tests.helpers import run_to_end  # noqa: E402

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="peak RSS and the address-space limit as Linux keeps them")


def png(width: int, height: int, seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real 64x64 JPEG whose SOF header says ``width`` x ``height``, cut in the middle of its
    scan: what a hostile file looks like to the decoder."""
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")  # baseline SOF0: marker, length (2), precision (1), height (2), width (2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data[: len(data) // 2])


# The subprocess warms the decode (pool threads, torch's kernels), then caps its address space at
# what it holds plus 2 GiB, and measures each case's peak RSS growth.
PRELUDE = r"""
import io, json, resource, struct, sys
import numpy as np
import naiad

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def cap_address_space():
    held = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (held + (2 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))

def measure(transform, batch):
    before = peak_mb()
    try:
        out = transform(batch)
        column = next(iter(batch))
        got = [list(t.shape) for t in out[column]]
    except Exception as exc:
        got = f"{type(exc).__name__}: {exc}"
    return [peak_mb() - before, got]
"""


def run_measured(code: str) -> dict[str, list]:
    result = run_to_end([sys.executable, "-c", PRELUDE + code], timeout_s=150)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- images: memory ---------------------------------------------------------------------------


IMAGE_CASES = r"""
from PIL import Image
def png(width, height):
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()
bomb = bytes.fromhex(sys.argv[1])
centre = naiad.decode_images("image", size=224, crop="center")
natural = naiad.decode_images("image", resize=256)
centre({"image": [png(8, 8)]}); natural({"image": [png(8, 8)]})
inputs = {"wide": png(8000, 1), "tall": png(1, 8000), "very wide": png(100_000, 1), "strip": png(20000, 3)}
cap_address_space()
results = {name: measure(centre, {"image": [data]}) for name, data in inputs.items()}
results["canvas"] = measure(natural, {"image": [inputs["very wide"]]})
results["jpeg header"] = measure(centre, {"image": [bomb]})
print(json.dumps(results))
"""


@linux_only
def test_elongated_images_and_huge_headers_decode_or_refuse_in_little_memory() -> None:
    # A 1x8000 image bound for a 224 centre crop was resized to 224 x 896,112 to keep 224 x 224
    # of it: 1.2 GB and 1.2 s, linear in the width (1x100,000: ~15 GB). A JPEG header claiming
    # 30000x30000 was decoded at its DCT-shrunk 3750x3750 (40 MB) before anything refused it.
    results = run_measured(IMAGE_CASES.replace("sys.argv[1]", repr(jpeg_claiming(30000, 30000).hex())))
    for name in ("wide", "tall", "very wide", "strip"):  # a strip of 3x20000 has no aligned near cut
        grown, got = results[name]
        assert got == [[3, 224, 224]], (name, got)
        assert grown < 100, (name, grown)
    grown, got = results["canvas"]  # resize=256 without size: the output alone is 256 x 25,600,000
    assert "DecompressionBombError" in got and "its output is 25600000x256" in got, got
    assert grown < 20, grown
    grown, got = results["jpeg header"]
    assert "the image is 30000x30000 = 900,000,000 pixels" in got, got
    assert grown < 20, grown


def test_a_one_pixel_high_image_gives_exactly_its_whole_resize_window() -> None:
    # One row (or column) high, the resize along it copies the row, so the whole image's resize
    # is cheap to compute here: the decode's window of it must match it pixel for pixel.
    for width, height in ((8000, 1), (1, 8000), (5003, 1)):
        data = png(width, height, seed=width)
        got = naiad.decode_images("image", size=224, crop="center")({"image": [data]})["image"][0]
        pixels = np.array(Image.open(io.BytesIO(data)))
        line = pixels.reshape(-1, 3)  # the row, or the column
        long = 224 * len(line)
        import torch
        import torch.nn.functional as F

        resized = F.interpolate(
            torch.from_numpy(line.T.copy())[None, :, None, :], size=(1, long), mode="bilinear", antialias=True
        )[0, :, 0]
        start = int(round((long - 224) / 2.0))
        window = resized[:, start : start + 224]
        expected = window[:, None, :].expand(3, 224, 224) if height == 1 else window[:, :, None].expand(3, 224, 224)
        assert torch.equal(got, expected), (width, height)


def test_a_strip_without_an_aligned_cut_lands_within_a_pixel_of_its_whole_resize() -> None:
    # 7x2003 resized for a 224 centre crop is 224 x 64,096, and 2003 is prime: no near cut keeps
    # the grid, so the window is cut at the nearest whole input pixel (NOTE [ Resizing a window ]).
    import torch
    import torch.nn.functional as F

    yy, xx = np.mgrid[0:7, 0:2003]
    smooth = np.stack([xx * 255 // 2002, yy * 40, 127 + 120 * np.sin(xx / 40)], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(smooth).save(out, "PNG")
    got = naiad.decode_images("image", size=224, crop="center")({"image": [out.getvalue()]})["image"][0]
    pixels = torch.from_numpy(smooth).permute(2, 0, 1)[None]
    resized = F.interpolate(pixels, size=(224, int(224 * 2003 / 7)), mode="bilinear", antialias=True)[0]
    start = int(round((resized.shape[-1] - 224) / 2.0))
    diff = (got.int() - resized[:, :, start : start + 224].int()).abs().float()
    assert float(diff.mean()) < 2.0, float(diff.mean())  # a window elsewhere differs by tens of levels


# --- images: the pixel budget -----------------------------------------------------------------


def test_images_over_max_pixels_are_decode_errors_naming_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = png(40, 30), png(120, 100)
    batch = {"image": [small, large, small], "__key__": ["a", "b", "c"]}
    t = naiad.decode_images("image", size=16, crop="center", max_pixels=10_000)
    with pytest.raises(DecodeError, match=r"1 of 3 images did not decode: __key__ 'b' \(row 1\)") as info:
        t(batch)
    error = info.value
    assert error.rows == [1]
    assert "the image is 120x100 = 12,000 pixels, over the decode's budget of 10,000" in error.reasons[0]
    assert "give a larger `max_pixels=`" in error.reasons[0]
    assert error.kept is not None and error.kept["__key__"] == ["a", "c"] and error.kept["image"].shape == (2, 3, 16, 16)
    assert naiad.decode_images("image", size=16, crop="center", max_pixels=12_000)(batch)["image"].shape == (3, 3, 16, 16)


@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_a_jpeg_header_over_the_budget_is_refused_at_its_full_size_before_decoding(
    decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The header's size counts, not the DCT-shrunk size a 224 crop would decode at (1/64 of it).
    data, small = jpeg_claiming(5000, 4000), png(30, 20)
    decoded: list[str] = []
    if decoder == "simplejpeg":
        real = pytest.importorskip("simplejpeg")

        def decode_jpeg(*args: object, **kwargs: object) -> object:
            decoded.append("simplejpeg")
            return real.decode_jpeg(*args, **kwargs)

        spy = SimpleNamespace(decode_jpeg_header=real.decode_jpeg_header, decode_jpeg=decode_jpeg)
        monkeypatch.setattr(images, "simplejpeg", lambda: spy)
    else:
        monkeypatch.setattr(images, "simplejpeg", lambda: None)
    load = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append("pillow") or load(self))
    t = naiad.decode_images("image", size=224, crop="center", max_pixels=10**6)
    with pytest.raises(DecodeError, match=r"DecompressionBombError: the image is 5000x4000 = 20,000,000 pixels"):
        t({"image": [data]})
    assert decoded == []  # refused before either decoder made a pixel
    t({"image": [small]})
    assert "pillow" in decoded  # the spy sees a decode


def test_the_output_without_size_counts_against_the_budget() -> None:
    # 1x2000 with resize=64: 64 x 128,000 = 8,192,000 pixels of output from 2,000 of image.
    data = png(2000, 1)
    t = naiad.decode_images("image", resize=64, max_pixels=8_000_000)
    with pytest.raises(DecodeError, match=r"its output is 128000x64 = 8,192,000 pixels"):
        t({"image": [data]})
    assert naiad.decode_images("image", resize=64, max_pixels=8_192_000)({"image": [data]})["image"][0].shape == (3, 64, 128000)


def test_a_resize_over_the_budget_is_refused_before_it_runs() -> None:
    # 3x200 bound for a 16 centre crop is resized to 16 x 1,066, its window too near the start
    # for a near cut: the decode computes 16 x ~545 to keep 16 x 16, and that is what the budget
    # sees (the image, 600 pixels, and the output, 256, are under it).
    data = png(200, 3)
    with pytest.raises(DecodeError, match=r"its resize is \d+x16 = [\d,]+ pixels, over the decode's budget of 5,000"):
        naiad.decode_images("image", size=16, crop="center", max_pixels=5_000)({"image": [data]})
    assert naiad.decode_images("image", size=16, crop="center")({"image": [data]})["image"].shape == (1, 3, 16, 16)


def test_the_default_budget_is_twice_pillows_limit_read_when_the_batch_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    t = naiad.decode_images("image", resize=64)
    data = png(1000, 1)  # output 64 x 64,000 = 4,096,000 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2_000_000)
    with pytest.raises(DecodeError, match=r"over the decode's budget of 4,000,000 \(twice PIL.Image.MAX_IMAGE_PIXELS"):
        t({"image": [data]})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow's limit off: no budget
    assert t({"image": [data]})["image"][0].shape == (3, 64, 64000)
    assert bounds.pixel_budget(None, 89_478_485).pixels == 178_956_970
    assert bounds.pixel_budget(None, None).pixels is None
    assert bounds.pixel_budget(5, 89_478_485) == bounds.PixelBudget(5, by_default=False)


def test_an_image_over_the_budget_is_skipped_with_on_bad_rows_skip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "images"
    folder.mkdir()
    for name, data in (("a.png", png(20, 20)), ("b.png", png(300, 200)), ("c.png", png(30, 20))):
        (folder / name).write_bytes(data)
    source = naiad.read_images(str(folder), on_bad_rows="skip", index_dir=False)
    transform = naiad.decode_images("image", size=16, crop="center", max_pixels=1000)
    loader = naiad.DataLoader(source, batch_size=3, transform=transform)
    batches = list(loader)
    assert [b["image"].shape[0] for b in batches] == [2]
    ledger = loader.stats().bad_row_ledger
    assert len(ledger) == 1 and ledger[0]["key"].endswith("b.png") and "max_pixels" in ledger[0]["reason"]


def test_max_pixels_must_be_none_or_a_positive_int() -> None:
    for bad in (0, -5, True, 1.5, "100"):
        with pytest.raises(ConfigError, match="`max_pixels` must be None"):
            naiad.decode_images("image", max_pixels=bad)  # type: ignore[arg-type]


# --- audio ------------------------------------------------------------------------------------


sf = pytest.importorskip("soundfile")


def wav(frames: int, rate: int = 8000, header_rate: int | None = None, channels: int = 1) -> bytes:
    """A 16-bit WAV written by Python's ``wave``, its header's rate then set to ``header_rate``."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.arange(frames * channels) % 1000).astype("<i2").tobytes())
    data = bytearray(out.getvalue())
    if header_rate is not None:
        data[24:32] = struct.pack("<II", header_rate, header_rate * 2 * channels)
    return bytes(data)


def flac_claiming(frames: int) -> bytes:
    """A real 5,000-frame FLAC at 8 kHz whose STREAMINFO says it has ``frames`` frames."""
    out = io.BytesIO()
    sf.write(out, ((np.arange(5000) % 3000) / 32768).astype(np.float32), 8000, format="FLAC", subtype="PCM_16")
    data = bytearray(out.getvalue())
    # 'fLaC', the block header (4 bytes), then STREAMINFO: total samples are the low 36 bits of
    # its bytes 10-17
    packed = int.from_bytes(data[18:26], "big")
    data[18:26] = ((packed >> 36 << 36) | frames).to_bytes(8, "big")
    return bytes(data)


AUDIO_CASES = r"""
one_hz, flac = bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2])
resampled = naiad.decode_audio("a", sample_rate=16000)
unbounded = naiad.decode_audio("a", max_seconds=None)
cap_address_space()
print(json.dumps({"1 Hz": measure(resampled, {"a": [one_hz]}), "flac": measure(unbounded, {"a": [flac]})}))
"""


@linux_only
def test_audio_headers_that_lie_cost_little_memory() -> None:
    # A 4 KB WAV whose header says 1 Hz became 32,000,000 samples at 16 kHz (611 MB). A FLAC
    # claiming 2**32 frames had them all allocated up front (16 GiB) before its read failed.
    one_hz, flac = wav(2000, header_rate=1), flac_claiming(1 << 32)
    code = AUDIO_CASES.replace("sys.argv[1]", repr(one_hz.hex())).replace("sys.argv[2]", repr(flac.hex()))
    results = run_measured(code)
    grown, got = results["1 Hz"]
    assert "sample rate is 1 Hz, outside the 100-384,000 Hz" in got, got
    assert grown < 50, grown
    grown, got = results["flac"]  # libsndfile fails past the real frames, as before; without allocating
    assert "DecodeError" in got and "Unable to allocate" not in got and "MemoryError" not in got, got
    assert grown < 50, grown


def test_a_clip_longer_than_max_seconds_is_refused_before_decoding() -> None:
    batch = {"a": [wav(8000), wav(24_000), wav(4000)], "__key__": ["short", "long", "half"]}
    t = naiad.decode_audio("a", max_seconds=2.0)
    with pytest.raises(DecodeError, match=r"1 of 3 clips did not decode: __key__ 'long' \(row 1\)") as info:
        t(batch)
    assert "the header says 24,000 frames at 8,000 Hz (3.0 s), longer than `max_seconds`=2" in info.value.reasons[0]
    kept = info.value.kept
    assert kept is not None and [len(c) for c in kept["a"]] == [8000, 4000]
    assert [len(c) for c in naiad.decode_audio("a", max_seconds=None)(batch)["a"]] == [8000, 24_000, 4000]
    # a crop bounds the output itself: max_seconds does not apply
    assert naiad.decode_audio("a", seconds=1.0, max_seconds=2.0)(batch)["a"].shape == (3, 8000)


def test_the_default_max_seconds_refuses_a_low_rate_header_claiming_hours() -> None:
    # 100 Hz is a plausible rate; 200,000 frames of it are 2,000 s, over the default 600 s
    with pytest.raises(DecodeError, match=r"2,000.0 s\), longer than `max_seconds`=600"):
        naiad.decode_audio("a", sample_rate=16000)({"a": [wav(200_000, header_rate=100)]})


def test_a_flac_whose_header_claims_2_36_frames_is_refused_by_its_length() -> None:
    with pytest.raises(DecodeError, match=r"the header says 68,719,476,735 frames at 8,000 Hz"):
        naiad.decode_audio("a")({"a": [flac_claiming((1 << 36) - 1)]})
    # a header that understates is read as libsndfile reads it: the frames it says
    short = naiad.decode_audio("a")({"a": [flac_claiming(100)]})["a"][0]
    assert short.shape == (100,)


def test_a_wav_whose_data_size_lies_decodes_its_real_frames() -> None:
    data = bytearray(wav(5000))
    data[40:44] = struct.pack("<I", 0xFFFFFFF0)  # the data chunk's size: libsndfile keeps to the file
    got = naiad.decode_audio("a")({"a": [bytes(data)]})["a"][0]
    assert got.shape == (5000,)


def test_implausible_rates_and_channel_counts_are_refused() -> None:
    for rate in (1, 99, 384_001, 10**9):
        with pytest.raises(ValueError, match=f"sample rate is {rate:,} Hz"):
            bounds.audio_frame_budget(rate, 1, 100, 600.0)
    with pytest.raises(ValueError, match="the header says 1,000 channels"):
        bounds.audio_frame_budget(16000, 1000, 100, 600.0)
    assert bounds.audio_frame_budget(100, 1, 60_000, 600.0) == 60_000
    assert bounds.audio_frame_budget(384_000, 256, 10**12, None) is None
    # with `seconds` too: the crop's arithmetic follows the rate
    with pytest.raises(DecodeError, match="sample rate is 1 Hz"):
        naiad.decode_audio("a", seconds=1.0)({"a": [wav(2000, header_rate=1)]})


def test_clips_read_in_chunks_mix_to_the_same_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    stereo = np.stack([np.sin(np.arange(9001) / 7.0), np.cos(np.arange(9001) / 5.0)], 1).astype(np.float32) * 0.5
    out = io.BytesIO()
    sf.write(out, stereo, 8000, format="WAV", subtype="FLOAT")
    data = out.getvalue()
    whole = naiad.decode_audio("a")({"a": [data]})["a"][0]
    monkeypatch.setattr(bounds, "AUDIO_CHUNK_SAMPLES", 1000)  # 500 stereo frames a read
    chunked = naiad.decode_audio("a")({"a": [data]})["a"][0]
    cropped = naiad.decode_audio("a", seconds=1.0, crop="center")({"a": [data]})["a"][0]
    assert np.array_equal(chunked.numpy(), whole.numpy())
    assert np.array_equal(whole.numpy(), stereo.mean(axis=1, dtype=np.float32))
    start = (9001 - 8000) // 2
    assert np.array_equal(cropped.numpy(), whole.numpy()[start : start + 8000])


def test_max_seconds_must_be_none_or_positive() -> None:
    for bad in (0, -1.0, True, "600", float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="`max_seconds` must be None"):
            naiad.decode_audio("a", max_seconds=bad)  # type: ignore[arg-type]
