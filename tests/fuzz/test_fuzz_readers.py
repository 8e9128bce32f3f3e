"""Every reader, fed damaged files, ends in data or a naiad error that names the file: never
another exception type, a hang or a crash of the interpreter; the same with 0 and 2 workers.

Cases that once failed are kept in ``corpus/<format>/`` (the format names of
``formats.FORMATS``: the reader and its options) and read on every run.
"""

from __future__ import annotations

import glob
import io
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import naiad
from naiad.errors import SourceError
from tests.fuzz.formats import FORMATS, MUTATIONS, NASTY, ROWS, Format, drain, mutate, write

pytestmark = pytest.mark.timeout(120)

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")

FUZZ = settings(
    max_examples=20, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

payloads = st.one_of(st.sampled_from(NASTY), st.binary(min_size=1, max_size=48))


def outcome(fmt: Format, data: bytes, *, workers: bool = False) -> int | None:
    """Rows read, or None for a naiad error naming the file; with ``workers``, the same with 2
    process workers as without."""
    with tempfile.TemporaryDirectory() as d:
        path = write(d, fmt, data)
        inline = drain(fmt, path)
        if workers:
            got = drain(fmt, path, num_workers=2)
            assert inline == got, f"inline read {inline} rows, 2 workers {got} (None: an error)"
    return inline


@pytest.mark.parametrize("name", sorted(FORMATS))
@FUZZ
@given(kind=st.sampled_from(MUTATIONS), pos=st.floats(0, 1), payload=payloads)
def test_damaged_file_gives_data_or_a_naiad_error(name: str, kind: str, pos: float, payload: bytes) -> None:
    fmt = FORMATS[name]
    rows = outcome(fmt, mutate(fmt.seed(), kind, pos, payload))
    assert rows is None or rows >= 0


@settings(FUZZ, max_examples=50)
@given(name=st.sampled_from(sorted(FORMATS)), kind=st.sampled_from(MUTATIONS), pos=st.floats(0, 1), payload=payloads)
def test_damaged_file_read_by_process_workers_as_inline(name: str, kind: str, pos: float, payload: bytes) -> None:
    # A worker's error crosses back with its type and file; a crash would be a WorkerError.
    fmt = FORMATS[name]
    outcome(fmt, mutate(fmt.seed(), kind, pos, payload), workers=True)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CORPUS, "*", "*"))), ids=os.path.basename)
def test_corpus_case_gives_data_or_a_naiad_error(path: str) -> None:
    fmt = FORMATS[os.path.basename(os.path.dirname(path))]
    with open(path, "rb") as f:
        outcome(fmt, f.read(), workers=True)


def test_undamaged_seed_files_read_whole() -> None:
    # The fuzz tests start from these: each must read every row (or the fuzzing proves little).
    for fmt in FORMATS.values():
        assert outcome(fmt, fmt.seed(), workers=True) == ROWS, fmt.name


# -- targeted damage ---------------------------------------------------------------------------


@FUZZ
@given(back=st.integers(1, 120), payload=payloads)
def test_corrupted_parquet_footer_is_a_source_error(back: int, payload: bytes) -> None:
    data = FORMATS["parquet"].seed()
    at = len(data) - back
    rows = outcome(FORMATS["parquet"], data[:at] + payload + data[at + len(payload):])
    assert rows in (None, ROWS)


@FUZZ
@given(pos=st.floats(0.02, 0.7), payload=payloads)
@example(pos=0.3, payload=b"\xff" * 48)
def test_corrupted_parquet_page_is_a_source_error(pos: float, payload: bytes) -> None:
    outcome(FORMATS["parquet"], mutate(FORMATS["parquet"].seed(), "overwrite", pos, payload))


@FUZZ
@given(at=st.integers(0, 127), payload=payloads)
@example(at=10, payload=b"{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999, 3), }")
@example(at=10, payload=b"{'descr': 'O', 'fortran_order': False, 'shape': (60, 3), }")
def test_corrupted_npy_header_is_a_source_error(at: int, payload: bytes) -> None:
    data = FORMATS["npy"].seed()
    rows = outcome(FORMATS["npy"], data[:at] + payload + data[at + len(payload):])
    assert rows in (None, ROWS)


@FUZZ
@given(cut=st.floats(0, 1))
def test_arrow_file_cut_mid_batch_is_a_source_error(cut: float) -> None:
    data = FORMATS["arrow"].seed()
    assert outcome(FORMATS["arrow"], data[: int(cut * (len(data) - 1))]) is None


def test_arrow_batch_body_overwritten_is_a_source_error() -> None:
    # The footer is intact and the batches are where it says; the bytes of one batch (its
    # metadata and buffers) are not. Every position of that damage, one at a time.
    data = FORMATS["arrow"].seed()
    reader = pa.ipc.open_file(pa.py_buffer(data))
    assert reader.num_record_batches > 1
    for at in range(8, len(data) // 2, 7):
        rows = outcome(FORMATS["arrow"], data[:at] + b"\xff\xff\xff\x7f" + data[at + 4:])
        assert rows in (None, ROWS)


@pytest.mark.parametrize("name", ["csv_gz", "jsonl_zst", "text_gz"])
@FUZZ
@given(cut=st.floats(0, 1))
def test_compressed_file_cut_short_is_a_source_error(name: str, cut: float) -> None:
    data = FORMATS[name].seed()
    at = max(1, int(cut * (len(data) - 1)))
    with tempfile.TemporaryDirectory() as d:
        path = write(d, FORMATS[name], data[:at])
        with pytest.raises(SourceError, match="(?i)truncated") as info:
            list(naiad.DataLoader(FORMATS[name].open(path), batch_size=16))
        assert info.value.path == path


# -- damage at a known line: the error names it -----------------------------------------------


def _csv(tmp_path: object, body: bytes) -> str:
    path = os.path.join(str(tmp_path), "bad.csv")
    with open(path, "wb") as f:
        f.write(b"a,b,s\n" + b"".join(b"%d,%d,x\n" % (i, i) for i in range(1, 30)) + body
                + b"".join(b"%d,%d,y\n" % (i, i) for i in range(30, 60)))
    return path


@pytest.mark.parametrize(("body", "problem"), [
    (b'31,31,"unbalanced\n', "not closed on its line"),
    (b"31,31\n", "Expected 3 columns, got 2"),
    (b"31,31,x,extra\n", "Expected 3 columns, got 4"),
    (b"31,\x00,x\n", "conversion error"),
    (b"31,31,\xff\xfe\n", "not valid UTF-8"),
])
@pytest.mark.parametrize("workers", [0, 2])
def test_csv_damage_names_file_and_line(tmp_path: object, body: bytes, problem: str, workers: int) -> None:
    path = _csv(tmp_path, body)
    with pytest.raises(SourceError) as info:
        list(naiad.DataLoader(naiad.read_csv(path, block_bytes=128), batch_size=8, num_workers=workers, worker_mode="process"))
    assert (info.value.path, info.value.line) == (path, 31)
    assert problem in str(info.value)
    # Skipped instead, the damage costs its own line and no other.
    src = naiad.read_csv(path, block_bytes=128, on_bad_rows="skip")
    assert sum(len(b["a"]) for b in naiad.DataLoader(src, batch_size=8)) == 59


@pytest.mark.parametrize("line", [b'{"a": 31, "s": "\xff"}\n', b'{"a": 31, "s": "x"\x00}\n', b'{"a": 31\n'])
def test_jsonl_damage_names_file_and_line(tmp_path: object, line: bytes) -> None:
    path = os.path.join(str(tmp_path), "bad.jsonl")
    rows = [b'{"a": %d, "s": "x"}\n' % i for i in range(1, 61)]
    rows[30] = line
    with open(path, "wb") as f:
        f.write(b"".join(rows))
    with pytest.raises(SourceError) as info:
        list(naiad.DataLoader(naiad.read_jsonl(path, block_bytes=128), batch_size=8))
    assert (info.value.path, info.value.line) == (path, 31)
    src = naiad.read_jsonl(path, block_bytes=128, on_bad_rows="skip")
    assert sum(len(b["a"]) for b in naiad.DataLoader(src, batch_size=8)) == 59


def test_text_invalid_utf8_and_nul_bytes(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "bad.txt")
    lines = [b"line %d" % i for i in range(60)]
    lines[9] = b"nul \x00 inside"  # a NUL is a character like any other
    lines[40] = b"not \xc3\x28 utf-8"
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    with pytest.raises(SourceError) as info:
        list(naiad.DataLoader(naiad.read_text(path, block_bytes=64), batch_size=8))
    assert (info.value.path, info.value.line) == (path, 41)
    got = [s for b in naiad.DataLoader(naiad.read_text(path, block_bytes=64, on_bad_rows="skip"), batch_size=8) for s in b["text"]]
    assert len(got) == 59 and "nul \x00 inside" in got


@pytest.mark.parametrize("writer", ["parquet", "arrow"])
def test_columnar_file_of_random_bytes_is_a_source_error(tmp_path: object, writer: str) -> None:
    path = os.path.join(str(tmp_path), "noise." + writer)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(4096))
    with pytest.raises(SourceError) as info:
        (naiad.read_parquet if writer == "parquet" else naiad.read_arrow)(path)
    assert info.value.path == path


def test_parquet_with_footer_length_pointing_outside_the_file(tmp_path: object) -> None:
    sink = io.BytesIO()
    pq.write_table(pa.table({"a": np.arange(10)}), sink)
    data = bytearray(sink.getvalue())
    data[-8:-4] = (1 << 30).to_bytes(4, "little")  # the footer's length, before the magic
    path = os.path.join(str(tmp_path), "bad.parquet")
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(SourceError, match="bad.parquet"):
        naiad.read_parquet(path)


# -- a 100 MB line ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_100_mb_line_is_read(tmp_path: object) -> None:
    """One line of 100 MB among short ones: read whole by every line reader, in a few seconds
    (it once took a quadratic scan, and PyArrow refused lines over its 1 MiB parse block)."""
    n = 100 << 20
    cases = {
        "csv": (b"a,s\n1,x\n2,", b"\n3,z\n", naiad.read_csv, "s"),
        "jsonl": (b'{"a":1,"s":"x"}\n{"a":2,"s":"', b'"}\n{"a":3,"s":"z"}\n', naiad.read_jsonl, "s"),
        "txt": (b"x\n", b"\nz\n", naiad.read_text, "text"),
    }
    for suffix, (head, tail, reader, column) in cases.items():
        path = os.path.join(str(tmp_path), "long." + suffix)
        with open(path, "wb") as f:
            f.write(head)
            f.write(b"y" * n)
            f.write(tail)
        values = [v for b in naiad.DataLoader(reader(path), batch_size=2) for v in b[column]]
        assert [len(v) for v in values] == [1, n, 1], suffix
        os.remove(path)
