"""naiad.decode_images on real encoded images (written by Pillow here, tests/image_data.py):
differential against a plain Pillow pipeline (resize, centre crop, stretch, padding), modes and
formats, errors naming the sample, threads and output, and the decompression-bomb limit. Random
crops and flips: tests/unit/test_decode_images_random.py."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import naiad  # noqa: E402
from naiad.errors import ConfigError, DecodeError, SourceError  # noqa: E402
from naiad.media import images  # noqa: E402
from tests.image_data import RNG, encode, photo  # noqa: E402


def reference_eval(data: bytes, shorter: int, crop: int, mode: str = "RGB") -> torch.Tensor:
    """torchvision's evaluation transform done with Pillow alone: open, convert, Resize(shorter)
    (bilinear, shorter side, longer side truncated), CenterCrop(crop)."""
    im = Image.open(io.BytesIO(data)).convert(mode)
    w, h = im.size
    rw, rh = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    im = im.resize((rw, rh), Image.BILINEAR)
    left, top = int(round((rw - crop) / 2)), int(round((rh - crop) / 2))
    arr = np.array(im.crop((left, top, left + crop, top + crop)))
    return torch.from_numpy(arr.reshape(crop, crop, -1)).permute(2, 0, 1)


def mean_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.int() - b.int()).abs().float().mean())


# --- differential against Pillow -----------------------------------------------------------


@pytest.mark.parametrize("width,height", [(500, 375), (375, 500), (640, 480), (333, 333)])
def test_eval_transform_matches_pillow_resize_and_centre_crop(decoder: str, width: int, height: int) -> None:
    # Full-scale decode (the target is more than half the source): the same pixels as Pillow's
    # resize then crop, to one level (torch's uint8 resampler rounds like Pillow's, not always
    # identically).
    data = encode(photo(width, height), quality=90)
    out = naiad.decode_images("image", resize=256, crop="center", size=224)({"image": [data]})["image"]
    assert out.shape == (1, 3, 224, 224) and out.dtype == torch.uint8
    expected = reference_eval(data, 256, 224)
    assert mean_abs_diff(out[0], expected) < 0.05
    assert int((out[0].int() - expected.int()).abs().max()) <= 1


def test_large_photo_decoded_at_reduced_dct_scale_stays_close_to_pillow(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2000x1500 bound for 256 then 224: decoded at 1/4 (500x375) in the DCT. The bound is looser
    # than a full decode's (libjpeg's scaled IDCT is a different low-pass from an antialiased
    # resize of the full image): mean under 1 level of 255, 99% of pixels within 3.
    data = encode(photo(2000, 1500), quality=90)
    shapes: list[tuple[int, int]] = []
    if decoder == "simplejpeg":
        import simplejpeg

        real = simplejpeg.decode_jpeg

        def spy(*args: object, **kwargs: object) -> np.ndarray:
            pixels = real(*args, **kwargs)
            shapes.append(pixels.shape[:2])
            return pixels

        monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    else:
        from PIL import JpegImagePlugin

        real_draft = JpegImagePlugin.JpegImageFile.draft

        def draft_spy(self: Image.Image, mode: str, size: tuple[int, int]) -> object:
            result = real_draft(self, mode, size)
            shapes.append((self.size[1], self.size[0]))
            return result

        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft_spy)
    out = naiad.decode_images("image", resize=256, crop="center", size=224)({"image": [data]})["image"][0]
    assert shapes == [(375, 500)]
    expected = reference_eval(data, 256, 224)
    diff = (out.int() - expected.int()).abs().float()
    assert float(diff.mean()) < 1.0
    assert float(diff.flatten().quantile(0.99)) <= 3


def test_resize_shorter_side_without_size_keeps_each_image_its_own_size(decoder: str) -> None:
    # Less than halved (no DCT shrink), so the same pixels as Pillow's resize; enlarged too.
    datas = [encode(photo(w, h), quality=95) for (w, h) in [(500, 375), (200, 500), (64, 64)]]
    out = naiad.decode_images("image", resize=256)({"image": datas})["image"]
    assert isinstance(out, list)
    assert [tuple(t.shape) for t in out] == [(3, 256, 341), (3, 640, 256), (3, 256, 256)]
    for data, got in zip(datas, out, strict=True):
        im = Image.open(io.BytesIO(data)).convert("RGB")
        ref = torch.from_numpy(np.array(im.resize((got.shape[2], got.shape[1]), Image.BILINEAR))).permute(2, 0, 1)
        assert mean_abs_diff(got, ref) < 0.05


def test_no_resize_without_size_returns_the_decoded_pixels(decoder: str) -> None:
    png = encode(photo(37, 23), "PNG")
    out = naiad.decode_images("image")({"image": [png, png]})["image"]
    expected = torch.from_numpy(np.array(Image.open(io.BytesIO(png)))).permute(2, 0, 1)
    assert len(out) == 2 and all(torch.equal(t, expected) for t in out)


def test_stretch_resizes_the_whole_image_ignoring_aspect() -> None:
    data = encode(photo(300, 100), "PNG")
    out = naiad.decode_images("image", size=(50, 60), resize="stretch")({"image": [data]})["image"][0]
    ref = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).resize((60, 50), Image.BILINEAR))).permute(2, 0, 1)
    assert out.shape == (3, 50, 60)
    assert int((out.int() - ref.int()).abs().max()) <= 1


def test_centre_crop_larger_than_the_resized_image_pads_with_zeros_as_torchvision() -> None:
    data = encode(photo(200, 100), "PNG")
    out = naiad.decode_images("image", resize=50, crop="center", size=(64, 120))({"image": [data]})["image"][0]
    # Resize(50) gives 100x50; CenterCrop((64, 120)) pads 7 rows above, 7 below, 10 columns each side.
    assert out.shape == (3, 64, 120)
    assert int(out[:, :7].abs().sum()) == 0 and int(out[:, 57:].abs().sum()) == 0
    assert int(out[:, :, :10].abs().sum()) == 0 and int(out[:, :, 110:].abs().sum()) == 0
    ref = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).resize((100, 50), Image.BILINEAR))).permute(2, 0, 1)
    assert int((out[:, 7:57, 10:110].int() - ref.int()).abs().max()) <= 1


# --- modes and formats ----------------------------------------------------------------------


def _pillow_converted(data: bytes, mode: str) -> torch.Tensor:
    arr = np.array(Image.open(io.BytesIO(data)).convert(mode))
    return torch.from_numpy(arr.reshape(arr.shape[0], arr.shape[1], -1)).permute(2, 0, 1)


def _inputs() -> dict[str, bytes]:
    rgb = photo(64, 48)
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.fromarray(RNG.integers(0, 256, (48, 64), dtype=np.uint8)))
    palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette_transparent = palette.copy()
    palette_transparent.info["transparency"] = 3
    out = {
        "jpeg_rgb": encode(rgb, quality=92),
        "jpeg_gray": encode(rgb.convert("L"), quality=92),
        "jpeg_cmyk": encode(rgb.convert("CMYK"), quality=92),
        "png_rgb": encode(rgb, "PNG"),
        "png_gray": encode(rgb.convert("L"), "PNG"),
        "png_rgba": encode(rgba, "PNG"),
        "png_palette": encode(palette, "PNG"),
        "png_palette_transparent": encode(palette_transparent, "PNG"),
        "png_16bit": encode(Image.fromarray((np.arange(64 * 48).reshape(48, 64) * 20).astype(np.uint16)), "PNG"),
        "bmp": encode(rgb, "BMP"),
        "gif": encode(palette, "GIF"),
    }
    from PIL import features

    if features.check("webp"):
        out["webp"] = encode(rgb, "WEBP", lossless=True)
    return out


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_every_input_kind_converts_to_the_mode_as_pillow_does(decoder: str, mode: str) -> None:
    inputs = _inputs()
    out = naiad.decode_images("image", mode=mode)({"image": list(inputs.values())})["image"]
    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    for (name, data), got in zip(inputs.items(), out, strict=True):
        expected = _pillow_converted(data, mode)
        assert got.shape == (channels, 48, 64), name
        # JPEG: libjpeg-turbo converts colour spaces itself (gray as Y rather than Pillow's
        # luma of the decoded RGB, gray to RGB): rounding may differ by a level. Lossless
        # formats: exactly Pillow's conversion.
        bound = 1.0 if name.startswith("jpeg") else 0.001
        assert mean_abs_diff(got, expected) < bound, name
    if mode == "RGB":
        gray = out[list(inputs).index("png_gray")]
        assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    if mode == "RGBA":
        assert bool((out[list(inputs).index("jpeg_rgb")][3] == 255).all())


def test_grayscale_mode_matches_pillow_luma_for_a_resized_batch(decoder: str) -> None:
    data = encode(photo(500, 375), quality=90)
    out = naiad.decode_images("image", resize=256, crop="center", size=224, mode="L")({"image": [data]})["image"]
    assert out.shape == (1, 1, 224, 224)
    assert mean_abs_diff(out[0], reference_eval(data, 256, 224, mode="L")) < 1.0


def test_inputs_may_be_object_arrays_bytearrays_uint8_arrays_or_hf_structs() -> None:
    data = encode(photo(40, 30), "PNG")
    column = np.empty(4, dtype=object)
    column[:] = [data, bytearray(data), np.frombuffer(data, dtype=np.uint8), {"bytes": data, "path": "x.png"}]
    out = naiad.decode_images("image", size=16, resize="stretch")({"image": column})["image"]
    assert all(torch.equal(out[0], x) for x in out)


# --- errors ---------------------------------------------------------------------------------


def test_corrupt_and_truncated_images_raise_source_error_naming_each_sample(decoder: str) -> None:
    good = encode(photo(80, 60), quality=90)
    batch = {
        "image": [good, b"not an image at all", good[: len(good) // 3], good],
        "__key__": ["s000", "s001", "s002", "s003"],
        "label": torch.arange(4),
    }
    t = naiad.decode_images("image", resize=32, crop="center", size=32)
    with pytest.raises(SourceError) as info:
        t(batch)
    error = info.value
    assert isinstance(error, DecodeError)
    assert error.rows == [1, 2]
    assert error.keys == ["__key__ 's001'", "__key__ 's002'"]
    message = str(error)
    assert "column 'image'" in message and "2 of 4 images did not decode" in message
    assert "s001" in message and "not an image Pillow can read" in message and "s002" in message
    kept = error.kept
    assert kept is not None
    assert kept["__key__"] == ["s000", "s003"] and kept["label"].tolist() == [0, 3]
    assert torch.equal(kept["image"], t({"image": [good, good]})["image"])
    rebuilt = pickle.loads(pickle.dumps(error))
    assert type(rebuilt) is DecodeError and rebuilt.rows == [1, 2] and str(rebuilt) == message


def test_errors_name_the_path_column_else_the_key_column() -> None:
    t = naiad.decode_images("image")
    with pytest.raises(DecodeError, match=r"path 'images/b.jpg' \(row 1\)"):
        t({"image": [encode(photo(8, 8), "PNG"), b"\xff\xd8\xff\xe0bad"], "path": ["images/a.png", "images/b.jpg"]})
    with pytest.raises(DecodeError, match=r"__index__ 41 \(row 0\)"):
        t({"image": [b""], "__index__": np.array([41])})
    with pytest.raises(DecodeError, match=r"row 0.*expected the image's encoded bytes, got NoneType"):
        t({"image": [None]})


def test_missing_column_and_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="no column 'image'"):
        naiad.decode_images("image")({"jpg": []})
    bad = [
        (dict(size=0), "`size` must be"),
        (dict(size=(3, 4, 5)), "`size` must be"),
        (dict(resize="longer"), "`resize` must be"),
        (dict(crop="middle"), "`crop` must be"),
        (dict(crop="center"), "needs an output `size`"),
        (dict(size=32), "resize='stretch'"),
        (dict(size=32, crop="random", resize="stretch"), "`crop='random'` with `resize='stretch'`"),
        (dict(size=32, crop="center", resize="stretch"), "nothing for `crop='center'`"),
        (dict(mode="CMYK"), "`mode` must be"),
        (dict(size=32, crop="random", scale=(0.5, 0.1)), "`scale` must be"),
        (dict(threads=0), "`threads` must be"),
        (dict(interpolation="lanczos"), "`interpolation` must be"),
    ]
    for kwargs, match in bad:
        with pytest.raises(ConfigError, match=match):
            naiad.decode_images("image", **kwargs)  # type: ignore[arg-type]


def test_naiad_imports_without_pillow_and_decode_images_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['PIL'] = None\n"
        "import naiad\n"
        "try:\n"
        "    naiad.decode_images('image')\n"
        "except naiad.ConfigError as e:\n"
        "    print('ConfigError:', e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ConfigError: decode_images needs Pillow" in result.stdout
    assert "pip install 'naiad[images]'" in result.stdout


# --- threads and output ---------------------------------------------------------------------


def test_decoding_runs_on_pool_threads_never_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[int] = set()
    real = images._decode

    def spy(*args: object, **kwargs: object) -> object:
        seen.add(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(images, "_decode", spy)
    data = encode(photo(64, 48), quality=90)
    batch = {"image": [data] * 16}
    one = naiad.decode_images("image", size=32, crop="center", threads=1)(batch)["image"]
    assert threading.get_ident() not in seen and len(seen) == 1
    four = naiad.decode_images("image", size=32, crop="center", threads=4)(batch)["image"]
    assert threading.get_ident() not in seen
    assert torch.equal(one, four)


def test_other_columns_are_kept_and_the_input_batch_is_not_changed() -> None:
    data = encode(photo(64, 48), "PNG")
    batch = {"image": [data, data], "label": torch.tensor([3, 4]), "name": ["a", "b"], "epoch_note": 7}
    out = naiad.decode_images("image", size=16, crop="center")(batch)
    assert out["label"] is batch["label"] and out["name"] is batch["name"] and out["epoch_note"] == 7
    assert batch["image"] == [data, data]
    assert out["image"].shape == (2, 3, 16, 16) and out["image"].is_contiguous()


def test_empty_batch_gives_an_empty_tensor() -> None:
    out = naiad.decode_images("image", size=(8, 9), crop="center")({"image": []})["image"]
    assert out.shape == (0, 3, 8, 9)


# --- normalize ------------------------------------------------------------------------------


def test_an_image_over_the_decompression_bomb_limit_is_refused_before_decoding(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(photo(200, 100), quality=90)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 5000)  # refused above twice this: 10,000 pixels
    with pytest.raises(DecodeError, match="DecompressionBombError"):
        naiad.decode_images("image")({"image": [data]})
    small = encode(photo(80, 60), quality=90)  # 4,800 pixels: decoded
    assert naiad.decode_images("image")({"image": [small]})["image"][0].shape == (3, 60, 80)
