"""Readers for samples outside shards, on real files: an image folder written with Pillow
(labelled as torchvision's ImageFolder labels it, every file once across ranks and workers, exact
resume, the listing kept, a removed image named or skipped) and Parquet and Arrow written by
Hugging Face ``datasets`` with image columns (embedded bytes, paths relative to the table, an
image with neither named or skipped).
WebDataset shards: tests/integration/test_samples_readers.py."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.errors import SourceError
from naiad.testing import check_resume

Image = pytest.importorskip("PIL.Image", reason="the sample tests write images with Pillow (pip install 'naiad[test]')")
from tests.image_data import png  # noqa: E402

# -- an image folder ----------------------------------------------------------------------------


def write_folder(root: Path, classes: dict[str, int]) -> dict[str, int]:
    """Class folders of PNG and JPEG files (and a non-image); returns path -> label as torchvision's
    ImageFolder gives them (classes sorted, files walked in sorted order)."""
    expected = {}
    for label, name in enumerate(sorted(classes)):
        for k in range(classes[name]):
            sub = root / name / ("nested" if k % 4 == 3 else "")
            sub.mkdir(parents=True, exist_ok=True)
            suffix = ".JPEG" if k % 2 else ".png"
            path = sub / f"{k:03d}{suffix}"
            Image.fromarray(np.full((5, 5, 3), k, np.uint8)).save(path, format="JPEG" if k % 2 else "PNG")
            expected[str(path)] = label
        (root / name / "README.txt").write_text("not an image")
    return expected


def test_an_image_folder_is_labelled_as_imagefolder_labels_it(tmp_path):
    expected = write_folder(tmp_path / "train", {"dog": 5, "cat": 7, "ant": 3})
    src = naiad.read_images(tmp_path / "train", index_dir=str(tmp_path / "index"))
    assert src.class_to_idx == {"ant": 0, "cat": 1, "dog": 2} and src.classes == ["ant", "cat", "dog"]
    assert src.column_names == ["image", "label", "path"] and len(src) == 15
    batches = list(naiad.DataLoader(src, batch_size=4))
    paths = [p for b in batches for p in b["path"]]
    order = []
    for name in src.classes:  # torchvision's make_dataset: per class, os.walk sorted, names sorted
        for folder, _, files in sorted(os.walk(tmp_path / "train" / name)):
            order += [os.path.join(folder, f) for f in sorted(files) if not f.endswith(".txt")]
    assert paths == order
    labels = [int(v) for b in batches for v in b["label"]]
    assert labels == [expected[p] for p in paths]
    images = [v for b in batches for v in b["image"]]
    assert images == [Path(p).read_bytes() for p in paths]


def test_a_flat_folder_has_no_label_column(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    for k in range(6):
        (root / f"{k}.png").write_bytes(png(k))
    (root / "notes.md").write_text("x")
    src = naiad.read_images(root, index_dir=False)
    assert src.class_to_idx == {} and src.column_names == ["image", "path"]
    batch = next(iter(naiad.DataLoader(src, batch_size=10)))
    assert batch["image"] == [png(k) for k in range(6)] and "label" not in batch


@pytest.mark.timeout(240)
def test_an_image_folder_streams_every_file_once_across_ranks_and_workers(tmp_path):
    write_folder(tmp_path / "train", {"a": 20, "b": 17, "c": 9})
    per_rank, steps = [], []
    for rank in range(2):
        src = naiad.read_images(tmp_path / "train", block_bytes=2048, index_dir=str(tmp_path / "index"))
        loader = naiad.DataLoader(src, batch_size=4, shuffle=True, seed=1, shuffle_buffer=10, num_workers=2,
                                  rank=rank, world_size=2)
        try:
            batches = list(loader)
        finally:
            loader.close()
        steps.append(len(batches))
        per_rank += [p for b in batches for p in b["path"]]
    assert steps[0] == steps[1] and len(per_rank) == len(set(per_rank)) == 46


@pytest.mark.timeout(300)
def test_an_image_folder_resumes_exactly(tmp_path):
    write_folder(tmp_path / "train", {"a": 11, "b": 13})

    def make() -> naiad.DataLoader:
        src = naiad.read_images(tmp_path / "train", block_bytes=1024, index_dir=str(tmp_path / "index"))
        return naiad.DataLoader(src, batch_size=5, shuffle=True, seed=2, shuffle_buffer=8)

    check_resume(make, epochs=2, positions=[0.5])


def test_the_folder_listing_is_kept_and_redone_only_when_the_folder_changes(tmp_path, monkeypatch):
    write_folder(tmp_path / "train", {"a": 3, "b": 4})
    index = str(tmp_path / "index")
    first = naiad.read_images(tmp_path / "train", index_dir=index)
    from naiad.sources import images
    real = images._list_folder
    calls: list[str] = []

    def counted(root: str) -> Any:
        calls.append(root)
        return real(root)

    monkeypatch.setattr(images, "_list_folder", counted)
    again = naiad.read_images(tmp_path / "train", index_dir=index)
    assert calls == [] and len(again) == len(first) == 7
    Image.fromarray(np.zeros((3, 3, 3), np.uint8)).save(tmp_path / "train" / "b" / "new.png")
    changed = naiad.read_images(tmp_path / "train", index_dir=index)
    assert len(calls) == 1 and len(changed) == 8


def test_a_removed_image_is_named_or_skipped(tmp_path):
    write_folder(tmp_path / "train", {"a": 4, "b": 4})
    raising = naiad.read_images(tmp_path / "train", index_dir=False)
    skipping = naiad.read_images(tmp_path / "train", index_dir=False, on_bad_rows="skip")
    gone = tmp_path / "train" / "a" / "001.JPEG"
    gone.unlink()  # after the listing
    with pytest.raises(SourceError, match="001.JPEG"):
        list(naiad.DataLoader(raising, batch_size=3))
    loader = naiad.DataLoader(skipping, batch_size=3)
    paths = [p for b in loader for p in b["path"]]
    assert len(paths) == 7 and str(gone) not in paths
    assert [e["file"] for e in loader.stats().bad_row_ledger] == [str(gone)]


# -- Parquet and Arrow with media columns -------------------------------------------------------


datasets = pytest.importorskip("datasets", reason="the media column tests write tables with datasets")


def test_parquet_written_by_datasets_with_embedded_images_reads_as_bytes(tmp_path):
    images = [Image.fromarray(np.full((4 + k, 4, 3), k, np.uint8)) for k in range(9)]
    ds = datasets.Dataset.from_dict({"image": images, "label": list(range(9))}, features=datasets.Features(
        {"image": datasets.Image(), "label": datasets.Value("int64")}))
    ds.to_parquet(str(tmp_path / "embedded.parquet"))
    src = naiad.read_parquet(tmp_path / "embedded.parquet")
    assert src.schema().field("image").type == pa.binary()
    batches = list(naiad.DataLoader(src, batch_size=4, shuffle=True, seed=0))
    got = {int(lbl): img for b in batches for lbl, img in zip(b["label"], b["image"], strict=True)}
    assert sorted(got) == list(range(9))
    for k, data in got.items():
        assert isinstance(data, bytes) and np.asarray(Image.open(io.BytesIO(data))).shape == (4 + k, 4, 3)
    stored = pq.read_table(tmp_path / "embedded.parquet").column("image").to_pylist()
    assert [d["bytes"] for d in stored] == [got[k] for k in range(9)]


def test_parquet_with_only_paths_reads_the_files_relative_to_the_table(tmp_path):
    folder = tmp_path / "data"
    (folder / "img").mkdir(parents=True)
    files = []
    for k in range(6):
        path = folder / "img" / f"{k}.png"
        path.write_bytes(png(k))
        files.append(str(path))
    ds = datasets.Dataset.from_dict({"image": files, "label": list(range(6))}).cast_column("image", datasets.Image())
    ds.to_parquet(str(folder / "absolute.parquet"))  # datasets keeps the (absolute) paths, no bytes
    assert pq.read_table(folder / "absolute.parquet").column("image")[0]["bytes"].as_py() is None
    table = pq.read_table(folder / "absolute.parquet")
    relative = pa.array([{"bytes": None, "path": f"img/{k}.png"} for k in range(6)], table.schema.field("image").type)
    pq.write_table(table.set_column(0, "image", relative), folder / "relative.parquet", row_group_size=4)
    for name in ("absolute.parquet", "relative.parquet"):
        batch = next(iter(naiad.DataLoader(naiad.read_parquet(folder / name), batch_size=6)))
        assert batch["image"] == [png(k) for k in range(6)] and batch["label"].tolist() == list(range(6))


def test_an_image_with_neither_bytes_nor_a_file_is_named_or_skipped(tmp_path):
    t = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    (tmp_path / "ok.png").write_bytes(png(1))
    column = pa.array([{"bytes": png(0), "path": None}, {"bytes": None, "path": "ok.png"},
                       {"bytes": None, "path": "missing.png"}, {"bytes": None, "path": None}], t)
    pq.write_table(pa.table({"image": column, "y": [0, 1, 2, 3]}), tmp_path / "t.parquet")
    with pytest.raises(SourceError, match=r"t\.parquet.*'image'.*row 2.*missing\.png"):
        list(naiad.DataLoader(naiad.read_parquet(tmp_path / "t.parquet"), batch_size=4))
    loader = naiad.DataLoader(naiad.read_parquet(tmp_path / "t.parquet", on_bad_rows="skip"), batch_size=4)
    batch = next(iter(loader))
    assert batch["image"] == [png(0), png(1)] and batch["y"].tolist() == [0, 1]
    assert [(e["row"], e["column"]) for e in loader.stats().bad_row_ledger] == [(2, "image"), (3, "image")]


def test_arrow_files_with_media_structs_and_binary_columns_read_as_bytes(tmp_path):
    images = [Image.fromarray(np.full((3, 3, 3), k, np.uint8)) for k in range(10)]
    ds = datasets.Dataset.from_dict({"image": images, "raw": [bytes([k]) * k for k in range(10)], "k": list(range(10))},
                                    features=datasets.Features({"image": datasets.Image(), "raw": datasets.Value("binary"),
                                                                "k": datasets.Value("int64")}))
    table = ds.data.table
    with pa.ipc.new_file(str(tmp_path / "t.arrow"), table.schema) as sink:
        for batch in table.to_batches(max_chunksize=3):
            sink.write_batch(batch)
    src = naiad.read_arrow(tmp_path / "t.arrow")
    assert src.sample_bytes() is not None
    batches = list(naiad.DataLoader(src, batch_size=4, shuffle=True, seed=1, shuffle_buffer=5))
    got = {int(k): (img, raw) for b in batches for k, img, raw in zip(b["k"], b["image"], b["raw"], strict=True)}
    assert sorted(got) == list(range(10))
    for k, (img, raw) in got.items():
        assert raw == bytes([k]) * k and np.asarray(Image.open(io.BytesIO(img)))[0, 0, 0] == k
