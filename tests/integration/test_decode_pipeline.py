"""decode_images given as the loader's ``transform=``: run by the pipeline, not the training loop
(NOTE [ Decode in the workers ] in pipeline.py). Real shards written by webdataset's TarWriter, an
image folder written by Pillow, Parquet written by PyArrow: every sample once, random crops keyed
by (seed, epoch, sample) so a resumed epoch (also on another world size) and any worker count give
the same pixels, bad images ledgered or named by shard and key."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import naiad
from naiad.errors import DecodeError, SourceError
from naiad.media.images import DecodeImages
from naiad.sources import SkipBadRows
from tests.conftest_stream import two_ranks_then_three

wds = pytest.importorskip("webdataset", reason="the shard tests write shards with webdataset (pip install 'naiad[test]')")
Image = pytest.importorskip("PIL.Image", reason="the decode tests write images with Pillow (pip install 'naiad[test]')")

N = 60


def jpeg(k: int) -> bytes:
    rng = np.random.default_rng(k)
    pixels = rng.integers(0, 256, (20 + k % 7, 24 + k % 5, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_shards(folder: Path, bad: tuple[int, ...] = (), shards: int = 3) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-N // shards)
    with wds.ShardWriter(str(folder / "part-%04d.tar"), maxcount=per, verbose=0) as sink:
        for k in range(N):
            sink.write({"__key__": f"s{k:04d}", "jpg": b"not a jpeg at all" if k in bad else jpeg(k), "cls": k})
    return str(folder / f"part-{{0000..{shards - 1:04d}}}.tar")


def open_shards(pattern: str, tmp_path: Path, **kw: Any) -> Any:
    return naiad.read_webdataset(pattern, block_bytes=4096, index_dir=str(tmp_path / "index"), **kw)


class ThreadRecordingDecode(DecodeImages):
    """decode_images that notes, per sample, the process and thread it was decoded in."""

    def __call__(self, batch: Any) -> dict[str, Any]:
        out = super().__call__(batch)
        out["decoded_in"] = [(os.getpid(), threading.current_thread().name)] * len(batch[self.column])
        return out


# Where a stream decodes (NOTE [ Small samples decode in the reads ] in stream/decode.py): 12x12
# RGB in its reads, 80x80 RGB (19,200 bytes) on the stage after the shuffle buffer.
SIZES = {"reads": 12, "stage": 80}


def random_crops(where: str = "reads", **kw: Any) -> DecodeImages:
    made = naiad.decode_images("jpg", crop="random", size=SIZES[where], flip=True, **kw)
    return ThreadRecordingDecode(made.column, made.options, seed=made.seed, key=made.key)


def by_key(batches: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for b in batches:
        for key, image in zip(b["__key__"], b["jpg"], strict=True):
            assert key not in out, f"{key} delivered twice"
            out[key] = image
    return out


def same_pixels(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"pixels differ for {differ[:5]}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["stage", "reads"])
def test_shards_decode_once_each_keyed_by_shard_and_sample_for_any_worker_count(tmp_path, where):
    pattern = write_shards(tmp_path / "shards")
    runs = {}
    for workers in (0, 2):
        # The stage's threads whatever the workers; small images in the reads, in the worker
        # processes that the loader gives them by default.
        mode = {"stage": "thread", "reads": None}[where]
        loader = naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=8, shuffle=True, seed=3, shuffle_buffer=20,
                                  num_workers=workers, worker_mode=mode, transform=random_crops(where))
        try:
            loader.set_epoch(1)
            batches = list(loader)
            stages = loader.stats().stages
        finally:
            loader.close()
        size = SIZES[where]
        assert all(b["jpg"].dtype == torch.uint8 and b["jpg"].shape[1:] == (3, size, size) for b in batches)
        # The shard's number times 2**32 plus the sample's in the shard (20 a shard, s0000.. in
        # order): known from its shard alone, so the reads need not wait for the others' indexes.
        per = N // 3
        assert all(b["__index__"].tolist() == [(int(k[1:]) // per << 32) + int(k[1:]) % per for k in b["__key__"]]
                   for b in batches)
        assert {b["__epoch__"] for b in batches} == {1}
        assert all([(c // per << 32) + c % per for c in b["cls"].tolist()] == b["__index__"].tolist() for b in batches)
        decoded_in = {d for b in batches for d in b["decoded_in"]}
        if where == "stage":
            assert {pid for pid, _ in decoded_in} == {os.getpid()}
            assert all(name.startswith("naiad-decode-stage") for _, name in decoded_in), decoded_in  # never the loop's thread
            assert "decode" in stages and stages["decode"].count == len(batches)
        else:
            assert loader.worker_mode == "process"
            assert (os.getpid() not in {pid for pid, _ in decoded_in}) == (workers > 0)
            assert "decode" in stages
        runs[workers] = by_key(batches)
    assert len(runs[0]) == N
    same_pixels(runs[0], runs[2])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["stage", "reads"])
def test_a_random_crop_stream_resumed_mid_epoch_delivers_the_same_pixels(tmp_path, where):
    pattern = write_shards(tmp_path / "shards")

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=7, shuffle=True, seed=11, shuffle_buffer=16,
                                num_workers=1, worker_mode="thread", transform=random_crops(where))

    reference = make()
    reference.set_epoch(2)
    whole = by_key(list(reference))
    reference.close()
    first = make()
    first.set_epoch(2)
    it = iter(first)
    before = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    after = list(resumed)
    resumed.close()
    same_pixels(by_key(before + after), whole)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["stage", "reads"])
def test_a_random_crop_stream_resumed_from_two_ranks_on_three_delivers_the_same_pixels(tmp_path, where):
    pattern = write_shards(tmp_path / "shards")

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=4, shuffle=True, seed=9, shuffle_buffer=12,
                                rank=rank, world_size=world_size, num_workers=1, worker_mode="thread",
                                transform=random_crops(where))

    reference = make(0, 1)
    whole = by_key(list(reference))
    reference.close()
    seen, counts = two_ranks_then_three(make, before=3)
    assert len(set(counts)) == 1  # equal steps on the new ranks
    same_pixels(by_key(seen), whole)


class EncodedDataset:
    """A map-style dataset of encoded JPEGs whose batches are dicts of bytes (no decode of its own)."""

    def __init__(self) -> None:
        self.data = [jpeg(k) for k in range(N)]

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"jpg": self.data[index], "cls": index}

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        return {"jpg": [self.data[i] for i in indices], "cls": torch.tensor(indices)}


def keep_batch(batch: Any) -> Any:
    return batch


@pytest.mark.timeout(180)
def test_a_map_style_batch_decodes_in_the_worker_processes_keyed_by_its_indices():
    runs = {}
    for workers in (0, 2):
        loader = naiad.DataLoader(EncodedDataset(), batch_size=8, shuffle=True, seed=4, num_workers=workers,
                                  collate_fn=keep_batch, transform=random_crops())
        try:
            batches = list(loader)
            stages = loader.stats().stages
        finally:
            loader.close()
        assert all(b["__index__"].tolist() == b["cls"].tolist() for b in batches)
        pids = {pid for b in batches for pid, _ in b["decoded_in"]}
        if workers:
            assert os.getpid() not in pids and len(pids) >= 1  # in the workers, not the loop's process
        assert "decode" in stages
        runs[workers] = {int(i): img for b in batches for i, img in zip(b["__index__"], b["jpg"], strict=True)}
    assert sorted(runs[0]) == list(range(N))
    assert all(torch.equal(runs[0][k], runs[2][k]) for k in range(N))


@pytest.mark.timeout(180)
def test_without_batching_each_sample_decodes_as_it_does_in_a_batch():
    batched = naiad.DataLoader(EncodedDataset(), batch_size=8, shuffle=True, seed=4, collate_fn=keep_batch,
                               transform=random_crops())
    reference = {int(i): img for b in batched for i, img in zip(b["__index__"], b["jpg"], strict=True)}
    for workers in (0, 2):
        loader = naiad.DataLoader(EncodedDataset(), batch_size=None, shuffle=True, seed=4, num_workers=workers,
                                  transform=random_crops())
        try:
            samples = list(loader)
        finally:
            loader.close()
        assert all(s["jpg"].shape == (3, 12, 12) and isinstance(s["cls"], int) for s in samples)
        got = {int(s["__index__"]): s["jpg"] for s in samples}
        assert sorted(got) == list(range(N))  # each sample once, keyed by its index
        assert all(torch.equal(got[k], reference[k]) for k in range(N))


def write_folder(root: Path) -> None:
    for k in range(N):
        folder = root / f"class{k % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{k:03d}.jpg").write_bytes(jpeg(k))


@pytest.mark.timeout(180)
def test_a_folder_and_a_parquet_table_decode_every_image_once(tmp_path):
    write_folder(tmp_path / "folder")
    table = pa.table({"image": pa.array([jpeg(k) for k in range(N)], pa.binary()), "label": np.arange(N) % 3})
    pq.write_table(table, tmp_path / "images.parquet", row_group_size=16)
    center = naiad.decode_images("image", resize=16, crop="center", size=12)
    for source in (naiad.read_images(str(tmp_path / "folder")), naiad.read_parquet(str(tmp_path / "images.parquet"))):
        loader = naiad.DataLoader(source, batch_size=8, shuffle=True, seed=0, num_workers=2, transform=center)
        try:
            batches = list(loader)
        finally:
            loader.close()
        rows = np.concatenate([b["__index__"].numpy() for b in batches])
        assert sorted(rows.tolist()) == list(range(N))
        assert all(b["image"].shape[1:] == (3, 12, 12) and b["image"].dtype == torch.uint8 for b in batches)
        assert sum(len(b["label"]) for b in batches) == N


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["stage", "reads"])
def test_images_that_do_not_decode_are_ledgered_with_shard_and_key_and_the_batch_keeps_the_rest(tmp_path, where):
    pattern = write_shards(tmp_path / "shards", bad=(5, 41))
    decode = naiad.decode_images("jpg", size=SIZES[where], crop="center")
    source = open_shards(pattern, tmp_path, on_bad_rows="skip")
    loader = naiad.DataLoader(source, batch_size=8, rank=0, world_size=2, transform=decode)
    try:
        batches = list(loader)
        ledger = loader.stats().bad_row_ledger
        state = loader.state_dict()
    finally:
        loader.close()
    other = naiad.DataLoader(open_shards(pattern, tmp_path, on_bad_rows="skip"), batch_size=8, rank=1, world_size=2,
                             transform=decode, num_workers=2)
    try:
        other_batches = list(other)
        ledger += other.stats().bad_row_ledger
    finally:
        other.close()
    # Counted as a read's skipped rows are: in the state (the next epoch's starts from none).
    assert state["pipeline"]["bad_rows"]["ledger"]["total"] == 1
    assert len(batches) == len(other_batches)  # equal steps, a batch one short where a sample failed
    keys = [k for b in batches + other_batches for k in b["__key__"]]
    assert sorted(keys) == [f"s{k:04d}" for k in range(N) if k not in (5, 41)]
    assert sorted(e["key"] for e in ledger) == ["s0005", "s0041"]
    shard_of = {e["key"]: Path(e["file"]).name for e in ledger}
    assert shard_of == {"s0005": "part-0000.tar", "s0041": "part-0002.tar"}
    assert all(e["column"] == "jpg" and "not an image" in e["reason"] for e in ledger)
    # Each rank's 30 rows as 8, 8, 8, 6; the batch with a bad image one short.
    assert sorted(len(b["__key__"]) for b in batches + other_batches) == [6, 6, 7, 7, 8, 8, 8, 8]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["stage", "reads"])
def test_images_that_do_not_decode_count_toward_max_bad_rows_and_the_states_bad_rows(tmp_path, where):
    pattern = write_shards(tmp_path / "shards", bad=(3, 4, 50))
    decode = naiad.decode_images("jpg", size=SIZES[where], crop="center")
    loader = naiad.DataLoader(open_shards(pattern, tmp_path, on_bad_rows="skip"), batch_size=8, transform=decode)
    try:
        it = iter(loader)
        next(it)  # batch 0: s0000..s0007, two of them bad
        assert loader.state_dict()["pipeline"]["bad_rows"]["skipped"] == 2
        rest = list(it)
        assert loader.state_dict()["pipeline"]["bad_rows"]["skipped"] == 0  # the next epoch's start
        assert sum(loader.stats().bad_rows.values()) == 3 and len(rest) == 7
    finally:
        loader.close()
    strict = naiad.DataLoader(open_shards(pattern, tmp_path, on_bad_rows=SkipBadRows(max_rows=2)), batch_size=8,
                              transform=decode)
    try:
        with pytest.raises(SourceError, match="past max_bad_rows=2") as info:
            list(strict)
        assert "part-0002.tar" in str(info.value)
    finally:
        strict.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("where", "workers"), [("stage", 1), ("reads", 1), ("reads", 2)])
def test_an_image_that_does_not_decode_ends_the_pass_naming_its_shard_and_key(tmp_path, where, workers):
    pattern = write_shards(tmp_path / "shards", bad=(30,))
    loader = naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=8, num_workers=workers,
                              transform=naiad.decode_images("jpg", size=SIZES[where], crop="center"))
    try:
        it = iter(loader)
        delivered = []
        with pytest.raises(SourceError) as info:
            for batch in it:
                delivered.append(batch)
        assert isinstance(info.value, DecodeError)
        assert "part-0001.tar" in str(info.value) and "s0030" in str(info.value)
        assert "not an image" in str(info.value) and 'on_bad_rows="skip"' in str(info.value)
        # The batches before it; in the reads, those its read group held too fail with it.
        assert len(delivered) == 3 if where == "stage" else len(delivered) <= 3
        with pytest.raises(StopIteration):
            next(it)  # the pass ended, as a read error ends it
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_the_batch_that_crosses_the_device_stage_is_uint8(tmp_path):
    pattern = write_shards(tmp_path / "shards")
    loader = naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=8, device="cpu",
                              transform=naiad.decode_images("jpg", size=12, crop="center"))
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert batches and all(b["jpg"].dtype == torch.uint8 for b in batches)
    x = naiad.images.normalize(batches[0]["jpg"], (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert x.dtype == torch.float32 and x.shape == batches[0]["jpg"].shape


def test_a_plain_callable_still_runs_in_the_loop_process_on_its_thread(tmp_path):
    pattern = write_shards(tmp_path / "shards")
    threads = []

    def plain(batch: Any) -> Any:
        threads.append(threading.current_thread())
        return batch

    loader = naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=8, transform=plain)
    batches = list(loader)
    assert threads and set(threads) == {threading.main_thread()}
    assert "__index__" not in batches[0]  # only a worker-side transform gets the row numbers
