"""``naiad convert`` for samples on real files: image folders written with Pillow, shards written
by ``webdataset``'s TarWriter and Parquet written by Hugging Face ``datasets``, converted to tar
shards that the ``webdataset`` library reads and to Parquet that ``datasets`` reads, and read
back by naiad with every sample once; ``--max-size``, ``--decode``, ``--shuffle``, the manifest,
and bad input named by its file and key."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import naiad
from naiad.cli import main
from naiad.errors import ConfigError, SourceError
from naiad.tools.convert import ConvertOptions, convert

wds = pytest.importorskip("webdataset", reason="the sample tests read shards with webdataset (pip install 'naiad[test]')")
datasets = pytest.importorskip("datasets", reason="the sample tests read Parquet with datasets (pip install 'naiad[test]')")
Image = pytest.importorskip("PIL.Image", reason="the sample tests write images with Pillow (pip install 'naiad[test]')")


def pixels(seed: int, height: int, width: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (height, width) if channels == 1 else (height, width, channels)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def encode(array: np.ndarray, fmt: str, **kw: Any) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt, **kw)
    return out.getvalue()


def write_folder(root: Path, per_class: dict[str, int], *, size: tuple[int, int] = (28, 28), channels: int = 1,
                 fmt: str = "PNG") -> dict[str, bytes]:
    """Class folders of images (Pillow); returns {key (class/name): the file's bytes}."""
    written = {}
    ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
    for c, (name, count) in enumerate(sorted(per_class.items())):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            data = encode(pixels(100 * c + i, size[0], size[1], channels), fmt)
            (root / name / f"{i:03d}.{ext}").write_bytes(data)
            written[f"{name}/{i:03d}"] = data
    return written


def run(*args: str) -> int:
    return main(["convert", "--quiet", *args])


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def wds_samples(paths: list[str]) -> list[dict[str, Any]]:
    """The samples as the webdataset library's own iterator reads them (no decoding)."""
    return list(wds.WebDataset(paths, shardshuffle=False, empty_check=False))


def naiad_keys(source: naiad.sources.Source, **kw: Any) -> list[str]:
    """Every key naiad's loader delivers in a shuffled epoch with two thread workers."""
    loader = naiad.DataLoader(source, batch_size=4, shuffle=True, seed=1, num_workers=2, worker_mode="thread", **kw)
    return [k for batch in loader for k in batch["__key__"]]


# -- tar shards ----------------------------------------------------------------------------------


def test_a_folder_becomes_tar_shards_the_webdataset_library_reads_with_the_bytes_as_stored(tmp_path):
    written = write_folder(tmp_path / "images", {"cat": 9, "dog": 8})
    dst = str(tmp_path / "shards") + "/"
    assert run(str(tmp_path / "images"), dst, "--format", "webdataset", "--rows-per-shard", "5") == 0
    paths = sorted(glob.glob(str(tmp_path / "shards" / "part-*.tar")))
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}.tar" for i in range(4)]
    got = wds_samples(paths)
    assert [s["__key__"] for s in got] == sorted(written)  # ImageFolder's order, every sample once
    for s in got:
        assert s["png"] == written[s["__key__"]]
        assert s["cls"] == (b"0" if s["__key__"].startswith("cat/") else b"1")
        assert set(s) - {"__url__", "__local_path__"} == {"__key__", "png", "cls"}
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["format"] == "webdataset" and manifest["rows"] == 17
    assert [s["rows"] for s in manifest["shards"]] == [5, 5, 5, 2]
    assert [s["sha256"] for s in manifest["shards"]] == [sha256(p) for p in paths]
    assert manifest["samples"]["images"] == ["image"]
    # naiad reads the shards back: the same samples, each once in a shuffled epoch.
    source = naiad.read_webdataset(paths, index_dir=False)
    assert source.column_names == ["__key__", "png", "cls"]
    assert sorted(naiad_keys(source)) == sorted(written)


def test_tar_shards_from_tar_shards_keep_every_member(tmp_path):
    (tmp_path / "in").mkdir()
    samples = []
    with wds.TarWriter(str(tmp_path / "in" / "a.tar")) as sink:
        for k in range(12):
            sample = {"__key__": f"dir/s{k:03d}", "jpg": encode(pixels(k, 12, 16, 3), "JPEG"), "cls": k % 4,
                      "json": {"k": k, "tags": ["x"] * (k % 3)}, "txt": f"caption {k}"}
            sink.write(sample)
            samples.append(sample)
    out = str(tmp_path / "out" / "b.tar")
    assert run(str(tmp_path / "in" / "a.tar"), out) == 0
    got = wds_samples([out])
    assert [s["__key__"] for s in got] == [s["__key__"] for s in samples]
    for g, s in zip(got, samples, strict=True):
        assert g["jpg"] == s["jpg"] and int(g["cls"]) == s["cls"] and g["txt"] == s["txt"].encode()
        assert json.loads(g["json"]) == s["json"]


def test_parquet_written_by_datasets_becomes_tar_shards_with_the_embedded_images(tmp_path):
    images = [encode(pixels(k, 10, 8, 3), "PNG") for k in range(10)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images],
                                     "label": [k % 3 for k in range(10)]}, features=features)
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    out = str(tmp_path / "hf.tar")
    assert run(str(tmp_path / "hf.parquet"), out) == 0
    got = wds_samples([out])
    # No key in the table: the row's number is the key.
    assert [s["__key__"] for s in got] == [f"{k:08d}" for k in range(10)]
    assert [s["png"] for s in got] == images
    assert [int(s["cls"]) for s in got] == [k % 3 for k in range(10)]


# -- Parquet that datasets reads -------------------------------------------------------------------


def test_a_folder_becomes_parquet_that_datasets_reads_as_images_and_class_labels(tmp_path):
    written = write_folder(tmp_path / "images", {"cat": 6, "dog": 5}, size=(12, 20), channels=3)
    out = str(tmp_path / "train.parquet")
    assert run(str(tmp_path / "images"), out) == 0
    meta = json.loads(pq.read_schema(out).metadata[b"huggingface"])
    assert meta["info"]["features"]["image"] == {"_type": "Image"}
    ds = datasets.Dataset.from_parquet(out)
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds.features["label"] == datasets.ClassLabel(names=["cat", "dog"])
    assert ds["__key__"] == sorted(written)
    for row in ds:
        image = row["image"]
        assert isinstance(image, Image.Image) and image.size == (20, 12)
        np.testing.assert_array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(written[row["__key__"]]))))
        assert row["label"] == (0 if row["__key__"].startswith("cat/") else 1)
    loaded = datasets.load_dataset("parquet", data_files=out, split="train")
    assert isinstance(loaded.features["image"], datasets.Image)
    # naiad reads the struct back as the bytes, every sample once.
    source = naiad.read_parquet(out)
    cols = source.read_block(source.blocks()[0]).columns
    assert [bytes(b) for b in cols["image"]] == [written[k] for k in cols["__key__"]]
    assert sorted(naiad_keys(source)) == sorted(written)


def test_tar_shards_become_parquet_with_the_extensions_as_columns(tmp_path):
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        for k in range(7):
            sink.write({"__key__": f"s{k}", "png": encode(pixels(k, 5, 5, 3), "PNG"), "cls": k, "json": {"k": k}})
    out = str(tmp_path / "a.parquet")
    assert run(str(tmp_path / "a.tar"), out) == 0
    ds = datasets.Dataset.from_parquet(out)
    assert isinstance(ds.features["png"], datasets.Image)
    assert ds["__key__"] == [f"s{k}" for k in range(7)] and ds["cls"] == list(range(7))
    assert [json.loads(v) for v in ds["json"]] == [{"k": k} for k in range(7)]
    assert [np.asarray(im).tolist() for im in ds["png"]] == [pixels(k, 5, 5, 3).tolist() for k in range(7)]


def test_parquet_of_datasets_made_smaller_keeps_its_class_names(tmp_path):
    images = [encode(pixels(k, 40, 60, 3), "JPEG") for k in range(5)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["x", "y"])})
    datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": [0, 1, 0, 1, 1]},
                               features=features).to_parquet(str(tmp_path / "hf.parquet"))
    out = str(tmp_path / "small.parquet")
    assert run(str(tmp_path / "hf.parquet"), out, "--max-size", "30") == 0
    ds = datasets.Dataset.from_parquet(out)
    assert ds.features["label"] == datasets.ClassLabel(names=["x", "y"]) and ds["label"] == [0, 1, 0, 1, 1]
    assert [im.size for im in ds["image"]] == [(30, 20)] * 5 and {im.format for im in ds["image"]} == {"JPEG"}


# -- --max-size ----------------------------------------------------------------------------------


def test_max_size_shrinks_large_images_and_keeps_small_ones_as_stored(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    big = (np.linspace(0, 255, 600)[None, :, None] * np.ones((400, 1, 3))).astype(np.uint8)
    (root / "big.jpg").write_bytes(encode(big, "JPEG", quality=95))
    small = encode(pixels(1, 30, 40, 3), "PNG")
    (root / "small.png").write_bytes(small)
    wide_png = encode(pixels(2, 100, 300, 3), "PNG")
    (root / "wide.png").write_bytes(wide_png)
    out = str(tmp_path / "out.tar")
    assert run(str(root), out, "--max-size", "120", "--quality", "80") == 0
    got = {s["__key__"]: s for s in wds_samples([out])}
    assert sorted(got) == ["big", "small", "wide"]
    resized = Image.open(io.BytesIO(got["big"]["jpg"]))
    assert resized.format == "JPEG" and resized.size == (120, 80)  # longer side 120, aspect kept
    # The gradient survives: the shrink is a resize, not a crop.
    row = np.asarray(resized.convert("RGB"))[40, :, 0].astype(int)
    assert row[0] < 20 and row[-1] > 235 and np.all(np.diff(row) > -12)
    assert got["small"]["png"] == small  # no larger than 120: the bytes as stored
    wide = Image.open(io.BytesIO(got["wide"]["png"]))
    assert wide.format == "PNG" and wide.size == (120, 40)  # PNG stays PNG, lossless


# -- --decode ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("channels", "fmt"), [(1, "PNG"), (3, "PNG"), (3, "JPEG")])
def test_decode_stores_pixels_that_naiad_reads_back_as_uint8_b_c_h_w(tmp_path, channels, fmt):
    written = write_folder(tmp_path / "images", {"a": 7, "b": 6}, channels=channels, fmt=fmt)
    out = str(tmp_path / "px.parquet")
    assert run(str(tmp_path / "images"), out, "--decode") == 0
    manifest = json.loads((tmp_path / "px.manifest.json").read_text())
    assert manifest["samples"]["decoded"]["shape"] == [channels, 28, 28]
    assert manifest["samples"]["decoded"]["layout"] == "CHW"
    # One fixed-size binary value per image (Parquet decodes a fixed-size list value by value).
    schema = pq.read_schema(out)
    field = schema.field("image")
    assert field.type == pa.binary(channels * 28 * 28)
    assert json.loads(field.metadata[b"naiad.shape"]) == [channels, 28, 28] and field.metadata[b"naiad.layout"] == b"CHW"
    features = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
    assert features["image"] == {"_type": "Value", "dtype": f"fixed_size_binary[{channels * 28 * 28}]"}
    # Pixels never repeat: no dictionary pages for them; the label keeps its dictionary.
    group = pq.ParquetFile(out).metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    assert not chunks["image"].has_dictionary_page and chunks["label"].has_dictionary_page
    source = naiad.read_parquet(out)
    cols = source.read_block(source.blocks()[0]).columns
    assert cols["image"].dtype == np.uint8 and cols["image"].shape == (13, channels, 28, 28)
    for key, image in zip(cols["__key__"], cols["image"], strict=True):
        decoded = np.asarray(Image.open(io.BytesIO(written[key])))
        expected = decoded[None] if channels == 1 else decoded.transpose(2, 0, 1)
        np.testing.assert_array_equal(image, expected)  # equal to a Pillow decode
    batches = list(naiad.DataLoader(source, batch_size=5, shuffle=True, seed=0))
    assert batches[0]["image"].dtype == torch.uint8 and batches[0]["image"].shape == (5, channels, 28, 28)
    assert sorted(k for b in batches for k in b["__key__"]) == sorted(written)
    # datasets reads the column as each image's bytes: the same pixels, in C, H, W order.
    ds = datasets.Dataset.from_parquet(out)
    assert ds.features["image"] == datasets.Value(f"fixed_size_binary[{channels * 28 * 28}]")
    assert ds["__key__"] == list(cols["__key__"])
    assert ds["image"] == [image.tobytes() for image in cols["image"]]


@pytest.mark.timeout(120)
def test_decoded_pixels_stream_through_process_workers_and_a_shuffle_each_image_once(tmp_path):
    written = write_folder(tmp_path / "images", {"a": 40, "b": 37, "c": 30}, size=(9, 7), channels=3)
    out = str(tmp_path / "px.parquet")
    # Small row groups: several blocks, so the two workers read different ones.
    assert run(str(tmp_path / "images"), out, "--decode", "--row-group-rows", "16") == 0
    expected = {k: np.asarray(Image.open(io.BytesIO(v))).transpose(2, 0, 1) for k, v in written.items()}
    loader = naiad.DataLoader(naiad.read_parquet(out), batch_size=10, shuffle=True, seed=4, num_workers=2,
                              worker_mode="process", persistent_workers=True)
    try:
        orders = []
        for _ in range(2):
            keys = []
            for batch in loader:
                assert batch["image"].dtype == torch.uint8 and batch["image"].shape[1:] == (3, 9, 7)
                for key, image in zip(batch["__key__"], batch["image"].numpy(), strict=True):
                    np.testing.assert_array_equal(image, expected[key])
                keys += batch["__key__"]
            assert sorted(keys) == sorted(written)  # every image exactly once
            orders.append(keys)
        assert orders[0] != sorted(written) and orders[0] != orders[1]  # shuffled, per epoch
    finally:
        loader.close()


def test_a_decoded_file_converted_again_keeps_its_pixels(tmp_path):
    write_folder(tmp_path / "images", {"a": 6, "b": 5}, size=(5, 4))
    first = str(tmp_path / "px.parquet")
    assert run(str(tmp_path / "images"), first, "--decode") == 0
    again = str(tmp_path / "again.arrow")
    assert run(first, again, "--shuffle", "--seed", "1") == 0
    field = naiad.read_arrow(again).schema().field("image")
    assert field.type == pa.binary(20) and json.loads(field.metadata[b"naiad.shape"]) == [1, 5, 4]
    before = naiad.read_parquet(first).read_block(naiad.read_parquet(first).blocks()[0]).columns
    after = naiad.read_arrow(again).read_block(naiad.read_arrow(again).blocks()[0]).columns
    assert sorted(after["__key__"]) == sorted(before["__key__"]) and after["image"].shape == (11, 1, 5, 4)
    by_key = dict(zip(before["__key__"], before["image"], strict=True))
    for key, image in zip(after["__key__"], after["image"], strict=True):
        np.testing.assert_array_equal(image, by_key[key])


def test_decode_of_an_image_of_another_size_names_it_or_skips_it(tmp_path):
    write_folder(tmp_path / "images", {"a": 4})
    odd = tmp_path / "images" / "a" / "009.png"
    odd.write_bytes(encode(pixels(9, 30, 28, 1), "PNG"))
    out = str(tmp_path / "px.parquet")
    with pytest.raises(SourceError) as info:
        convert(str(tmp_path / "images"), out, ConvertOptions(decode=True))
    text = str(info.value)
    assert str(odd) in text and "'a/009'" in text and "28x30" in text and "first was 28x28" in text
    assert not os.path.exists(out)  # nothing half written
    result = convert(str(tmp_path / "images"), out, ConvertOptions(decode=True, on_bad_rows="skip"))
    assert result.rows == 4 and result.bad_rows == 1
    assert result.manifest["bad_row_examples"][0]["key"] == "a/009"


def test_decode_needs_a_table_output_and_images(tmp_path):
    write_folder(tmp_path / "images", {"a": 2})
    with pytest.raises(ConfigError, match="needs Parquet or Arrow"):
        convert(str(tmp_path / "images"), str(tmp_path / "x.tar"), ConvertOptions(decode=True))
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="apply to images"):
        convert(str(tmp_path / "t.csv"), str(tmp_path / "t.parquet"), ConvertOptions(max_size=64))


# -- --shuffle -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["tar", "parquet"])
def test_shuffle_writes_every_sample_once_in_a_seeded_order(tmp_path, suffix):
    written = write_folder(tmp_path / "images", {"a": 20, "b": 20, "c": 20}, size=(6, 6))
    outs = []
    for run_id, seed in enumerate(["3", "3", "4"]):
        out = str(tmp_path / f"s{run_id}" / f"train.{suffix}")
        assert run(str(tmp_path / "images"), out, "--shuffle", "--seed", seed, "--memory", "1MiB") == 0
        source = naiad.read(out, **({"index_dir": False} if suffix == "tar" else {}))
        keys = [k for b in source.blocks() for k in source.read_block(b).columns["__key__"]]
        outs.append((keys, sha256(out)))
    assert sorted(outs[0][0]) == sorted(written)  # a permutation
    assert outs[0][0] != sorted(written)  # not the input's order
    assert outs[0] == outs[1]  # same seed: the same order and the same bytes
    assert outs[2][0] != outs[0][0]
    if suffix == "tar":
        assert [s["__key__"] for s in wds_samples([str(tmp_path / "s0" / "train.tar")])] == outs[0][0]


# -- bad input -----------------------------------------------------------------------------------


def test_a_file_that_is_not_an_image_is_named_by_file_and_key_or_skipped(tmp_path, capsys):
    write_folder(tmp_path / "images", {"a": 3})
    bad = tmp_path / "images" / "a" / "007.png"
    bad.write_bytes(b"this is not a png")
    out = str(tmp_path / "o.tar")
    assert main(["convert", str(tmp_path / "images"), out, "--max-size", "8"]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "'a/007'" in err and "not an image" in err and "--on-bad-rows skip" in err
    assert not os.path.exists(out)
    assert run(str(tmp_path / "images"), out, "--max-size", "8", "--on-bad-rows", "skip") == 0
    assert [s["__key__"] for s in wds_samples([out])] == ["a/000", "a/001", "a/002"]
    manifest = json.loads((tmp_path / "o.manifest.json").read_text())
    assert manifest["bad_rows"] == 1 and manifest["bad_row_examples"][0]["file"] == str(bad)


def test_a_truncated_tar_shard_is_named(tmp_path, capsys):
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        for k in range(5):
            sink.write({"__key__": f"s{k}", "png": encode(pixels(k, 20, 20, 3), "PNG"), "cls": k})
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar").write_bytes(data[: len(data) // 2])
    assert main(["convert", str(tmp_path / "a.tar"), str(tmp_path / "o.parquet")]) == 1
    assert str(tmp_path / "a.tar") in capsys.readouterr().err


def test_a_dot_in_a_file_name_does_not_cut_the_key(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    (root / "img.v2.png").write_bytes(encode(pixels(0, 4, 4, 3), "PNG"))
    (root / "img.png").write_bytes(encode(pixels(1, 4, 4, 3), "PNG"))
    out = str(tmp_path / "o.tar")
    assert run(str(root), out) == 0
    got = wds_samples([out])
    assert sorted(s["__key__"] for s in got) == ["img", "img_v2"]
    assert all(set(s) >= {"png"} for s in got)


def test_a_table_of_images_without_keys_stays_without_them_and_decodes_with_a_shuffle(tmp_path):
    images = [encode(pixels(k, 6, 7, 3), "PNG") for k in range(30)]
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": list(range(30))},
                                    features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}))
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    out = str(tmp_path / "px.arrow")
    assert run(str(tmp_path / "hf.parquet"), out, "--decode", "--shuffle", "--seed", "2") == 0
    source = naiad.read_arrow(out)
    assert source.column_names == ["image", "label"]
    field = source.schema().field("image")
    assert field.type == pa.binary(3 * 6 * 7) and json.loads(field.metadata[b"naiad.shape"]) == [3, 6, 7]
    cols = source.read_block(source.blocks()[0]).columns
    assert sorted(cols["label"].tolist()) == list(range(30)) and cols["label"].tolist() != list(range(30))
    for label, image in zip(cols["label"].tolist(), cols["image"], strict=True):
        np.testing.assert_array_equal(image, pixels(label, 6, 7, 3).transpose(2, 0, 1))
