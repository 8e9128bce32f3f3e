"""Readers: lazy, correct values and types, options, and clear errors on bad input."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from naiad import sources
from naiad.errors import ConfigError, SourceError
from tests.conftest_stream import FORMATS, open_numbered, write_numbered


def _read_all(src: sources.Source) -> dict:
    parts = [src.read_block(b) for b in src.blocks()]
    out: dict = {}
    for p in parts:
        for k, v in p.columns.items():
            out.setdefault(k, []).append(np.asarray(v))
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_returns_every_row_in_file_order(tmp_path, fmt):
    paths = write_numbered(str(tmp_path), fmt, [23, 0, 9])
    src = open_numbered(paths, fmt)
    assert len(src) == 32
    ids = _read_all(src)["id"]
    assert [int(v) for v in ids] == list(range(32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_construction_reads_no_blocks(tmp_path, fmt):
    paths = write_numbered(str(tmp_path), fmt, [10])
    src = open_numbered(paths, fmt)
    assert src._blocks is None  # the row count waits for the first iteration


def test_csv_types_are_inferred_then_fixed_and_strings_are_lists(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b,name\n1,2.5,x\n3,4,y\n")
    src = sources.read_csv(str(p))
    cols = src.read_block(src.blocks()[0]).columns
    assert cols["a"].dtype == np.int64 and cols["b"].dtype == np.float64
    assert cols["name"] == ["x", "y"]
    assert list(cols) == ["a", "b", "name"]


def test_csv_options_delimiter_names_columns_dtypes(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("1\t2\tx\n3\t4\ty\n")
    src = sources.read_csv(str(p), csv=sources.CsvFormat(delimiter="\t", header=False, column_names=["a", "b", "c"]),
                           columns=["c", "a"], dtypes={"a": "float32"})
    cols = src.read_block(src.blocks()[0]).columns
    assert list(cols) == ["a", "c"]  # file order
    assert cols["a"].dtype == np.float32 and cols["c"] == ["x", "y"]


def test_one_dtype_applies_to_every_numeric_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b,s\n1,2.5,x\n")
    cols = _read_all(sources.read_csv(str(p), dtypes="float32"))
    assert cols["a"].dtype == np.float32 and cols["b"].dtype == np.float32


@pytest.mark.parametrize("ext,opener", [(".gz", gzip.open), (".zst", None)])
def test_compressed_csv_and_jsonl(tmp_path, ext, opener):
    body = "id,v\n" + "".join(f"{i},{i}\n" for i in range(100))
    p = str(tmp_path / f"d.csv{ext}")
    if opener is not None:
        with opener(p, "wt") as f:
            f.write(body)
    else:
        with pa.CompressedOutputStream(p, "zstd") as f:
            f.write(body.encode())
    src = sources.read_csv(p)
    assert len(src.blocks()) == 1 and len(src) == 100
    assert _read_all(src)["id"].tolist() == list(range(100))


def test_glob_and_list_of_paths(tmp_path):
    paths = write_numbered(str(tmp_path), "csv", [3, 4])
    assert len(sources.read_csv(str(tmp_path / "*.csv"))) == 7
    assert len(sources.read_csv(paths[::-1])) == 7


def test_blank_lines_are_not_rows_in_csv_but_are_in_text(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a\n1\n\n2\r\n\r\n3\n")
    assert _read_all(sources.read_csv(str(p), block_bytes=3))["a"].tolist() == [1, 2, 3]
    t = tmp_path / "d.txt"
    t.write_text("x\n\ny\r\nlast")
    assert list(_read_all(sources.read_text(str(t)))["text"]) == ["x", "", "y", "last"]


def test_jsonl_missing_float_field_is_nan(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1, "b": 0.5}\n{"a": 2}\n')
    cols = _read_all(sources.read_jsonl(str(p)))
    assert np.isnan(cols["b"][1]) and cols["a"].tolist() == [1, 2]


def test_npy_mapping_and_structured_arrays(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(20, dtype=np.float32).reshape(10, 2))
    np.save(tmp_path / "y.npy", np.arange(10))
    src = sources.read_npy({"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}, block_rows=3)
    cols = _read_all(src)
    assert cols["x"].shape == (10, 2) and cols["y"].tolist() == list(range(10))
    rec = np.zeros(4, dtype=[("a", "f4"), ("b", "i8")])
    rec["b"] = [1, 2, 3, 4]
    np.save(tmp_path / "r.npy", rec)
    assert list(_read_all(sources.read_npy(str(tmp_path / "r.npy")))) == ["a", "b"]


def test_parquet_columns_and_fixed_size_lists(tmp_path):
    p = str(tmp_path / "d.parquet")
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 3)
    pq.write_table(pa.table({"a": [1, 2, 3, 4], "emb": emb, "s": list("wxyz")}), p, row_group_size=2)
    src = sources.read_parquet(p, columns=["emb", "a"])
    cols = _read_all(src)
    assert list(cols) == ["a", "emb"] and cols["emb"].shape == (4, 3)


# -- bad input ------------------------------------------------------------------------------


def _bad_csv(tmp_path, bad_line: str) -> str:
    lines = ["a,b"] + [f"{i},{i}.5" for i in range(50)]
    lines[30] = bad_line  # line 31 of the file
    p = tmp_path / "bad.csv"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.parametrize("bad,problem", [("7", "Expected 2 columns, got 1"), ("7,abc", "conversion error"), ("1,2,3", "Expected 2 columns, got 3")])
def test_malformed_csv_row_raises_source_error_with_file_line_and_problem(tmp_path, bad, problem):
    src = sources.read_csv(_bad_csv(tmp_path, bad), block_bytes=64)
    with pytest.raises(SourceError, match=problem) as info:
        for b in src.blocks():
            src.read_block(b)
    assert info.value.path == src.paths[0] and info.value.line == 31
    assert "line 31" in str(info.value) and "bad.csv" in str(info.value)


def test_unparseable_number_names_its_column(tmp_path):
    src = sources.read_csv(_bad_csv(tmp_path, "7,abc"))
    with pytest.raises(SourceError) as info:
        src.read_block(src.blocks()[0])
    assert info.value.column == "b"


def test_skip_counts_bad_rows_and_keeps_the_rest(tmp_path):
    src = sources.read_csv(_bad_csv(tmp_path, "7,abc"), on_bad_rows="skip", block_bytes=64)
    parts = [src.read_block(b) for b in src.blocks()]
    assert sum(p.bad_rows for p in parts) == 1
    assert sum(len(p.columns["a"]) for p in parts) == 49


def test_null_in_integer_column_is_a_bad_row(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(10)) + ",3\n")
    with pytest.raises(SourceError, match="missing value in integer column 'a'") as info:
        src = sources.read_csv(str(p))
        src.read_block(src.blocks()[0])
    assert info.value.line == 12


def test_truncated_csv_is_a_bad_last_row(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b,c\n1,2,3\n4,5,6\n7,8")
    src = sources.read_csv(str(p))
    with pytest.raises(SourceError, match="Expected 3 columns, got 2") as info:
        for b in src.blocks():
            src.read_block(b)
    assert info.value.line == 4


def test_malformed_jsonl_row_raises_with_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"a": 1}\n{"a": 2\n{"a": 3}\n')
    src = sources.read_jsonl(str(p))
    with pytest.raises(SourceError, match="JSON parse error") as info:
        src.read_block(src.blocks()[0])
    assert info.value.line == 2
    skip = sources.read_jsonl(str(p), on_bad_rows="skip")
    data = skip.read_block(skip.blocks()[0])
    assert data.bad_rows == 1 and data.columns["a"].tolist() == [1, 3]


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "npy"])
def test_truncated_binary_file_raises_source_error_naming_it(tmp_path, fmt):
    (path,) = write_numbered(str(tmp_path), fmt, [1000])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(SourceError, match="truncated") as info:
        src = open_numbered([path], fmt)
        for b in src.blocks():
            src.read_block(b)
    assert path in str(info.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_file_raises_source_error(tmp_path, fmt):
    with pytest.raises(SourceError, match="file not found") as info:
        open_numbered([str(tmp_path / f"nope.{fmt}")], fmt)
    assert info.value.path == str(tmp_path / f"nope.{fmt}")


def test_glob_matching_nothing_raises(tmp_path):
    with pytest.raises(SourceError, match="matches no file"):
        sources.read_csv(str(tmp_path / "*.csv"))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "arrow"])
def test_unknown_column_raises_source_error_listing_the_columns(tmp_path, fmt):
    paths = write_numbered(str(tmp_path), fmt, [5])
    with pytest.raises(SourceError, match=r"unknown column\(s\) \['nope'\].*the file has \['id', 'value'\]") as info:
        src = open_numbered(paths, fmt, columns=["nope"])
        src.schema()
    assert info.value.column == "nope"


def test_bad_options_raise_config_error(tmp_path):
    paths = write_numbered(str(tmp_path), "csv", [5])
    with pytest.raises(ConfigError, match="on_bad_rows"):
        sources.read_csv(paths, on_bad_rows="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="delimiter"):
        sources.read_csv(paths, csv=sources.CsvFormat(delimiter=";;"))


def test_header_mismatch_between_files_raises(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("y,x\n1,2\n")
    with pytest.raises(SourceError, match="differs"):
        sources.read_csv(str(tmp_path / "*.csv")).blocks()


def test_quoted_newline_needs_opt_in(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text('a,s\n1,"two\nlines"\n2,plain\n')
    with pytest.raises(SourceError):
        src = sources.read_csv(str(p))
        src.read_block(src.blocks()[0])
    ok = sources.read_csv(str(p), csv=sources.CsvFormat(newlines_in_values=True))
    cols = _read_all(ok)
    assert cols["s"].tolist() == ["two\nlines", "plain"]
    assert ok.read_block(ok.blocks()[0], 1, 2).columns["a"].tolist() == [2]
    p.write_text('a,s\n1,"two\nlines"\n2\n3,x\n')
    with pytest.raises(SourceError, match="data row 2: Expected 2 columns, got 1"):
        bad = sources.read_csv(str(p), csv=sources.CsvFormat(newlines_in_values=True))
        bad.read_block(bad.blocks()[0])
    skip = sources.read_csv(str(p), csv=sources.CsvFormat(newlines_in_values=True), on_bad_rows="skip")
    data = skip.read_block(skip.blocks()[0])
    assert data.bad_rows == 1 and data.columns["a"].tolist() == [1, 3]


def test_source_pickles_without_its_block_list(tmp_path):
    import pickle

    paths = write_numbered(str(tmp_path), "csv", [50])
    src = open_numbered(paths, "csv")
    src.blocks()
    clone = pickle.loads(pickle.dumps(src))
    assert clone._blocks is None and clone.schema() == src.schema()


def test_truncated_gzip_raises_source_error(tmp_path):
    p = str(tmp_path / "d.csv.gz")
    with gzip.open(p, "wt") as f:
        f.write("a,b\n" + "".join(f"{i},{i}\n" for i in range(5000)))
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)
    with pytest.raises(SourceError, match="truncated") as info:
        sources.read_csv(p).blocks()
    assert info.value.path == p


def test_empty_files_among_csv_files(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"")
    (tmp_path / "b.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "c.csv").write_text("x,y\n")
    src = sources.read_csv(str(tmp_path / "*.csv"))
    assert src.column_names == ["x", "y"] and len(src) == 2
    assert _read_all(src)["y"].tolist() == [2, 4]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text", "parquet", "arrow", "npy"])
def test_read_rows_gives_the_rows_a_whole_read_gives(tmp_path, fmt):
    # What a resume reads: scattered rows of a block (line formats parse only those lines).
    src = open_numbered(write_numbered(str(tmp_path), fmt, [90], chunk_rows=90), fmt, small_blocks=False)
    block = src.blocks()[0]
    whole = src.read_block(block).columns
    rng = np.random.default_rng(0)
    for k in (1, 3, 40, 89):
        rows = np.sort(rng.choice(block.rows, k, replace=False))
        got = src.read_rows(block, rows).columns
        for name, col in whole.items():
            expected = np.asarray(col)[rows]
            assert np.asarray(got[name]).tolist() == expected.tolist(), (fmt, k, name)


def test_read_rows_rejects_rows_out_of_order(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [10]), "csv", small_blocks=False)
    with pytest.raises(ConfigError, match="ascend"):
        src.read_rows(src.blocks()[0], np.array([3, 2]))


def test_the_default_block_is_a_share_of_the_whole_source_not_of_each_file(tmp_path):
    from naiad.sources.lines import block_bytes_for, default_block_bytes

    # Sparse files: sizes without the bytes. Three of 100 MiB: 1/4096 of 300 MiB is 75 KiB, where
    # each file alone would get the 64 KiB floor (and eight such sources 8x the blocks).
    paths = []
    for i in range(3):
        p = tmp_path / f"part-{i}.csv"
        with open(p, "wb") as f:
            f.truncate(100 << 20)
        paths.append(str(p))
    assert default_block_bytes(paths) == (300 << 20) // 4096 == 75 << 10
    assert default_block_bytes(paths[:1]) == 64 << 10
    assert default_block_bytes([str(tmp_path / "missing.csv")]) == 64 << 10
    with open(tmp_path / "big.csv", "wb") as f:
        f.truncate(20 << 30)
    assert default_block_bytes([str(tmp_path / "big.csv")]) == 4 << 20  # the cap

    src = sources.read_csv(paths)
    assert src.local_bytes() == 300 << 20
    assert block_bytes_for(paths[0], None, src.local_bytes()) == 75 << 10
    assert block_bytes_for(paths[0], 1000, src.local_bytes()) == 1000
    assert block_bytes_for(paths[0], None, None) == 64 << 10  # a remote source: each file alone


@pytest.mark.parametrize("fmt", ["npy", "arrow"])
def test_npy_and_arrow_blocks_are_a_share_of_the_whole_source(tmp_path, fmt):
    # Two files of 3,000,000 rows: alone, 1/4096 of a file is under the 1,024-row floor; the
    # source's 6,000,000 rows give blocks of 1,464.
    paths = []
    for i in range(2):
        values = np.full(3_000_000, i, np.int8)
        p = tmp_path / f"part-{i}.{fmt}"
        if fmt == "npy":
            np.save(p, values)
        else:
            table = pa.table({"x": values})
            with pa.ipc.new_file(str(p), table.schema) as w:
                w.write_table(table)
        paths.append(str(p))
    both = sources.read(paths)
    assert max(b.rows for b in both.blocks()) == 6_000_000 // 4096 == 1464  # Arrow slices evenly: 1463-1464
    one = sources.read(paths[:1])
    assert max(b.rows for b in one.blocks()) == 1024
    assert sum(b.rows for b in both.blocks()) == 6_000_000


def test_npy_headers_open_in_threads_beside_the_callers_parses(tmp_path):
    # NumPy parses a header with ast.literal_eval, which CPython 3.11 cannot run in two threads
    # at once (SystemError "AST constructor recursion depth mismatch" in either): naiad reads
    # headers with no parser (NOTE [ npy headers without ast ]), so threads open files while the
    # caller's own thread parses source, and every one reads right. The caller's parses leave
    # garbage whose finalizer yields the interpreter, as a training loop's do: a collection
    # inside a parse then lets the threads run in its middle.
    import ast
    import gc
    import threading
    import time

    from naiad.sources import npy

    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"a{i}.npy"))
        np.save(paths[-1], np.full((8, 3), i, np.int32))
    errors: list[BaseException] = []
    stop = threading.Event()

    def open_all() -> None:
        try:
            while not stop.is_set():
                for i, p in enumerate(paths):
                    assert (np.asarray(npy._load(p)) == i).all()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    class Yields:
        def __init__(self) -> None:
            self.me = self  # a cycle: freed by a collection, which may come inside a parse

        def __del__(self) -> None:
            time.sleep(0)

    threads = [threading.Thread(target=open_all) for _ in range(2)]
    for t in threads:
        t.start()
    source = "x = [(1, 2), {'a': (3,)}]\n" * 50
    gc.collect()
    old = gc.get_threshold()
    gc.set_threshold(50)
    try:
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline and not errors:
            for _ in range(20):
                Yields()
            ast.parse(source)
    finally:
        gc.set_threshold(*old)
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_line_longer_than_pyarrows_parse_block_is_read(tmp_path, fmt):
    # PyArrow parses in 1 MiB blocks and refuses a line that straddles two: the reader parses
    # that buffer as one block.
    long = "x" * (3 << 20)
    path = tmp_path / f"a.{fmt}"
    if fmt == "csv":
        path.write_text(f"id,text\n0,short\n1,{long}\n2,end\n")
        source = sources.read_csv(str(path))
    else:
        path.write_text('{"id":0,"text":"short"}\n{"id":1,"text":"' + long + '"}\n{"id":2,"text":"end"}\n')
        source = sources.read_jsonl(str(path))
    data = _read_all(source)
    assert data["id"].tolist() == [0, 1, 2]
    assert [len(t) for t in data["text"]] == [5, len(long), 3]
