"""``naiad inspect`` on samples, real files: shards written by ``webdataset``'s TarWriter, image
folders written with Pillow and Parquet written by Hugging Face ``datasets``: keys, extensions
with counts, image sizes and formats from headers, decode times, and the advice."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from naiad.cli import main
from naiad.tools.inspection import inspect_source

wds = pytest.importorskip("webdataset", reason="the sample tests write shards with webdataset (pip install 'naiad[test]')")
datasets = pytest.importorskip("datasets", reason="the sample tests write Parquet with datasets (pip install 'naiad[test]')")
Image = pytest.importorskip("PIL.Image", reason="the sample tests write images with Pillow (pip install 'naiad[test]')")


def encode(array: np.ndarray, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt, **kw)
    return out.getvalue()


def inspect_json(capsys, *args: str) -> dict:
    assert main(["inspect", "--json", "--time-budget", "0.5", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_tar_shards_show_keys_extension_counts_sizes_formats_and_decode_time(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for shard in range(2):
        with wds.TarWriter(str(tmp_path / f"train-{shard}.tar")) as sink:
            for k in range(10):
                sample = {"__key__": f"s{shard}_{k:02d}", "cls": k % 3,
                          "jpg": encode(rng.integers(0, 256, (24 + k, 32, 3), dtype=np.uint8), "JPEG")}
                if k % 2 == 0:
                    sample["txt"] = "even"
                sink.write(sample)
    report = inspect_json(capsys, str(tmp_path / "train-{0..1}.tar"), "--images", "100")
    assert report["reader"] == "read_webdataset"
    s = report["samples"]
    assert s["kind"] == "webdataset" and s["samples"] == 20
    assert s["keys"] == {"column": "__key__", "first": ["s0_00", "s0_01", "s0_02", "s0_03", "s0_04"]}
    assert s["extensions"] == {"cls": 20, "jpg": 20, "txt": 10}
    (jpg,) = s["columns"]
    assert jpg["name"] == "jpg" and jpg["sampled"] == 20 and jpg["formats"] == {"JPEG": 20} and jpg["modes"] == {"RGB": 20}
    assert jpg["width"] == {"min": 32, "median": 32, "max": 32}
    assert jpg["height"]["min"] == 24 and jpg["height"]["max"] == 33
    assert jpg["decode"]["images"] >= 1 and jpg["decode"]["ms_per_image"] > 0
    assert "max_size" not in jpg["decode"]  # small images: no shrink to time
    assert report["head"][0]["jpg"].startswith("<JPEG, ")  # bytes named, not printed
    assert main(["inspect", str(tmp_path / "train-{0..1}.tar"), "--time-budget", "0.2"]) == 0
    text = capsys.readouterr().out
    assert "samples: 20 (webdataset)" in text and "extensions: cls 20, jpg 20, txt 10" in text


def test_large_jpegs_get_a_measured_max_size_advice(tmp_path, capsys):
    root = tmp_path / "photos"
    root.mkdir()
    ramp = np.linspace(0, 255, 1200)[None, :, None] * np.ones((900, 1, 3))
    for i in range(3):
        (root / f"p{i}.jpg").write_bytes(encode((ramp + i).clip(0, 255).astype(np.uint8), "JPEG", quality=90))
    report = inspect_json(capsys, str(root))
    assert report["reader"] == "read_images" and report["format"] == "images"
    s = report["samples"]
    assert s["kind"] == "images" and s["extensions"] == {"jpg": 3}
    assert s["keys"]["first"] == ["p0.jpg", "p1.jpg", "p2.jpg"]
    (image,) = s["columns"]
    assert image["width"]["median"] == 1200 and image["height"]["median"] == 900
    shrunk = image["decode"]["max_size"]
    assert shrunk["max_size"] == 256 and shrunk["speedup"] > 2  # 1200x900 against 256x192
    (note,) = [n for n in report["notes"] if "--max-size" in n]
    assert "images are 1200x900 JPEG" in note and "`naiad convert --max-size 256` would make decode about" in note


def test_small_pngs_get_the_decode_advice(tmp_path, capsys):
    root = tmp_path / "fashion"
    for c in ("boot", "shirt"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            (root / c / f"{i}.png").write_bytes(encode(np.full((28, 28), i * 20, np.uint8), "PNG"))
    report = inspect_json(capsys, str(root))
    (image,) = report["samples"]["columns"]
    assert image["formats"] == {"PNG": 8} and image["modes"] == {"L": 8}
    assert image["width"] == {"min": 28, "median": 28, "max": 28}
    assert any("28x28 PNG" in n and "`naiad convert --decode` stores their pixels" in n for n in report["notes"])


def test_parquet_written_by_datasets_shows_its_images(tmp_path, capsys):
    images = [encode(np.full((10, 14, 3), k, np.uint8), "PNG") for k in range(6)]
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": list(range(6))},
                                    features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}))
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    report = inspect_json(capsys, str(tmp_path / "hf.parquet"))
    s = report["samples"]
    assert s["kind"] == "table" and s["extensions"] is None and s["keys"]["column"] is None
    (image,) = s["columns"]
    assert image["formats"] == {"PNG": 6} and image["width"]["max"] == 14 and image["height"]["max"] == 10


def test_decoded_pixels_show_as_a_uint8_tensor_column_and_tables_have_no_samples(tmp_path, capsys):
    root = tmp_path / "images"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.png").write_bytes(encode(np.full((8, 6, 3), i, np.uint8), "PNG"))
    assert main(["convert", "--quiet", str(root), str(tmp_path / "px.parquet"), "--decode"]) == 0
    report = inspect_json(capsys, str(tmp_path / "px.parquet"))
    column = next(c for c in report["columns"] if c["name"] == "image")
    assert column["dtype"] == "uint8" and column["batch"] == "tensor" and column["shape"] == "(n, 3, 8, 6)"
    assert report["samples"] is None  # nothing left to decode
    (tmp_path / "t.csv").write_text("a\n1\n")
    assert inspect_source(str(tmp_path / "t.csv")).samples is None


def test_a_folder_without_images_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no images here")
    assert main(["inspect", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "empty") in err and "holds no image file" in err


def test_a_corrupt_image_is_counted_not_fatal(tmp_path, capsys):
    root = Path(tmp_path / "mixed")
    root.mkdir()
    (root / "good.png").write_bytes(encode(np.zeros((5, 5, 3), np.uint8), "PNG"))
    (root / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    report = inspect_json(capsys, str(root))
    (image,) = report["samples"]["columns"]
    assert image["sampled"] == 2 and image["not_images"] == 1 and image["formats"]["PNG"] == 2
