"""The pieces the readers of samples are made of: brace ranges, a tar shard's member index (kept
for all of a source's shards in one file; a kept one that lies, or whose shard changed, is not
used), byte slices of a read, members decoded per extension."""

from __future__ import annotations

import dataclasses
import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import naiad
from naiad.errors import SourceError
from naiad.sources import paths
from naiad.sources.index import identity
from naiad.sources.samples import byte_slices, decode_members, extension_type, grid_blocks
from naiad.sources.tarindex import KeptIndexes, ShardIndex, keep_indexes, scan_shard, table_of


def test_brace_ranges_expand_as_a_shell_does(tmp_path: Path) -> None:
    assert paths.expand_braces("train-{0000..0002}.tar") == ["train-0000.tar", "train-0001.tar", "train-0002.tar"]
    assert paths.expand_braces("{9..11}") == ["9", "10", "11"]
    assert paths.expand_braces("{3..1}") == ["3", "2", "1"]
    assert paths.expand_braces("{a,b}/{x}-{1..2}") == ["a/{x}-1", "a/{x}-2", "b/{x}-1", "b/{x}-2"]
    for i in range(3):
        (tmp_path / f"s-{i:02d}.tar").write_bytes(b"")
    assert paths.expand_paths(str(tmp_path / "s-{00..02}.tar")) == [str(tmp_path / f"s-{i:02d}.tar") for i in range(3)]
    with pytest.raises(SourceError, match="s-03.tar"):
        paths.expand_paths(str(tmp_path / "s-{00..03}.tar"))  # each name must exist
    (tmp_path / "odd{1..2}.tar").write_bytes(b"")
    assert paths.expand_paths(str(tmp_path / "odd{1..2}.tar")) == [str(tmp_path / "odd{1..2}.tar")]  # a real name


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_members_group_into_samples_as_webdataset_groups_them(tmp_path: Path) -> None:
    long_dir = "d" * 120  # a name past 100 bytes: a pax or GNU long-name header before it
    write_tar(tmp_path / "s.tar", [
        ("__index__", b"meta"), (f"{long_dir}/a.jpg", b"A" * 700), (f"{long_dir}/a.CLS", b"1"),
        ("noext", b"skipped"), ("b.jpg", b"B"), ("b.seg.png", b"S"), ("b.jpg", b"dup"), ("a.jpg", b"again"),
    ])
    index = scan_shard(str(tmp_path / "s.tar"))
    assert index.keys().tolist() == [f"{long_dir}/a", "b", "a"]
    assert index.exts == ("jpg", "cls", "seg.png")
    assert index.flags.tolist() == [0, 1, 0]  # b has two .jpg members
    assert (index.offsets >= 0).astype(int).tolist() == [[1, 1, 1], [1, 0, 0], [0, 1, 0]]
    data = (tmp_path / "s.tar").read_bytes()
    j = index.ext_row("jpg")
    assert [data[o:o + n] for o, n in zip(index.offsets[j], index.sizes[j], strict=True)] == [b"A" * 700, b"B", b"again"]


def test_a_kept_index_that_lies_is_walked_again(tmp_path: Path) -> None:
    shards = [str(tmp_path / f"s{k}.tar") for k in range(2)]
    for shard in shards:
        write_tar(Path(shard), [(f"k{i}.bin", bytes([i]) * 600) for i in range(5)])
    true = scan_shard(shards[0])
    lies = [{"offsets": true.offsets + 10_000}, {"starts": true.starts[::-1].copy()}, {"key_ends": true.key_ends + 1},
            {"ends": true.ends + true.size}, {"sizes": true.sizes - 1000}]
    for lie in lies:
        lying = dataclasses.replace(true, **lie)
        keep_indexes(table_of(str(tmp_path / "idx"), shards), [identity(p) for p in shards], [lying, true])
        kept = KeptIndexes.load(table_of(str(tmp_path / "idx"), shards), shards)
        assert kept.get(shards[0], identity(shards[0])) is None, lie  # walked again
        assert kept.get(shards[1], identity(shards[1])) is not None  # the other shard's part is fine
        assert ShardIndex.from_arrays({**true.arrays(), **lie}, true.size) is None
    assert ShardIndex.from_arrays({**true.arrays(), "flags": true.flags.astype(np.int64)}, true.size) is None
    assert ShardIndex.from_arrays(true.arrays(), true.size) is not None


def test_kept_indexes_are_one_file_and_a_changed_shard_alone_is_not_used(tmp_path: Path) -> None:
    shards = [tmp_path / f"s{k}.tar" for k in range(3)]
    for k, shard in enumerate(shards):
        write_tar(shard, [(f"k{i}.{ext}", bytes([i]) * (100 * k + 1)) for i in range(k + 2) for ext in ("bin", "cls")][: 2 * k + 3])
    paths = [str(s) for s in shards]
    walked = [scan_shard(p) for p in paths]
    keep_indexes(table_of(str(tmp_path / "idx"), paths), [identity(p) for p in paths], walked)
    assert len(list((tmp_path / "idx").iterdir())) == 1
    kept = KeptIndexes.load(table_of(str(tmp_path / "idx"), paths), paths)
    for p, index in zip(paths, walked, strict=True):
        got = kept.get(p, identity(p))
        assert got is not None and got.exts == index.exts and got.keys().tolist() == index.keys().tolist()
        assert all(np.array_equal(got.arrays()[k], v) for k, v in index.arrays().items())
    write_tar(shards[1], [("new.bin", b"changed")])  # another size: another identity
    assert kept.get(paths[1], identity(paths[1])) is None
    assert kept.get(paths[0], identity(paths[0])) is not None and kept.get(paths[2], identity(paths[2])) is not None
    assert KeptIndexes.load(table_of(str(tmp_path / "idx"), paths[:2]), paths[:2]).get(paths[0], identity(paths[0])) is None  # another source


def test_byte_slices_cut_one_buffer_without_a_loop() -> None:
    buf = pa.py_buffer(b"0123456789abcdef")
    got = byte_slices(buf, np.array([1, 4, 10]), np.array([2, 0, 6])).to_pylist()
    assert got == [b"12", b"", b"abcdef"]


def test_members_decode_by_extension_and_name_the_bad_ones() -> None:
    raw = pa.array([b"3", b" 12\n", b"x"], pa.large_binary())
    values, bad = decode_members(extension_type("cls"), raw)
    assert values[:2].tolist() == [3, 12] and bad == [(2, "is not an integer (b'x')")]
    values, bad = decode_members(extension_type("cls"), raw.slice(0, 2))
    assert values.dtype == np.int64 and bad == []
    values, bad = decode_members(extension_type("json"), pa.array([b'{"a": [1]}', b"{"], pa.large_binary()))
    assert values[0] == {"a": [1]} and bad[0][0] == 1
    values, bad = decode_members(extension_type("txt"), pa.array(["é".encode(), b"\xff"], pa.large_binary()))
    assert values[0] == "é" and bad[0][0] == 1 and "UTF-8" in bad[0][1]


def test_grid_blocks_hold_the_samples_starting_in_them() -> None:
    blocks = grid_blocks("s.tar", np.array([0, 100, 5000, 5100]), 9000, 4096)
    assert [(b.start, b.stop, b.rows, b.first_line) for b in blocks] == [(0, 4096, 2, 0), (4096, 8192, 2, 2), (8192, 9000, 0, 4)]


def write_shards(folder: Path, count: int, bad: dict[tuple[int, int], str] | None = None) -> list[str]:
    """``count`` shards of 4 samples (``.bin`` and ``.cls``); ``bad[(shard, sample)]``: what to
    do wrong there ("no-cls", "bad-cls", "two-bin")."""
    paths = []
    for s in range(count):
        members = []
        for i in range(4):
            how = (bad or {}).get((s, i))
            members.append((f"s{s}_{i}.bin", bytes([s, i]) * 300))
            if how == "two-bin":
                members.append((f"s{s}_{i}.bin", b"again"))
            if how != "no-cls":
                members.append((f"s{s}_{i}.cls", b"x" if how == "bad-cls" else str(10 * s + i).encode()))
        write_tar(folder / f"t{s}.tar", members)
        paths.append(str(folder / f"t{s}.tar"))
    return paths


def test_a_read_group_over_many_shards_is_their_reads_joined(tmp_path: Path) -> None:
    # One pass makes the columns of every shard of a group (NOTE [ Shard reads ]): the same rows,
    # and the same bad samples at the same positions, as reading the blocks one by one.
    bad = {(0, 1): "no-cls", (2, 0): "bad-cls", (2, 3): "two-bin", (3, 2): "no-cls"}
    paths = write_shards(tmp_path, 4, bad)
    src = naiad.read_webdataset(paths, index_dir=False, on_bad_rows="skip", extensions=["bin", "cls"])
    blocks = src.blocks()
    parts = [(b, 0, b.rows, None) for b in blocks] + [(blocks[1], 1, 3, None), (blocks[3], 0, 4, np.array([0, 2, 3]))]
    group = src.read_group(parts)
    one_by_one = [src.read_group([p]) for p in parts]
    assert group.columns["__key__"].tolist() == [k for d in one_by_one for k in d.columns["__key__"].tolist()]
    assert group.columns["cls"].tolist() == [c for d in one_by_one for c in d.columns["cls"].tolist()]
    assert group.columns["bin"].tolist() == [v for d in one_by_one for v in d.columns["bin"].tolist()]
    at = np.cumsum([0] + [len(p[3]) if p[3] is not None else p[2] - p[1] for p in parts])
    assert [(e["at"], e["key"], e.get("column")) for e in group.bad] == [
        (int(at[k]) + e["at"], e["key"], e.get("column")) for k, d in enumerate(one_by_one) for e in d.bad]
    assert [e["key"] for e in group.bad] == ["s0_1", "s2_0", "s2_3", "s3_2", "s3_2"]
    strict = naiad.read_webdataset(paths, index_dir=False, extensions=["bin", "cls"])
    with pytest.raises(SourceError, match=r"t0\.tar.*'s0_1' \(sample 1 of the shard\) has no \.cls member"):
        strict.read_group([(b, 0, b.rows, None) for b in strict.blocks()])


def test_a_copy_reads_the_kept_indexes_again_once_another_process_has_kept_them(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker's copy of the source that found nothing kept reads the file again when its
    # parent has written it (after counting every shard): it walks no shard its parent walked.
    paths = write_shards(tmp_path, 3)
    src = naiad.read_webdataset(paths, index_dir=str(tmp_path / "idx"))
    worker = pickle.loads(pickle.dumps(src))
    walked: list[str] = []
    real = naiad.sources.webdataset.scan_shard

    def counted(path: str, store: Any = None) -> Any:
        walked.append(path)
        return real(path, store)

    monkeypatch.setattr(naiad.sources.webdataset, "scan_shard", counted)
    worker.shard_index(paths[0])  # nothing kept yet: walked
    src.blocks()  # the count (on threads): every shard indexed, kept in one file
    assert sorted(walked) == paths  # the first by the copy, the others by the count
    worker.shard_index(paths[2])
    assert sorted(walked) == paths  # from the file written since
