"""The selected lines of many blocks at once (what a resume parses) are those of each block alone."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.errors import SourceError
from naiad.sources.lines import read_block_bytes, read_selected_lines, scan_file, select_rows

LINES = st.lists(st.sampled_from(["", "\r", "7", "42", "abc", "x,y\r", "1.5,2"]), min_size=1, max_size=60)


def _blocks(text: bytes, block_bytes: int, keep_blank: bool):
    fd, path = tempfile.mkstemp(suffix=".txt")
    with os.fdopen(fd, "wb") as f:
        f.write(text)
    return path, scan_file(path, block_bytes=block_bytes, header_lines=0, compression=None, keep_blank=keep_blank,
                           whole=False)


def _reference(parts, keep_blank: bool) -> bytes:
    return b"".join(select_rows(read_block_bytes(b, None), rows, b.rows, keep_blank)[0] for b, rows in parts)


@settings(max_examples=200, deadline=None)
@given(lines=LINES, final_newline=st.booleans(), crlf=st.booleans(), keep_blank=st.booleans(),
       block_bytes=st.integers(1, 30), data=st.data())
def test_many_blocks_at_once_select_what_each_block_selects(lines, final_newline, crlf, keep_blank, block_bytes, data):
    end = "\r\n" if crlf else "\n"
    text = end.join(lines) + (end if final_newline else "")
    path, blocks = _blocks(text.encode(), block_bytes, keep_blank)
    try:
        parts = []
        for b in blocks:
            if b.rows and data.draw(st.booleans()):
                picked = data.draw(st.lists(st.integers(0, b.rows - 1), min_size=1, unique=True))
                parts.append((b, np.array(sorted(picked), np.int64)))
        if not parts:
            return
        assert read_selected_lines(parts, None, keep_blank) == _reference(parts, keep_blank)
    finally:
        os.unlink(path)


def test_one_byte_rows_and_a_last_line_without_newline(tmp_path):
    path = tmp_path / "digits.txt"
    path.write_bytes(b"".join(b"%d\n" % (i % 10) for i in range(500)) + b"9")
    blocks = scan_file(str(path), block_bytes=64, header_lines=0, compression=None, keep_blank=False, whole=False)
    parts = [(b, np.arange(0, b.rows, 3, dtype=np.int64)) for b in blocks]
    out = read_selected_lines(parts, None, False)
    assert out == _reference(parts, False) and out.endswith(b"\n")
    assert out.count(b"\n") == sum(len(r) for _, r in parts)


def test_a_file_changed_after_its_scan_is_named(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_bytes(b"".join(b"row %d\n" % i for i in range(100)))
    blocks = scan_file(str(path), block_bytes=100, header_lines=0, compression=None, keep_blank=False, whole=False)
    path.write_bytes(b"".join(b"row %d\n\n" % i for i in range(100))[: path.stat().st_size])  # blank lines now
    parts = [(b, np.array([0, b.rows - 1], np.int64)) for b in blocks[:3]]
    with pytest.raises(SourceError, match="the file changed after it was scanned"):
        read_selected_lines(parts, None, False)
