"""The newline scan that cuts line-based files into blocks, and its persisted index."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naiad
from naiad.sources.index import index_folder, load_index
from naiad.sources.lines import row_spans, scan_file
from naiad.sources.scan import cut_lines, cut_lines_parallel, early_cut, header_end, span_rows


def reference_cut(data: bytes, block_bytes: int, header_lines: int, keep_blank: bool) -> list[tuple[int, int, int, int]]:
    """The cut as a plain loop: read steps of ``block_bytes``, cut at the last newline read; rows
    as ``row_spans`` (what the readers slice by) counts them."""
    pos = header_end(data[: max(block_bytes, 1 << 16)], header_lines, "x") if header_lines else 0
    out, line, carry, read = [], 1 + header_lines, b"", pos
    while True:
        chunk = data[read : read + block_bytes]
        read += len(chunk)
        buf = carry + chunk
        if not buf:
            return out
        if chunk:
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                carry = buf
                continue
        else:
            cut = len(buf)
        body, carry = buf[:cut], buf[cut:]
        out.append((pos, pos + cut, len(row_spans(body, keep_blank)[0]), line))
        pos += cut
        line += body.count(b"\n")


lines = st.lists(
    st.one_of(st.just(b""), st.just(b"\r"), st.binary(min_size=1, max_size=30).map(lambda b: b.replace(b"\n", b"x"))),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.integers(1, 64), st.integers(0, 1), st.booleans())
def test_scan_matches_the_plain_loop(tmp_path_factory: pytest.TempPathFactory, rows: list[bytes], final_newline: bool,
                                     block_bytes: int, header_lines: int, keep_blank: bool) -> None:
    data = b"\n".join(rows) + (b"\n" if final_newline and rows else b"")
    path = tmp_path_factory.mktemp("scan") / "f.txt"
    path.write_bytes(data)
    got = scan_file(str(path), block_bytes=block_bytes, header_lines=header_lines, compression=None,
                    keep_blank=keep_blank, whole=False)
    assert [(b.start, b.stop, b.rows, b.first_line) for b in got] == reference_cut(data, block_bytes, header_lines, keep_blank)


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.integers(1, 64), st.integers(0, 1), st.booleans(), st.integers(1, 40))
def test_any_piece_size_cuts_the_same(rows: list[bytes], final_newline: bool, block_bytes: int, header_lines: int,
                                      keep_blank: bool, piece: int) -> None:
    # Blocks, blank lines ("\n\n", "\n\r\n") and lines longer than a step across the scan's pieces.
    data = b"\n".join(rows) + (b"\n" if final_newline and rows else b"")
    pos = header_end(data[: max(block_bytes, 1 << 16)], header_lines, "x") if header_lines else 0
    f = io.BytesIO(data)
    f.seek(pos)
    got = cut_lines(f, pos, block_bytes, 1 + header_lines, keep_blank, chunk_bytes=piece)
    assert got == reference_cut(data, block_bytes, header_lines, keep_blank)


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.integers(1, 16), st.integers(0, 1), st.booleans(), st.integers(1, 40), st.integers(1, 80),
       st.integers(1, 3))
def test_regions_side_by_side_cut_the_same(rows: list[bytes], final_newline: bool, block_bytes: int, header_lines: int,
                                           keep_blank: bool, piece: int, region: int, threads: int) -> None:
    # Lines and blank lines across regions, a line longer than a region, a region of no newline.
    data = b"\n".join(rows) + (b"\n" if final_newline and rows else b"")
    pos = header_end(data[: max(block_bytes, 1 << 16)], header_lines, "x") if header_lines else 0

    def open_at(offset: int) -> io.BytesIO:
        f = io.BytesIO(data)
        f.seek(offset)
        return f

    got = cut_lines_parallel(open_at, pos, len(data), block_bytes, 1 + header_lines, keep_blank, threads,
                             region_bytes=region, chunk_bytes=piece)
    assert got == reference_cut(data, block_bytes, header_lines, keep_blank)


@settings(max_examples=300, deadline=None)
@given(lines, st.booleans(), st.integers(1, 64), st.integers(0, 1), st.booleans())
def test_the_early_cut_and_its_counts_are_the_scans(tmp_path_factory: pytest.TempPathFactory, rows: list[bytes],
                                                    final_newline: bool, block_bytes: int, header_lines: int,
                                                    keep_blank: bool) -> None:
    # The byte ranges from the grid points alone, then each block counted on its own (NOTE [
    # Early reads ]): blank lines at block starts, lines longer than a step, a last line alone.
    data = b"\n".join(rows) + (b"\n" if final_newline and rows else b"")
    path = tmp_path_factory.mktemp("early") / "f.txt"
    path.write_bytes(data)
    spans = early_cut(str(path), block_bytes, header_lines)
    got = [(a, b, span_rows(str(path), a, b, keep_blank)) for a, b in spans]
    assert got == [e[:3] for e in reference_cut(data, block_bytes, header_lines, keep_blank)]


def test_the_early_cut_searches_back_past_long_lines(tmp_path: Path) -> None:
    # Lines longer than the first backward read (4 KiB) and than a step.
    data = b"h\n" + b"".join(b"%d,%s\n" % (i, b"a" * (i * 997 % 20000)) for i in range(60)) + b"\r\n\nend"
    path = tmp_path / "f.csv"
    path.write_bytes(data)
    for bb in (100, 5000, 1 << 16):
        got = [(a, b, span_rows(str(path), a, b, False)) for a, b in early_cut(str(path), bb, 1)]
        assert got == [e[:3] for e in reference_cut(data, bb, 1, False)]


def test_scan_crosses_its_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import naiad.sources.scan as scan_mod

    monkeypatch.setattr(scan_mod, "SCAN_CHUNK_BYTES", 7)  # every line straddles a read
    data = b"".join(b"%d,%s\n" % (i, b"a" * (i % 13)) for i in range(500)) + b"\n\r\nlast"
    path = tmp_path / "f.csv"
    path.write_bytes(data)
    for bb in (1, 5, 64, 1000):
        got = scan_file(str(path), block_bytes=bb, header_lines=1, compression=None, keep_blank=False, whole=False)
        assert [(b.start, b.stop, b.rows, b.first_line) for b in got] == reference_cut(data, bb, 1, False)


def test_a_big_local_file_is_scanned_in_regions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import naiad.sources.scan as scan_mod

    data = b"id,x\n" + b"".join(b"%d,%s\n" % (i, b"a" * (i % 29)) for i in range(3000)) + b"\n\r\n\n" + b"7,b" * 400
    path = tmp_path / "f.csv"
    path.write_bytes(data)
    regions: list[int] = []
    real = scan_mod.cut_lines_parallel

    def spy(*args: object, **kwargs: object) -> list[tuple[int, int, int, int]]:
        regions.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(scan_mod, "cut_lines_parallel", spy)
    monkeypatch.setattr(scan_mod, "SCAN_REGION_BYTES", 4000)
    monkeypatch.setattr(scan_mod, "SCAN_CHUNK_BYTES", 1500)
    monkeypatch.setattr(scan_mod, "thread_cores", lambda: 3)
    for bb in (1, 700, 5000):
        got = scan_file(str(path), block_bytes=bb, header_lines=1, compression=None, keep_blank=False, whole=False)
        assert [(b.start, b.stop, b.rows, b.first_line) for b in got] == reference_cut(data, bb, 1, False)
    assert len(regions) == 3


def test_files_cut_side_by_side_are_in_file_order(tmp_path: Path) -> None:
    paths = []
    for k in range(5):
        paths.append(tmp_path / f"{k}.csv")
        paths[-1].write_text("id,x\n" + "".join(f"{k * 1000 + i},{i}\n" for i in range(100 + 37 * k)))
    source = naiad.read_csv(paths, block_bytes=300)
    blocks = source.blocks()
    one_by_one = [b for p in paths for b in naiad.read_csv(p, block_bytes=300).blocks()]
    assert blocks == one_by_one
    assert np.array_equal(ids(naiad.read_csv(paths, block_bytes=300)), np.concatenate(
        [np.arange(k * 1000, k * 1000 + 100 + 37 * k) for k in range(5)]))
    (tmp_path / "2.csv").write_text("id,y\n1,2\n")  # the first file to fail, in file order, is named
    (tmp_path / "4.csv").write_text("id,z\n1,2\n")
    with pytest.raises(naiad.SourceError, match="2.csv"):
        naiad.read_csv(paths, block_bytes=300).blocks()


def test_a_thread_of_a_pool_that_shares_the_cores_splits_no_further() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from naiad.parallel.threads import one_core_each, thread_cores, usable_cores

    assert thread_cores() == usable_cores()
    with ThreadPoolExecutor(2, initializer=one_core_each) as pool:
        assert list(pool.map(lambda _: thread_cores(), range(4))) == [1, 1, 1, 1]
    assert thread_cores() == usable_cores()


def write_csv(path: Path, n: int) -> None:
    path.write_text("id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(n)))


def ids(source: naiad.Source, **kw: object) -> np.ndarray:
    loader = naiad.DataLoader(source, batch_size=64, **kw)  # type: ignore[arg-type]
    return np.concatenate([b["id"].numpy() for b in loader])


def test_index_is_persisted_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.csv"
    write_csv(path, 3000)
    cache = tmp_path / "cache"
    first = naiad.read_csv(path, block_bytes=4096, index_dir=cache)
    blocks = first.blocks()
    entries = list(cache.iterdir())
    assert len(entries) == 1 and json.loads(entries[0].read_text())["rows"] == [b.rows for b in blocks]

    import naiad.sources.lines as lines_mod

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("scanned although the index is valid")

    monkeypatch.setattr(lines_mod, "scan_plain", no_scan)
    again = naiad.read_csv(path, block_bytes=4096, index_dir=cache)
    assert again.blocks() == blocks
    assert sorted(ids(again, shuffle=True, seed=3)) == list(range(3000))


def test_changed_file_is_scanned_again(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    write_csv(path, 1000)
    cache = tmp_path / "cache"
    assert len(naiad.read_csv(path, index_dir=cache)) == 1000
    write_csv(path, 1500)  # new size (and modification time)
    assert len(naiad.read_csv(path, index_dir=cache)) == 1500
    st = os.stat(path)
    data = path.read_bytes().replace(b"0.5\n", b"0.7\n", 1)  # same size, later modification time
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    source = naiad.read_csv(path, index_dir=cache)
    assert len(source) == 1500 and ids(source).tolist() == list(range(1500))


def test_another_block_size_is_another_entry(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    write_csv(path, 2000)
    cache = tmp_path / "cache"
    a = naiad.read_csv(path, block_bytes=1000, index_dir=cache).blocks()
    b = naiad.read_csv(path, block_bytes=5000, index_dir=cache).blocks()
    assert len(a) > len(b) and len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"version": 1, "path": 3}', b"[]"])
def test_a_broken_entry_is_a_miss(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "d.csv"
    write_csv(path, 500)
    cache = tmp_path / "cache"
    naiad.read_csv(path, index_dir=cache).blocks()
    (entry,) = cache.iterdir()
    entry.write_bytes(content)
    assert load_index(cache, str(path), {"x": 1}) is None
    assert len(naiad.read_csv(path, index_dir=cache)) == 500


def test_beside_and_off(tmp_path: Path) -> None:
    path = tmp_path / "data" / "d.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(100)))
    assert len(naiad.read_jsonl(path, index_dir="beside")) == 100
    assert index_folder("beside", str(path)) == path.parent / ".naiad-index"
    assert len(list((path.parent / ".naiad-index").iterdir())) == 1
    other = tmp_path / "t.txt"
    other.write_text("a\nb\n\nc\n")
    assert len(naiad.read_text(other, index_dir=False)) == 4
    with pytest.raises(naiad.ConfigError, match="index_dir"):
        naiad.read_csv(path, index_dir=3)  # type: ignore[arg-type]


def test_unwritable_folder_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    write_csv(path, 300)
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    assert len(naiad.read_csv(path, index_dir=blocker / "index")) == 300


def test_default_goes_to_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path / "c"))
    path = tmp_path / "d.csv"
    write_csv(path, 200)
    assert len(naiad.read_csv(path)) == 200
    assert len(list((tmp_path / "c" / "index").iterdir())) == 1


def test_prepare_counts_and_infers_at_once_and_raises_the_scans_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_csv(a, 100)
    b.write_text("id,y\n1,2\n")  # another header: found by the scan
    good = naiad.read_csv(a, index_dir=False)
    good.prepare()
    assert len(good) == 100 and good.column_names == ["id", "x"]
    bad = naiad.read_csv([str(a), str(b)], index_dir=False)
    with pytest.raises(naiad.SourceError, match="differs from the first file"):
        bad.prepare()
