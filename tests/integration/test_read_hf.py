"""naiad.read_hf over datasets written by Hugging Face ``datasets`` itself (NOTE [ Hugging Face
datasets ] in sources/hf.py): ``save_to_disk`` folders and ``Dataset`` objects after ``map``,
``filter``, ``select``, ``shuffle`` and ``train_test_split``, pixel- and label-exact against
iterating the ``datasets`` object; every row once across ranks and workers; exact and elastic
resumes; the kinds it refuses, each with its fix."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import naiad
from naiad.errors import ConfigError, SourceError
from naiad.sources.hf import HFSource
from naiad.testing import check_resume
from tests.conftest_stream import two_ranks_then_three

datasets = pytest.importorskip("datasets", reason="the Hugging Face tests write datasets with datasets")
Image = pytest.importorskip("PIL.Image", reason="the Hugging Face tests write images with Pillow")

ROWS = 96
CLASSES = ["cat", "dog", "fox", "owl"]


def encoded(k: int) -> bytes:
    """Row ``k``'s image: PNG for even rows, JPEG (quality 90) for odd ones, of its own size."""
    rng = np.random.default_rng(k)
    pixels = rng.integers(0, 256, (8 + k % 5, 10 + k % 3, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG" if k % 2 == 0 else "JPEG", **({} if k % 2 == 0 else {"quality": 90}))
    return out.getvalue()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``save_to_disk`` folder of two shards: an Image, a ClassLabel and the row's number."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "k": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": encoded(k), "path": None} for k in range(ROWS)],
                                     "label": [k * 7 % 4 for k in range(ROWS)], "k": list(range(ROWS))}, features=features)
    folder = str(tmp_path_factory.mktemp("hf") / "saved")
    ds.save_to_disk(folder, num_shards=2)
    return folder


@pytest.fixture(scope="module")
def loaded(saved: str) -> Any:
    return datasets.load_from_disk(saved)


def reference(view: Any) -> list[tuple[np.ndarray, int, int]]:
    """The rows as the ``datasets`` object itself gives them: pixels decoded by its Image feature."""
    return [(np.asarray(ex["image"].convert("RGB")), ex["label"], ex["k"]) for ex in view]


def delivered(src: naiad.Source, **loader: Any) -> list[tuple[np.ndarray, int, int]]:
    """The rows naiad delivers, decoded by naiad.decode_images (its defaults), in order."""
    out = []
    for batch in naiad.DataLoader(src, batch_size=16, transform=naiad.decode_images("image"), **loader):
        assert batch["label"].dtype == torch.int64  # a ClassLabel, as int64
        out += [(img.permute(1, 2, 0).numpy(), int(lbl), int(k))
                for img, lbl, k in zip(batch["image"], batch["label"], batch["k"], strict=True)]
    return out


def assert_same_rows(got: list[tuple[np.ndarray, int, int]], want: list[tuple[np.ndarray, int, int]]) -> None:
    assert [(k, lbl) for _, lbl, k in got] == [(k, lbl) for _, lbl, k in want]
    for (a, _, k), (b, _, _) in zip(got, want, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b), f"row k={k}: pixels differ"


def test_a_save_to_disk_folder_reads_pixel_and_label_exact_as_the_dataset_iterates(saved, loaded):
    src = naiad.read_hf(saved)
    assert isinstance(src, naiad.sources.ArrowSource) and len(src.paths) == 2  # its stream shards, as they are
    assert src.column_names == ["image", "label", "k"] and src.schema().field("image").type.equals(pa.binary())
    assert_same_rows(delivered(src), reference(loaded))
    batch = next(iter(naiad.DataLoader(src, batch_size=4)))
    assert batch["image"] == [encoded(k) for k in range(4)]  # the bytes as written: ready for any decoder


VIEWS: dict[str, Callable[[Any], Any]] = {
    "map": lambda d: d.map(lambda b: {"k2": [k * 2 for k in b["k"]]}, batched=True),
    "filter": lambda d: d.filter(lambda b: [k % 3 != 0 for k in b["k"]], batched=True),
    "select": lambda d: d.select([5, 3, 90, 41, 41, 0]),
    "select_contiguous": lambda d: d.select(range(10, 70)),
    "shuffle": lambda d: d.shuffle(seed=0),
    "train_test_split": lambda d: d.train_test_split(test_size=0.25, seed=1)["test"],
    "filter_shuffle_select": lambda d: d.filter(lambda b: [k % 2 == 0 for k in b["k"]], batched=True)
                                        .shuffle(seed=2).select(range(3, 40)),
    "concatenate": lambda d: datasets.concatenate_datasets([d.select(range(80, 96)), d.select(range(0, 8))]),
    "remove_columns": lambda d: d.remove_columns("k").add_column("k", list(range(ROWS))).flatten_indices(),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_dataset_after_map_filter_select_shuffle_reads_as_it_iterates(loaded, name):
    view = VIEWS[name](loaded)
    src = naiad.read_hf(view)
    assert isinstance(src, HFSource) == (view._indices is not None or name in ("select_contiguous", "concatenate"))
    assert len(src) == len(view)
    assert_same_rows(delivered(src, num_workers=2, worker_mode="thread"), reference(view))


@pytest.mark.timeout(240)
def test_every_row_once_across_two_ranks_of_two_process_workers_with_equal_steps(loaded):
    view = loaded.filter(lambda b: [k % 5 != 1 for k in b["k"]], batched=True).shuffle(seed=4)
    per_rank, steps = [], []
    for rank in range(2):
        # Process workers: the source (its mapping, its walked streams) pickled into each.
        loader = naiad.DataLoader(naiad.read_hf(view, block_rows=8), batch_size=6, shuffle=True, seed=3,
                                  shuffle_buffer=20, num_workers=2, worker_mode="process", rank=rank, world_size=2)
        try:
            batches = list(loader)
        finally:
            loader.close()
        steps.append(len(batches))
        per_rank.append([int(k) for b in batches for k in b["k"]])
    assert steps[0] == steps[1]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(view["k"])
    mine = set(per_rank[0])
    assert per_rank[0] != [k for k in view["k"] if k in mine]  # block shuffle and buffer: not the view's order
    report = naiad.testing.check_coverage(naiad.read_hf(view, block_rows=8), world_size=2, num_workers=2, batch_size=6,
                                          epochs=2, shuffle_buffer=20, resume_at=0.5, new_world_size=3)
    assert report.ok, report


def test_a_source_with_a_mapping_pickles_and_its_copy_reads_without_walking_again(loaded, monkeypatch):
    import pickle

    from naiad.sources import ipc_stream

    src = naiad.read_hf(loaded.shuffle(seed=6).select(range(50)), block_rows=7)
    want = [src.read_block(b).columns["k"].tolist() for b in src.blocks()]
    monkeypatch.setattr(ipc_stream, "walk_stream", lambda *a: pytest.fail("a copy walked the files again"))
    copy = pickle.loads(pickle.dumps(src))  # what a spawned worker gets
    assert copy._blocks is None and [copy.read_block(b).columns["k"].tolist() for b in copy.blocks()] == want


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_with_an_indices_mapping_resumes_exactly_mid_epoch(loaded, workers):
    view = loaded.shuffle(seed=5).select(range(70))

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_hf(view, block_rows=6), batch_size=7, shuffle=True, seed=5, shuffle_buffer=15,
                                num_workers=workers, worker_mode="thread")

    check_resume(make, epochs=2, positions=[0.0, 0.5, 1.0])


@pytest.mark.timeout(300)
def test_a_dataset_resumes_elastically_from_two_ranks_to_three(loaded):
    view = loaded.train_test_split(test_size=0.2, seed=7)["train"]

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_hf(view, block_rows=5), batch_size=4, shuffle=True, seed=9, shuffle_buffer=12,
                                rank=rank, world_size=world_size, num_workers=1, worker_mode="thread")

    batches, counts = two_ranks_then_three(make, 3)
    seen = [int(k) for b in batches for k in b["k"]]
    assert len(set(counts)) == 1
    assert sorted(seen) == sorted(view["k"])


def test_an_imagefolder_dataset_reads_its_files_where_the_reader_may(tmp_path):
    folder = tmp_path / "pets"
    for c, name in enumerate(CLASSES[:2]):
        (folder / name).mkdir(parents=True)
        for k in range(3):
            (folder / name / f"{k}.png").write_bytes(encoded(2 * (c * 3 + k)))
    ds = datasets.load_dataset("imagefolder", data_dir=str(folder), cache_dir=str(tmp_path / "hf-cache"), split="train")
    # Its cache file keeps the images' paths, not their bytes: a table may name files only where
    # the reader lets it (NOTE [ Paths inside tables ]).
    with pytest.raises(SourceError, match=r"outside the table's folder.*MediaAccess\(roots="):
        list(naiad.DataLoader(naiad.read_hf(ds), batch_size=6))
    src = naiad.read_hf(ds, media=naiad.MediaAccess(roots=[str(folder)]))
    batch = next(iter(naiad.DataLoader(src, batch_size=6, transform=naiad.decode_images("image"))))
    want = [(np.asarray(ex["image"].convert("RGB")), ex["label"]) for ex in ds]
    assert batch["label"].tolist() == [lbl for _, lbl in want] == [0, 0, 0, 1, 1, 1]
    assert all(np.array_equal(img.permute(1, 2, 0).numpy(), w) for img, (w, _) in zip(batch["image"], want, strict=True))


def test_an_audio_column_arrives_as_bytes_for_decode_audio(tmp_path):
    sf = pytest.importorskip("soundfile", reason="writes WAV clips")
    clips = []
    for k in range(5):
        out = io.BytesIO()
        sf.write(out, np.linspace(-0.5, 0.5, 800 + 100 * k, dtype=np.float32), 16000, format="WAV", subtype="FLOAT")
        clips.append(out.getvalue())
    # The Audio feature's own storage, {bytes, path}, made directly: datasets' encoder needs torchcodec.
    media = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"audio": pa.array([{"bytes": c, "path": None} for c in clips], media), "k": list(range(5))})
    features = datasets.Features({"audio": datasets.Audio(decode=False), "k": datasets.Value("int64")})
    ds = datasets.Dataset(datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features))
    ds.save_to_disk(str(tmp_path / "audio"))
    view = datasets.load_from_disk(str(tmp_path / "audio")).select([4, 1, 2])
    batch = next(iter(naiad.DataLoader(naiad.read_hf(view), batch_size=3)))
    assert batch["audio"] == [ex["audio"]["bytes"] for ex in view] == [clips[4], clips[1], clips[2]]
    decoded = naiad.decode_audio("audio")(batch)["audio"]
    assert [len(c) for c in decoded] == [1200, 900, 1000]


def test_a_folder_behind_a_url_reads_its_shards_with_range_reads(saved, loaded):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"memory://naiad-hf-{os.getpid()}-{threading.get_ident()}/saved"
    for name in os.listdir(saved):
        if name.endswith(".json") or name.startswith("data-"):
            with open(os.path.join(saved, name), "rb") as f, fs.open(f"{root}/{name}", "wb") as out:
                out.write(f.read())
    try:
        assert_same_rows(delivered(naiad.read_hf(root)), reference(loaded))
    finally:
        fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_a_dataset_in_a_folder_named_like_a_glob_reads_its_own_files(saved, tmp_path):
    import shutil

    folder = tmp_path / "run[1]" / "saved"
    shutil.copytree(saved, folder, ignore=shutil.ignore_patterns("cache-*"))
    view = datasets.load_from_disk(str(folder)).select([7, 2, 50])
    assert [int(k) for b in naiad.DataLoader(naiad.read_hf(view), batch_size=3) for k in b["k"]] == [7, 2, 50]
    assert len(naiad.read_hf(folder)) == ROWS


# -- what read_hf refuses, each with its fix -----------------------------------------------------


def test_a_dataset_dict_is_refused_naming_its_splits(loaded, tmp_path):
    splits = loaded.train_test_split(test_size=0.5, seed=0)
    with pytest.raises(ConfigError, match=r"DatasetDict of the splits \['train', 'test'\].*dataset\['train'\]"):
        naiad.read_hf(splits)
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ConfigError, match=r"DatasetDict saved with the splits \['train', 'test'\].*dict/train"):
        naiad.read_hf(tmp_path / "dict")
    assert len(naiad.read_hf(tmp_path / "dict" / "test")) == ROWS // 2


def test_what_cannot_be_read_from_its_files_is_refused_with_the_fix(loaded, tmp_path):
    in_memory = datasets.Dataset.from_dict({"k": [1, 2, 3]})
    with pytest.raises(ConfigError, match=r"held in memory.*save_to_disk it"):
        naiad.read_hf(in_memory)
    with pytest.raises(ConfigError, match=r"changed in memory \(rename_columns\).*flatten_indices\(\)"):
        naiad.read_hf(loaded.rename_column("k", "number"))
    with pytest.raises(ConfigError, match=r"columns are joined from several tables.*flatten_indices\(\)"):
        naiad.read_hf(datasets.concatenate_datasets([loaded.select_columns(["k"]), loaded.select_columns(["label"])], axis=1))
    with pytest.raises(ConfigError, match=r"streaming IterableDataset"):
        naiad.read_hf(loaded.to_iterable_dataset())
    with pytest.raises(ConfigError, match=r"not a folder Dataset\.save_to_disk wrote"):
        naiad.read_hf(tmp_path)
    with pytest.raises(ConfigError, match=r"`columns` \['nope'\] are not columns of the dataset"):
        naiad.read_hf(loaded.shuffle(seed=0), columns=["nope"])
    assert naiad.read_hf(loaded.rename_column("k", "number").flatten_indices()).column_names == ["image", "label", "number"]


def test_a_state_json_that_names_files_outside_its_folder_is_a_source_error(saved, tmp_path):
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../saved/data-00000-of-00002.arrow"}]}))
    with pytest.raises(SourceError, match=r"state\.json.*not the name of a file in the folder"):
        naiad.read_hf(folder)
    (folder / "state.json").write_text("{not json")
    with pytest.raises(SourceError, match=r"state\.json.*not readable JSON"):
        naiad.read_hf(folder)


def test_tokenized_rows_arrive_as_the_dataset_gives_them(tmp_path):
    """A tokenizer's output (``datasets.Sequence`` columns of any length per row, after ``map``
    and ``shuffle``): each row a 1-D tensor of its own values and dtype (NOTE [ Ragged columns ])."""
    text = datasets.Dataset.from_dict({"text": [" ".join(["w"] * (k % 11)) for k in range(ROWS)], "k": list(range(ROWS))})
    features = datasets.Features({"text": datasets.Value("string"), "k": datasets.Value("int64"),
                                  "input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "attention_mask": datasets.Sequence(datasets.Value("int8"))})
    tokenized = text.map(lambda b: {"input_ids": [[101, *range(k, k + len(t.split())), 102] for t, k in zip(b["text"], b["k"], strict=True)],
                                    "attention_mask": [[1] * (len(t.split()) + 2) for t in b["text"]]},
                         batched=True, features=features)
    tokenized.save_to_disk(str(tmp_path / "tok"), num_shards=2)
    view = datasets.load_from_disk(str(tmp_path / "tok")).shuffle(seed=3).select(range(70))
    got = {}
    for batch in naiad.DataLoader(naiad.read_hf(view, columns=["k", "input_ids", "attention_mask"]), batch_size=16,
                                  shuffle=True, seed=0, num_workers=2, worker_mode="process"):
        for k, ids, mask in zip(batch["k"].tolist(), batch["input_ids"], batch["attention_mask"], strict=True):
            assert ids.dtype == torch.int32 and mask.dtype == torch.int8
            got[k] = (ids.tolist(), mask.tolist())
    assert got == {ex["k"]: (ex["input_ids"], ex["attention_mask"]) for ex in view}
