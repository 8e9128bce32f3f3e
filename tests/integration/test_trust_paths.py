"""The samples' trust boundary, for paths (docs/SECURITY.md; NOTE [ Paths inside tables ], NOTE
[ Kept files ], NOTE [ Names as bytes ] in naiad/trust): a table's paths reach only its own
folder or bucket or the roots the user names, and only files of a bounded size; a kept listing
says which of the folder's files are samples only when it is plausible and the user's own;
names that are not UTF-8 read as ``os.walk``, ``tarfile`` and ``webdataset`` give them; a folder
that links back into itself is listed once."""

from __future__ import annotations

import io
import logging
import os
import tarfile
import threading
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.errors import SourceError
from naiad.sources.images import LISTING_PARAMS
from naiad.sources.index import load_arrays, save_arrays
from naiad.trust.paths import MediaAccess

pytestmark = pytest.mark.timeout(120)

Image = pytest.importorskip("PIL.Image", reason="the sample tests write images with Pillow (pip install 'naiad[test]')")
MEDIA = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def table_of(paths: list[str | None]) -> bytes:
    column = pa.array([{"bytes": None, "path": p} for p in paths], MEDIA)
    out = io.BytesIO()
    pq.write_table(pa.table({"image": column, "y": list(range(len(paths)))}), out)
    return out.getvalue()


@pytest.fixture
def memory_bucket():
    fs = fsspec.filesystem("memory")
    root = f"memory://trust-{os.getpid()}-{threading.get_ident()}"
    yield fs, root
    fs.rm(root, recursive=True)


def put(fs, url: str, data: bytes) -> str:
    with fs.open(url, "wb") as f:
        f.write(data)
    return url


def read_all(source) -> list[dict]:
    return list(naiad.DataLoader(source, batch_size=8))


# -- paths inside tables ------------------------------------------------------------------------


def test_a_remote_table_never_reads_a_local_file_whatever_its_spelling(memory_bucket, tmp_path):
    fs, root = memory_bucket
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    spellings = [f"file://{secret}", f"local://{secret}", str(secret), f"FILE://{secret}"]
    url = put(fs, f"{root}/data/t.parquet", table_of(spellings))
    with pytest.raises(SourceError, match=r"t\.parquet.*'image'.*row 0.*local file named by a remote table"):
        read_all(naiad.read_parquet(url))
    loader = naiad.DataLoader(naiad.read_parquet(url, on_bad_rows="skip"), batch_size=8)
    assert [b["image"] for b in loader] == [[]]
    assert [e["row"] for e in loader.stats().bad_row_ledger] == [0, 1, 2, 3]


def test_a_remote_table_reads_only_its_own_folder_unless_roots_are_named(memory_bucket):
    fs, root = memory_bucket
    put(fs, f"{root}/data/img/0.png", png(0))
    put(fs, f"{root}/elsewhere/1.png", png(1))
    put(fs, f"{root}-other/2.png", png(2))
    paths = ["img/0.png", "../elsewhere/1.png", f"{root}/elsewhere/1.png", f"{root}-other/2.png", f"{root}/data/img/0.png",
             "img/../../elsewhere/1.png"]
    url = put(fs, f"{root}/data/t.parquet", table_of(paths))
    loader = naiad.DataLoader(naiad.read_parquet(url, on_bad_rows="skip"), batch_size=8)
    batch = next(iter(loader))
    assert batch["image"] == [png(0), png(0)] and batch["y"].tolist() == [0, 4]
    reasons = {e["row"]: e["reason"] for e in loader.stats().bad_row_ledger}
    assert sorted(reasons) == [1, 2, 3, 5]
    assert "leaves the table's folder" in reasons[1] and "MediaAccess(roots=" in reasons[2]
    named = naiad.read_parquet(url, media=MediaAccess(roots=(f"{root}/elsewhere", f"{root}-other")), on_bad_rows="skip")
    batch = next(iter(naiad.DataLoader(named, batch_size=8)))
    assert batch["y"].tolist() == [0, 2, 3, 4] and batch["image"] == [png(0), png(1), png(2), png(0)]


def test_a_local_table_reads_under_its_folder_or_named_roots(tmp_path):
    data, outside = tmp_path / "data", tmp_path / "outside"
    (data / "img").mkdir(parents=True)
    outside.mkdir()
    (data / "img" / "0.png").write_bytes(png(0))
    (outside / "1.png").write_bytes(png(1))
    paths = ["img/0.png", str(data / "img" / "0.png"), "../outside/1.png", str(outside / "1.png"), f"file://{outside}/1.png"]
    (data / "t.parquet").write_bytes(table_of(paths))
    with pytest.raises(SourceError, match=r"row 2.*'\.\./outside/1\.png' leaves the table's folder"):
        read_all(naiad.read_parquet(data / "t.parquet"))
    loader = naiad.DataLoader(naiad.read_parquet(data / "t.parquet", on_bad_rows="skip"), batch_size=8)
    assert next(iter(loader))["y"].tolist() == [0, 1]
    assert [e["row"] for e in loader.stats().bad_row_ledger] == [2, 3, 4]
    named = naiad.read_parquet(data / "t.parquet", media=MediaAccess(roots=(str(outside),)), on_bad_rows="skip")
    batch = next(iter(naiad.DataLoader(named, batch_size=8)))
    assert batch["y"].tolist() == [0, 1, 3, 4] and batch["image"][2:] == [png(1), png(1)]


def test_a_named_file_is_read_only_if_regular_and_within_the_size_bound(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * 5000)
    (tmp_path / "small.bin").write_bytes(b"y" * 10)
    os.mkfifo(tmp_path / "pipe.png")  # opening it for reading would block forever
    (tmp_path / "t.parquet").write_bytes(table_of(["pipe.png", "big.bin", "small.bin"]))
    loader = naiad.DataLoader(naiad.read_parquet(tmp_path / "t.parquet", on_bad_rows="skip", media=MediaAccess(max_bytes=4096)),
                              batch_size=8)
    batch = next(iter(loader))
    assert batch["image"] == [b"y" * 10]
    reasons = [e["reason"] for e in loader.stats().bad_row_ledger]
    assert "not a regular file" in reasons[0] and "5,000 bytes" in reasons[1]
    with pytest.raises(naiad.ConfigError, match="must be an int >= 1"):
        naiad.read_parquet(tmp_path / "t.parquet", media=MediaAccess(max_bytes=0))
    with pytest.raises(naiad.ConfigError, match="`media` must be a naiad.MediaAccess"):
        naiad.read_parquet(tmp_path / "t.parquet", media=4096)  # type: ignore[arg-type]


def test_a_remote_file_over_the_size_bound_is_not_fetched(memory_bucket):
    fs, root = memory_bucket
    put(fs, f"{root}/d/big.bin", b"z" * 3000)
    url = put(fs, f"{root}/d/t.parquet", table_of(["big.bin"]))
    with pytest.raises(SourceError, match=r"3,000 bytes, more than the reader's MediaAccess\(max_bytes=1,000\)"):
        read_all(naiad.read_parquet(url, media=MediaAccess(max_bytes=1000)))


# -- kept listings ------------------------------------------------------------------------------


def folder_with_listing(tmp_path: Path) -> tuple[Path, Path, str]:
    root, index = tmp_path / "data", tmp_path / "index"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "a.png").write_bytes(png(5))
    (tmp_path / "outside.txt").write_text("not yours to read")
    naiad.read_images(root, index_dir=index)  # keeps the listing
    return root, index, str(root.resolve())


def rewrite_listing(index: Path, real: str, **arrays: np.ndarray) -> None:
    kept = load_arrays(str(index), real, LISTING_PARAMS)
    assert kept is not None
    kept.pop("__size__")
    save_arrays(str(index), real, LISTING_PARAMS, {**{k: np.array(v) for k, v in kept.items()}, **arrays})


@pytest.mark.parametrize("change", ["climbs", "absolute", "label", "class", "flat"])
def test_a_kept_listing_that_lies_is_refused_and_the_folder_listed_again(tmp_path, caplog, change: str):
    root, index, real = folder_with_listing(tmp_path)
    name = {"climbs": b"cls/../../outside.txt", "absolute": str(tmp_path / "outside.txt").encode()}.get(change, b"cls/a.png")
    arrays = {"path_bytes": np.frombuffer(name, np.uint8).copy(), "path_ends": np.array([len(name)], np.int64)}
    if change in ("climbs", "label"):
        arrays["labels"] = np.array([7], np.int64)  # one class exists
    if change == "class":
        arrays["classes"] = np.array(["../x"])
    if change == "flat":
        arrays["classes"] = np.zeros(0, "<U1")
        arrays["labels"] = np.array([-1], np.int64)
    rewrite_listing(index, real, **arrays)
    with caplog.at_level(logging.WARNING, logger="naiad"):
        src = naiad.read_images(root, index_dir=index)
    batch = next(iter(naiad.DataLoader(src, batch_size=4)))
    assert batch["path"] == [str(root.resolve() / "cls" / "a.png")] and batch["label"].tolist() == [0]
    assert batch["image"] == [png(5)]
    assert any("kept listing" in r.getMessage() and "implausible" in r.getMessage() for r in caplog.records)


def test_a_kept_file_of_another_user_is_not_read_unless_named(tmp_path, monkeypatch, caplog):
    root, index, real = folder_with_listing(tmp_path)
    name = b"cls/../../outside.txt"  # what another user's listing could say
    rewrite_listing(index, real, path_bytes=np.frombuffer(name, np.uint8).copy(), path_ends=np.array([len(name)], np.int64))
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # the kept files now belong to someone else
    with caplog.at_level(logging.WARNING, logger="naiad"):
        assert load_arrays(str(index), real, LISTING_PARAMS) is None
    assert any("belongs to another user" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("NAIAD_TRUST_INDEX_OWNERS", f"nobody-at-all,{me}")
    assert load_arrays(str(index), real, LISTING_PARAMS) is not None  # read, then checked (and refused)
    batch = next(iter(naiad.DataLoader(naiad.read_images(root, index_dir=index), batch_size=4)))
    assert batch["path"] == [str(root.resolve() / "cls" / "a.png")]


def test_a_kept_archive_whose_header_claims_more_than_it_holds_is_a_miss(tmp_path):
    root, index, real = folder_with_listing(tmp_path)
    kept = next(index.glob("*.npz"))
    data = bytearray(kept.read_bytes())
    at = data.find(b"'shape': (")
    assert at > 0
    data[at:at + 12] = b"'shape': (9,"  # a header of 9 items over fewer bytes: never allocated
    kept.write_bytes(bytes(data))
    assert load_arrays(str(index), real, LISTING_PARAMS) is None
    assert next(iter(naiad.DataLoader(naiad.read_images(root, index_dir=index), batch_size=4)))["image"] == [png(5)]


# -- names that are not UTF-8 -------------------------------------------------------------------


def latin1_shard(path: Path) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name, data in [("caf\xe9.png", png(1)), ("caf\xe9.cls", b"1"), ("b.png", png(2)), ("b.cls", b"2")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("workers", [0, 2])
def test_tar_members_named_in_latin1_read_with_the_keys_webdataset_gives(tmp_path, workers: int):
    wds = pytest.importorskip("webdataset")
    latin1_shard(tmp_path / "s.tar")
    theirs = sorted(s["__key__"] for s in wds.WebDataset(str(tmp_path / "s.tar"), shardshuffle=False))
    assert theirs == ["b", "caf\udce9"]
    for kept in (False, str(tmp_path / "index"), str(tmp_path / "index")):  # walked, kept, read back
        src = naiad.read_webdataset(str(tmp_path / "s.tar"), index_dir=kept)
        batches = list(naiad.DataLoader(src, batch_size=2, num_workers=workers, transform=naiad.decode_images("png")))
        assert sorted(k for b in batches for k in b["__key__"]) == theirs
        assert sorted(int(c) for b in batches for c in b["cls"]) == [1, 2]


def test_an_image_folder_with_names_that_are_not_utf8_reads_them_as_os_walk_does(tmp_path):
    root = tmp_path / "data"
    (root / "c").mkdir(parents=True)
    os.mkdir(os.fsencode(root) + b"/caf\xe9")
    (root / "c" / "good.png").write_bytes(png(1))
    Path(os.fsdecode(os.fsencode(root / "c") + b"/bad\xff.png")).write_bytes(png(2))
    Path(os.fsdecode(os.fsencode(root) + b"/caf\xe9/x.png")).write_bytes(png(3))
    walked = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    for kept in (False, str(tmp_path / "index"), str(tmp_path / "index")):
        src = naiad.read_images(root, index_dir=kept)
        assert src.classes == ["c", "caf\udce9"]
        batches = list(naiad.DataLoader(src, batch_size=2, num_workers=2, transform=naiad.decode_images("image")))
        assert sorted(p for b in batches for p in b["path"]) == walked
        got = {p: int(img[0, 0, 0]) for b in batches for p, img in zip(b["path"], b["image"], strict=True)}
        assert got[walked[0]] == 2 and os.fsencode(walked[0]).endswith(b"bad\xff.png")


# -- the folder walk ----------------------------------------------------------------------------


def test_a_folder_that_links_back_into_itself_is_listed_once(tmp_path):
    root = tmp_path / "data"
    (root / "cls" / "sub").mkdir(parents=True)
    for k in range(3):
        (root / "cls" / f"{k}.png").write_bytes(png(k))
        (root / "cls" / "sub" / f"s{k}.png").write_bytes(png(10 + k))
    os.symlink("..", root / "cls" / "sub" / "up")  # a loop
    os.symlink(".", root / "cls" / "self")  # another
    os.symlink(".", root / "cls" / "sub" / "here")
    src = naiad.read_images(root, index_dir=False)
    assert len(src) == 6
    values = sorted(int(img[0, 0, 0]) for b in naiad.DataLoader(src, batch_size=4, transform=naiad.decode_images("image"))
                    for img in b["image"])
    assert values == [0, 1, 2, 10, 11, 12]


def test_special_files_in_an_image_folder_are_not_listed(tmp_path):
    root = tmp_path / "data"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "a.png").write_bytes(png(1))
    os.mkfifo(root / "cls" / "b.png")  # a read would block forever
    src = naiad.read_images(root, index_dir=False)
    assert [os.path.basename(p) for b in naiad.DataLoader(src, batch_size=4) for p in b["path"]] == ["a.png"]


def test_an_empty_file_at_the_end_of_a_folder_is_still_a_sample(tmp_path):
    # It starts where the grid ends: it once fell in no block, counted by len() but never read.
    root = tmp_path / "data"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "a.png").write_bytes(png(1))
    (root / "cls" / "z.png").write_bytes(b"")
    src = naiad.read_images(root, index_dir=False)
    assert len(src) == sum(b.rows for b in src.blocks()) == 2
    assert [os.path.basename(p) for b in naiad.DataLoader(src, batch_size=4) for p in b["path"]] == ["a.png", "z.png"]


def test_naiad_convert_leaves_a_name_that_is_not_utf8_out_as_one_bad_row(tmp_path):
    from naiad.tools.convert import ConvertOptions, convert

    latin1_shard(tmp_path / "s.tar")
    with pytest.raises(SourceError, match=r"sample 'caf\\udce9'.*not UTF-8"):
        convert(str(tmp_path / "s.tar"), str(tmp_path / "out" / "t.parquet"), ConvertOptions())
    for out in ("parquet/t.parquet", "tar/"):
        result = convert(str(tmp_path / "s.tar"), str(tmp_path / "skip" / out), ConvertOptions(on_bad_rows="skip"))
        assert result.bad_rows == 1
    converted = naiad.read_parquet(tmp_path / "skip" / "parquet" / "t.parquet")
    assert [k for b in naiad.DataLoader(converted, batch_size=4) for k in b["__key__"]] == ["b"]


def test_a_link_inside_a_local_tables_folder_is_followed_only_inside_it(tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (data / "img").mkdir(parents=True)
    elsewhere.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"not yours")
    (elsewhere / "2.png").write_bytes(png(2))
    (data / "img" / "0.png").write_bytes(png(0))
    os.symlink(tmp_path / "secret.bin", data / "img" / "cat.png")  # planted in a shared folder
    os.symlink("..", data / "up")
    os.symlink("0.png", data / "img" / "alias.png")  # a link inside: read
    os.symlink(elsewhere / "2.png", data / "img" / "two.png")  # to a named root: read
    paths = ["img/cat.png", "up/secret.bin", "img/alias.png", "img/two.png"]
    (data / "t.parquet").write_bytes(table_of(paths))
    loader = naiad.DataLoader(naiad.read_parquet(data / "t.parquet", on_bad_rows="skip"), batch_size=8)
    assert next(iter(loader))["image"] == [png(0)]
    reasons = [e["reason"] for e in loader.stats().bad_row_ledger]
    assert len(reasons) == 3 and all("is a link to" in r for r in reasons)
    named = naiad.read_parquet(data / "t.parquet", on_bad_rows="skip", media=MediaAccess(roots=(str(elsewhere),)))
    assert next(iter(naiad.DataLoader(named, batch_size=8)))["image"] == [png(0), png(2)]


def test_a_table_linked_into_a_blob_cache_reads_its_linked_files(tmp_path):
    # The Hugging Face hub's cache: snapshots/<rev>/ holds links into blobs/, the table's too.
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    (snap / "img").mkdir(parents=True)
    blobs.mkdir()
    (blobs / "b1").write_bytes(png(7))
    (blobs / "b2").write_bytes(table_of(["img/x.png"]))
    os.symlink(blobs / "b1", snap / "img" / "x.png")
    os.symlink(blobs / "b2", snap / "t.parquet")
    assert next(iter(naiad.DataLoader(naiad.read_parquet(snap / "t.parquet"), batch_size=2)))["image"] == [png(7)]


def test_a_path_naming_a_folder_is_a_bad_row(memory_bucket, tmp_path):
    fs, root = memory_bucket
    put(fs, f"{root}/d/img/0.png", png(0))
    url = put(fs, f"{root}/d/t.parquet", table_of(["img", "img/", ".", "img/0.png"]))
    loader = naiad.DataLoader(naiad.read_parquet(url, on_bad_rows="skip"), batch_size=8)
    assert next(iter(loader))["image"] == [png(0)]
    assert [e["row"] for e in loader.stats().bad_row_ledger] == [0, 1, 2]
    (tmp_path / "img").mkdir()
    (tmp_path / "t.parquet").write_bytes(table_of(["img", "."]))
    loader = naiad.DataLoader(naiad.read_parquet(tmp_path / "t.parquet", on_bad_rows="skip"), batch_size=8)
    assert next(iter(loader))["image"] == [] and len(loader.stats().bad_row_ledger) == 2
