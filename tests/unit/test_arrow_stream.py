"""read_arrow over the Arrow IPC *stream* format (NOTE [ Stream walk ] in sources/ipc_stream.py):
blocks per record batch with exact rows, local and remote, the walk kept in the index folder, and
damaged or hostile streams refused with a SourceError naming the file."""

from __future__ import annotations

import os
import threading

import fsspec
import numpy as np
import pyarrow as pa
import pytest

import naiad
from naiad.errors import SourceError
from naiad.sources import ipc_stream
from naiad.sources.index import save_arrays

SIZES = (7, 0, 13, 5, 1)  # record batches, an empty one among them


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("raw", pa.binary())])


def table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "name": [f"r{i}" for i in ids.tolist()],
                     "raw": [bytes([i % 256]) * (i % 5) for i in ids.tolist()]}, schema=SCHEMA)


def write_stream(path: str, sizes: tuple[int, ...] = SIZES, start: int = 0, *, legacy: bool = False) -> list[int]:
    """A stream file of one record batch per size; returns the ids written."""
    options = pa.ipc.IpcWriteOptions(use_legacy_format=legacy)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table(0, 0).schema, options=options) as writer:
        for n in sizes:
            t = table(start, n)
            writer.write_batch(pa.RecordBatch.from_arrays([c.combine_chunks() for c in t.columns], schema=t.schema))
            start += n
    return list(range(start - sum(sizes), start))


def ids(src: naiad.Source) -> list[int]:
    return [int(i) for b in src.blocks() for i in src.read_block(b).columns["id"]]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_stream_file_reads_every_row_in_blocks_of_its_record_batches(tmp_path, legacy):
    path = str(tmp_path / "data.arrow")
    expected = write_stream(path, legacy=legacy)
    src = naiad.read_arrow(path, index_dir=False)
    assert [b.rows for b in src.blocks()] == [n for n in SIZES if n]  # exact, the empty batch left out
    assert len(src) == sum(SIZES) and ids(src) == expected
    batch = src.read_block(src.blocks()[2], 1, 3).columns
    assert batch["id"].tolist() == [21, 22] and batch["name"] == ["r21", "r22"] and list(batch["raw"]) == [b"\x15", b"\x16\x16"]


def test_stream_and_file_formats_read_alike_side_by_side(tmp_path):
    stream = str(tmp_path / "a.arrow")
    write_stream(stream)
    file = str(tmp_path / "b.arrow")
    t = table(sum(SIZES), 11)
    with pa.ipc.new_file(file, t.schema) as w:
        w.write_table(t, max_chunksize=4)
    src = naiad.read_arrow([stream, file], block_rows=3, index_dir=False)
    assert max(b.rows for b in src.blocks()) == 3  # a stream's big batches sliced as a file's
    assert ids(src) == list(range(sum(SIZES) + 11))
    loader = naiad.DataLoader(src, batch_size=4, shuffle=True, seed=1, shuffle_buffer=6)
    got = [int(i) for b in loader for i in b["id"]]
    assert sorted(got) == list(range(sum(SIZES) + 11)) and got != sorted(got)


def test_a_stream_with_no_record_batches_has_no_rows(tmp_path):
    path = str(tmp_path / "empty.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table(0, 0).schema):
        pass
    src = naiad.read_arrow(path, index_dir=False)
    assert src.column_names == ["id", "name", "raw"] and len(src) == 0


def test_read_positions_takes_rows_in_any_order_across_files(tmp_path):
    a, b = str(tmp_path / "a.arrow"), str(tmp_path / "b.arrow")
    write_stream(a)
    write_stream(b, (4, 6), start=sum(SIZES))
    src = naiad.read_arrow([a, b], index_dir=False)
    rows = np.array([35, 0, 26, 26, 7, 8, 9, 30, 3])
    got = src.read_positions(rows).columns
    assert got["id"].tolist() == rows.tolist() and got["name"] == [f"r{i}" for i in rows.tolist()]
    assert src.read_positions(np.arange(7, 20)).columns["id"].tolist() == list(range(7, 20))  # a run: a slice
    assert src.read_positions(np.zeros(0, np.int64)).columns["id"].tolist() == []


def test_the_walk_is_kept_in_the_index_folder_and_a_changed_file_walked_again(tmp_path, monkeypatch):
    path = str(tmp_path / "data.arrow")
    write_stream(path)
    index = tmp_path / "index"
    first = naiad.read_arrow(path, index_dir=index)
    assert len(first) == sum(SIZES) and list(index.glob("*.npz"))
    walks = []
    real = ipc_stream.walk_stream
    monkeypatch.setattr(ipc_stream, "walk_stream", lambda *a: walks.append(a) or real(*a))
    assert ids(naiad.read_arrow(path, index_dir=index)) == ids(first) and walks == []  # kept: no walk
    write_stream(path, (3, 3))  # another file under the same name
    os.utime(path, ns=(1, 1))
    assert ids(naiad.read_arrow(path, index_dir=index)) == list(range(6)) and len(walks) == 1


def test_a_kept_walk_that_lies_is_refused_and_the_file_walked_again(tmp_path, caplog):
    path = str(tmp_path / "data.arrow")
    write_stream(path)
    index = tmp_path / "index"
    size = os.path.getsize(path)
    for lie in ({"offsets": np.array([size - 4]), "lengths": np.array([64]), "rows": np.array([9])},
                {"offsets": np.array([8]), "lengths": np.array([16]), "rows": np.array([-1])},
                {"offsets": np.array([1.5]), "lengths": np.array([16]), "rows": np.array([3])}):
        save_arrays(index, path, {"ipc_stream": 1}, {"schema": np.array(8, np.int64), **lie})
        assert ids(naiad.read_arrow(path, index_dir=index)) == list(range(sum(SIZES)))
    assert "not a plausible walk of the file" in caplog.text


def test_a_stream_behind_a_url_is_walked_with_range_reads(tmp_path):
    fs = fsspec.filesystem("memory")
    root = f"memory://naiad-stream-{os.getpid()}-{threading.get_ident()}"
    local = str(tmp_path / "data.arrow")
    expected = write_stream(local)
    with open(local, "rb") as f, fs.open(f"{root}/data.arrow", "wb") as out:
        out.write(f.read())
    try:
        src = naiad.read_arrow(f"{root}/data.arrow")
        assert [b.rows for b in src.blocks()] == [n for n in SIZES if n]
        got = [int(i) for b in naiad.DataLoader(src, batch_size=5, num_workers=2, worker_mode="thread") for i in b["id"]]
        assert got == expected
        assert src.read_positions(np.array([20, 2])).columns["id"].tolist() == [20, 2]
    finally:
        fs.rm(root, recursive=True)


# -- damaged and hostile streams ---------------------------------------------------------------


def test_bytes_that_are_no_arrow_at_all_are_a_source_error_naming_the_file(tmp_path):
    path = tmp_path / "junk.arrow"
    for junk in (b"", b"\x01\x02", b"hello, this is not arrow at all" * 10, b"\xff\xff\xff\xff\x10\x00\x00\x00" + b"\0" * 16):
        path.write_bytes(junk)
        with pytest.raises(SourceError, match=r"junk\.arrow.*not an Arrow IPC file or stream"):
            naiad.read_arrow(str(path), index_dir=False)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_a_truncated_stream_is_a_source_error_naming_the_file(tmp_path, cut):
    path = tmp_path / "cut.arrow"
    write_stream(str(path))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(SourceError, match=r"cut\.arrow"):
        len(naiad.read_arrow(str(path), index_dir=False))


def test_a_metadata_length_past_the_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.arrow"
    write_stream(str(path))
    data = bytearray(path.read_bytes())
    first = 8 + int.from_bytes(data[4:8], "little")  # the first record batch's prefix
    data[first + 4:first + 8] = (2**31 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"huge\.arrow.*damaged Arrow IPC stream.*claims 2,147,483,647 bytes"):
        len(naiad.read_arrow(str(path), index_dir=False))


def test_a_dictionary_encoded_stream_is_refused_with_the_fix(tmp_path):
    path = str(tmp_path / "dict.arrow")
    t = pa.table({"c": pa.array(["a", "b", "a"]).dictionary_encode()})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(SourceError, match=r"dict\.arrow.*dictionary-encoded.*pyarrow\.ipc\.new_file"):
        len(naiad.read_arrow(path, index_dir=False))


def test_a_batch_that_no_longer_holds_its_indexed_rows_is_named(tmp_path):
    path = str(tmp_path / "data.arrow")
    write_stream(path)
    src = naiad.read_arrow(path, index_dir=False)
    stream = src._stream(path)
    stream.rows = stream.rows + 1  # as a kept walk of another version of the file would say
    with pytest.raises(SourceError, match=r"data\.arrow.*record batch 0 holds 7 rows, its index 8"):
        src.read_block(src.blocks()[0])
