"""Readers for samples in WebDataset shards on real files: shards written by the ``webdataset``
library and by ``tar``, local and behind a loopback S3 server; every guarantee the table readers
give (exactly once across ranks and workers, exact and elastic resume, bad samples named or
skipped, member indexes kept, remote reads cached), training started before every shard is
indexed, no pandas import, the default shuffle buffer sized by a sample's bytes, and the coverage
dry run planning shards as the loader reads them.
Image folders and Parquet/Arrow media columns: tests/integration/test_samples_folders_tables.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import naiad
from naiad.errors import SourceError
from naiad.testing import check_resume
from tests.conftest_stream import two_ranks_then_three

wds = pytest.importorskip("webdataset", reason="the shard tests write shards with webdataset (pip install 'naiad[test]')")
pytest.importorskip("PIL.Image", reason="the sample tests write images with Pillow (pip install 'naiad[test]')")
from tests.image_data import png  # noqa: E402

SHARDS, PER_SHARD = 4, 23  # uneven against every batch size below


def write_shards(folder: Path, shards: int = SHARDS, per_shard: int = PER_SHARD) -> list[dict[str, Any]]:
    """Shards ``train-000i.tar`` written by webdataset's ShardWriter; returns the samples written."""
    samples = []
    with wds.ShardWriter(str(folder / "train-%04d.tar"), maxcount=per_shard, verbose=0) as sink:
        for k in range(shards * per_shard):
            sample = {"__key__": f"img/s{k:05d}", "png": png(k, 4 + k % 5), "cls": k, "json": {"k": k, "tags": [k % 3]},
                      "txt": f"sample number {k}"}
            sink.write(sample)
            samples.append(sample)
    return samples


def keys_of(loader: naiad.DataLoader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


def key_number(key: str) -> int:
    return int(key.rsplit("s", 1)[1])


@pytest.fixture()
def shards(tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    folder = tmp_path / "shards"
    folder.mkdir()
    samples = write_shards(folder)
    return str(folder / "train-{0000..0003}.tar"), samples


def open_shards(pattern: str, tmp_path: Path, **kw: Any) -> naiad.sources.WebDatasetSource:
    kw.setdefault("block_bytes", 4096)  # several blocks per shard
    kw.setdefault("index_dir", str(tmp_path / "index"))
    return naiad.read_webdataset(pattern, **kw)


# -- WebDataset shards --------------------------------------------------------------------------


def test_shards_read_as_the_webdataset_library_reads_them(shards, tmp_path):
    pattern, samples = shards
    src = open_shards(pattern, tmp_path)
    assert len(src.paths) == SHARDS and src.column_names == ["__key__", "cls", "json", "png", "txt"]
    assert len(src) == SHARDS * PER_SHARD
    batches = list(naiad.DataLoader(src, batch_size=10))
    ours = {k: i for i, k in enumerate(k for b in batches for k in b["__key__"])}
    theirs = list(wds.WebDataset(pattern, shardshuffle=False, empty_check=False))
    assert list(ours) == [s["__key__"] for s in theirs]
    flat = {name: [v for b in batches for v in (b[name].tolist() if name == "cls" else b[name])]
            for name in ("cls", "json", "png", "txt")}
    for i, s in enumerate(theirs):
        assert flat["png"][i] == s["png"] and isinstance(flat["png"][i], bytes)
        assert flat["cls"][i] == int(s["cls"]) and flat["txt"][i] == s["txt"].decode()
        assert flat["json"][i] == json.loads(s["json"])
    assert batches[0]["cls"].dtype == torch.int64 and isinstance(batches[0]["txt"], list)


def test_shards_written_by_tar_read_with_their_folders_in_the_key(tmp_path):
    files = tmp_path / "files"
    (files / "a").mkdir(parents=True)
    names = []
    for k in range(12):
        (files / "a" / f"x{k:02d}.jpg").write_bytes(png(k))
        (files / "a" / f"x{k:02d}.CLS").write_text(f"{k % 4}\n")
        (files / "a" / f"x{k:02d}.seg.png").write_bytes(png(k + 100))
        names += [f"a/x{k:02d}.jpg", f"a/x{k:02d}.CLS", f"a/x{k:02d}.seg.png"]
    (files / "__meta__").write_text("{}")
    shard = tmp_path / "by-tar.tar"
    subprocess.run(["tar", "-cf", str(shard), "-C", str(files), "__meta__", *names], check=True)
    src = naiad.read_webdataset(str(shard), index_dir=False)
    assert src.column_names == ["__key__", "jpg", "cls", "seg.png"]  # extensions lower-cased
    batch = next(iter(naiad.DataLoader(src, batch_size=12)))
    assert batch["__key__"] == [f"a/x{k:02d}" for k in range(12)]
    assert batch["cls"].tolist() == [k % 4 for k in range(12)]
    assert batch["seg.png"] == [png(k + 100) for k in range(12)]


@pytest.mark.timeout(240)
def test_every_sample_once_across_two_ranks_of_two_process_workers_with_equal_steps(shards, tmp_path):
    pattern, _ = shards
    per_rank, steps = [], []
    for rank in range(2):
        loader = naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=5, shuffle=True, seed=3, shuffle_buffer=16,
                                  num_workers=2, rank=rank, world_size=2)
        try:
            batches = list(loader)
        finally:
            loader.close()
        steps.append(len(batches))
        per_rank.append([k for b in batches for k in b["__key__"]])
    assert steps[0] == steps[1]
    everything = per_rank[0] + per_rank[1]
    assert sorted(map(key_number, everything)) == list(range(SHARDS * PER_SHARD))
    assert [key_number(k) for k in per_rank[0]] != sorted(key_number(k) for k in per_rank[0])  # shuffled
    report = naiad.testing.check_coverage(open_shards(pattern, tmp_path), world_size=2, num_workers=2, batch_size=5,
                                          epochs=2, shuffle_buffer=16, resume_at=0.5, new_world_size=3)
    assert report.ok, report


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_shards_resume_exactly_mid_epoch(shards, tmp_path, workers):
    pattern, _ = shards

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=7, shuffle=True, seed=5, shuffle_buffer=20,
                                num_workers=workers, worker_mode="thread")

    check_resume(make, epochs=2, positions=[0.0, 0.5, 1.0])


@pytest.mark.timeout(300)
def test_shards_resume_elastically_from_two_ranks_to_three(shards, tmp_path):
    pattern, _ = shards

    def make(rank: int, world_size: int) -> naiad.DataLoader:
        return naiad.DataLoader(open_shards(pattern, tmp_path), batch_size=4, shuffle=True, seed=9, shuffle_buffer=12,
                                rank=rank, world_size=world_size, num_workers=1, worker_mode="thread")

    batches, counts = two_ranks_then_three(make, 5)
    seen = [k for b in batches for k in b["__key__"]]
    assert len(set(counts)) == 1
    assert sorted(map(key_number, seen)) == list(range(SHARDS * PER_SHARD))


def test_a_truncated_shard_is_a_source_error_naming_it(shards, tmp_path):
    pattern, _ = shards
    folder = Path(pattern).parent
    victim = folder / "train-0002.tar"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # cut inside a member
    with pytest.raises(SourceError, match=r"train-0002\.tar.*(cut short|truncated)"):
        len(open_shards(pattern, tmp_path / "a"))
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        header = tar.getmembers()[9].offset
    victim.write_bytes(data[:header + 100])  # cut inside a header: tarfile alone would end quietly there
    with pytest.raises(SourceError, match=r"train-0002\.tar.*cut short at byte"):
        len(open_shards(pattern, tmp_path / "b"))
    damaged = bytearray(data)
    damaged[header:header + 512] = b"\x07" * 512  # a header that is not one
    victim.write_bytes(bytes(damaged))
    with pytest.raises(SourceError, match=r"train-0002\.tar.*damaged"):
        len(open_shards(pattern, tmp_path / "c"))


def _corrupt_shard(path: Path) -> None:
    with wds.TarWriter(str(path)) as sink:
        for k in range(8):
            sample: dict[str, Any] = {"__key__": f"bad{k}", "png": png(k), "cls": k}
            if k == 3:
                sample["cls"] = "three"  # not a number
            if k == 5:
                del sample["cls"]  # a missing member
            sink.write(sample)


def test_a_corrupt_member_is_named_by_shard_and_key(tmp_path):
    shard = tmp_path / "corrupt.tar"
    _corrupt_shard(shard)
    src = naiad.read_webdataset(str(shard), extensions=["png", "cls"], index_dir=False)
    with pytest.raises(SourceError) as info:
        list(naiad.DataLoader(src, batch_size=4))
    assert "corrupt.tar" in str(info.value) and "'bad3'" in str(info.value) and "cls" in str(info.value)


def test_skipped_samples_go_into_the_ledger_with_their_keys(tmp_path):
    shard = tmp_path / "corrupt.tar"
    _corrupt_shard(shard)
    src = naiad.read_webdataset(str(shard), extensions=["png", "cls"], index_dir=False, on_bad_rows="skip")
    loader = naiad.DataLoader(src, batch_size=4)
    batches = list(loader)
    assert len(batches) == 2 and [k for b in batches for k in b["__key__"]] == [f"bad{k}" for k in (0, 1, 2, 4, 6, 7)]
    assert [b["cls"].tolist() for b in batches] == [[0, 1, 2], [4, 6, 7]]
    ledger = loader.stats().bad_row_ledger
    assert [(e["key"], e["column"]) for e in ledger] == [("bad3", "cls"), ("bad5", "cls")]
    assert all(e["file"] == str(shard) for e in ledger) and "not an integer" in ledger[0]["reason"]
    assert "no .cls member" in ledger[1]["reason"]


def test_the_member_indexes_are_kept_in_one_file_and_a_changed_shard_alone_is_walked_again(shards, tmp_path, monkeypatch):
    pattern, _ = shards
    first = open_shards(pattern, tmp_path)
    blocks = first.blocks()
    assert len(list((tmp_path / "index").glob("*.npz"))) == 1  # one file for the four shards
    walked: list[str] = []
    real = naiad.sources.webdataset.scan_shard

    def counted(path: str, store: Any = None) -> Any:
        walked.append(path)
        return real(path, store)

    monkeypatch.setattr("naiad.sources.webdataset.scan_shard", counted)
    again = open_shards(pattern, tmp_path)
    assert again.blocks() == blocks and not walked
    assert keys_of(naiad.DataLoader(again, batch_size=9)) == keys_of(naiad.DataLoader(first, batch_size=9))
    changed = Path(pattern).parent / "train-0001.tar"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    third = open_shards(pattern, tmp_path)
    assert third.blocks() == blocks and walked == [str(changed)]
    fourth = open_shards(pattern, tmp_path)  # the file was written again with the new identity
    assert fourth.blocks() == blocks and walked == [str(changed)]


@pytest.mark.timeout(120)
def test_training_starts_before_every_shard_is_indexed(tmp_path, monkeypatch):
    # The first reads are planned from the byte grid (early reads, NOTE [ Sample blocks ]),
    # whatever the shards' size: the shards past the first two are held unindexed until the
    # first batch has arrived (in order, without a transform; tests/integration/test_early_shards.py
    # shuffles and decodes). Samples of 1 MiB, so that a read group (4 MiB) closes inside the
    # first shard.
    keys = []
    with wds.ShardWriter(str(tmp_path / "big-%04d.tar"), maxcount=6, verbose=0) as sink:
        for k in range(24):
            keys.append(f"s{k:05d}")
            sink.write({"__key__": keys[-1], "bin": np.random.default_rng(k).bytes(1 << 20), "cls": k})
    release = threading.Event()
    real = naiad.sources.webdataset.scan_shard

    def slow(path: str, store: Any = None) -> Any:
        if not path.endswith(("0000.tar", "0001.tar")):
            assert release.wait(60), "the first batch never came while shards were held"
        return real(path, store)

    monkeypatch.setattr("naiad.sources.webdataset.scan_shard", slow)
    src = naiad.read_webdataset(str(tmp_path / "big-{0000..0003}.tar"), block_bytes=1 << 20, index_dir=False)
    # One read-ahead thread, two tasks ahead: the pool asks for no more tasks than the first
    # half of the blocks (what early reads cover) holds before it delivers.
    loader = naiad.DataLoader(src, batch_size=3, shuffle=False, num_workers=1, worker_mode="thread", prefetch_factor=2)
    it = iter(loader)
    try:
        first = next(it)
        assert not src.counted() and set(src._indexes) <= {src.paths[0], src.paths[1]}  # the others are held
    finally:
        release.set()
    rest = [k for b in it for k in b["__key__"]]
    assert first["__key__"] + rest == keys


# -- the default shuffle buffer -----------------------------------------------------------------


def test_a_default_buffer_of_samples_holds_about_256_mib_not_131072_rows(shards, tmp_path):
    from naiad.stream.batches import default_buffer_rows
    pattern, _ = shards
    src = open_shards(pattern, tmp_path)
    per_sample = src.sample_bytes()
    assert per_sample == os.path.getsize(src.paths[0]) // PER_SHARD
    assert default_buffer_rows(src) == (256 << 20) // per_sample
    src.sample_bytes = lambda: 110_000  # type: ignore[method-assign]  # ImageNet-sized JPEGs
    assert default_buffer_rows(src) == (256 << 20) // 110_000
    src.sample_bytes = lambda: 20 << 20  # type: ignore[method-assign]  # short clips: the floor
    assert default_buffer_rows(src) == 64
    assert default_buffer_rows(naiad.read_parquet(write_table(tmp_path))) == 1 << 17  # numbers: as before
    images = tmp_path / "images.parquet"  # 100 KB a row, in row groups of 100 as datasets writes them
    pq.write_table(pa.table({"image": [bytes([k % 251]) * 100_000 for k in range(300)], "label": list(range(300))}),
                   images, row_group_size=100)
    table = naiad.read_parquet(images)
    assert 100_000 <= table.sample_bytes() < 101_000
    assert default_buffer_rows(table) == (256 << 20) // table.sample_bytes()  # not 131,072 rows of images


def write_table(folder: Path) -> Path:
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.float32)}), folder / "numbers.parquet")
    return folder / "numbers.parquet"


# -- shards behind a URL -----------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_shards_behind_s3_urls_read_by_brace_range_through_the_cache(tmp_path):
    pytest.importorskip("moto.server", reason="needs moto[server]")
    pytest.importorskip("s3fs", reason="needs s3fs")
    from naiad.sources.storage import Storage
    from tests.s3server import BUCKET, S3Server

    server = S3Server()
    try:
        folder = tmp_path / "shards"
        folder.mkdir()
        samples = write_shards(folder, shards=3, per_shard=11)
        for name in sorted(os.listdir(folder)):
            server.put(f"wds/{name}", (folder / name).read_bytes())
        url = f"s3://{BUCKET}/wds/train-{{0000..0002}}.tar"
        cache = tmp_path / "cache"

        src = naiad.read_webdataset(url, storage=Storage(server.options(), cache_dir=str(cache)), block_bytes=2048)
        loader = naiad.DataLoader(src, batch_size=4, shuffle=True, seed=4, shuffle_buffer=9, num_workers=2,
                                  worker_mode="thread")
        assert [p.rsplit("/", 1)[1] for p in src.paths] == ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
        first = list(loader)
        assert sorted(k for b in first for k in b["__key__"]) == sorted(s["__key__"] for s in samples)
        assert list((cache / "index").glob("*.npz"))  # the member indexes, kept beside the cache
        assert list((cache / "blocks").rglob("*"))
        server.stop()  # the next epoch reads from the cache alone
        again = [v for b in loader for v in b["png"]]
        assert sorted(again) == sorted(s["png"] for s in samples)
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_reading_and_decoding_shards_does_not_import_pandas(shards, tmp_path):
    # pyarrow's to_numpy and pyarrow.array import pandas the first time a process calls them
    # (0.2-0.4 s before its first batch, and in every worker process); samples are read without.
    pattern, _ = shards
    script = (
        "import sys, naiad\n"
        f"src = naiad.read_webdataset({pattern!r}, index_dir=False, block_bytes=4096)\n"
        "loader = naiad.DataLoader(src, batch_size=8, shuffle=True, seed=0, shuffle_buffer=16,\n"
        "                          transform=naiad.decode_images('png', size=(4, 4), crop='center'))\n"
        "batches = [b for b in loader]\n"
        "assert sum(len(b['__key__']) for b in batches) == 92, len(batches)\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_coverage_dry_run_plans_tar_shards_as_the_loader_does(shards, tmp_path):
    # A buffer that holds most samples: a source read before its count permutes single blocks,
    # and `naiad check` (planned_batches) must plan what the loader delivers, not block runs.
    from naiad.tools.coverage import Topology, planned_batches

    pattern, samples = shards
    source = open_shards(pattern, tmp_path, block_bytes=1024)
    assert len(source.blocks()) > 8
    planned = planned_batches(source, Topology(1, batch_size=8, shuffle_buffer=80), 0, seed=5)
    loader = naiad.DataLoader(source, batch_size=8, shuffle=True, seed=5, shuffle_buffer=80)
    got = [np.asarray(batch["cls"]) for batch in loader]
    assert [b.tolist() for b in got] == [b.tolist() for b in planned]
