"""read_arrow over damaged Arrow IPC *stream* files (the format ``datasets`` writes) ends in data or
a naiad error naming the file: never another exception, a hang, or a crash of the interpreter
(NOTE [ Stream walk ] in sources/ipc_stream.py); the same with 2 process workers."""

from __future__ import annotations

import io
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import naiad
from tests.fuzz.formats import MUTATIONS, NASTY, ROWS, Format, _table, drain, mutate, write

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=30, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def stream_bytes() -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, _table().schema) as w:
        for b in _table().to_batches(max_chunksize=16):
            w.write_batch(b)
    return sink.getvalue()


STREAM = Format("arrow_stream", ".arrow", stream_bytes, lambda p: naiad.read_arrow(p, index_dir=False))
payloads = st.one_of(st.sampled_from(NASTY), st.binary(min_size=1, max_size=48))


def outcome(data: bytes, *, workers: bool = False) -> int | None:
    with tempfile.TemporaryDirectory() as d:
        path = write(d, STREAM, data)
        inline = drain(STREAM, path)
        if workers:
            assert drain(STREAM, path, num_workers=2) == inline
    return inline


def test_the_undamaged_stream_reads_whole() -> None:
    assert outcome(stream_bytes(), workers=True) == ROWS


@FUZZ
@given(kind=st.sampled_from(MUTATIONS), pos=st.floats(0, 1), payload=payloads)
@example(kind="overwrite", pos=0.0, payload=b"ARROW1")  # a stream's first bytes made a file's magic
def test_a_damaged_stream_gives_data_or_a_naiad_error(kind: str, pos: float, payload: bytes) -> None:
    rows = outcome(mutate(stream_bytes(), kind, pos, payload))
    assert rows is None or rows >= 0


@FUZZ
@given(at=st.integers(0, 400), payload=payloads)
def test_damaged_message_headers_give_data_or_a_naiad_error(at: int, payload: bytes) -> None:
    # The schema and the first record batches' prefixes and metadata: what the walk parses.
    data = stream_bytes()
    rows = outcome(data[:at] + payload + data[at + len(payload):])
    assert rows in (None, ROWS) or rows >= 0


@settings(FUZZ, max_examples=15)
@given(kind=st.sampled_from(MUTATIONS), pos=st.floats(0, 1), payload=payloads)
def test_a_damaged_stream_reads_alike_in_process_workers(kind: str, pos: float, payload: bytes) -> None:
    outcome(mutate(stream_bytes(), kind, pos, payload), workers=True)
