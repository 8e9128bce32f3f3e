"""A batch's windows of one object as few range requests (NOTE [ Remote windows ] in
naiad/tokens/remote.py): every window's bytes right, in the batch's order, whatever the offsets
(duplicates, overlaps, any order), nearby windows in one request, a new one past a run boundary.
An object shorter than listed: tests/integration/test_tokens.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.tokens import remote
from naiad.tokens.remote import GAP_BYTES, RUN_BYTES, read_remote_rows

SIZE = 3 * RUN_BYTES + 12345


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("remote") / "tokens.bin"
    path.write_bytes(data)
    return str(path), data


def spans_read(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    real = remote.storage.read_range

    def counted(path: str, start: int, stop: int, **kw: object) -> bytes:
        seen.append((start, stop))
        return real(path, start, stop, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(remote.storage, "read_range", counted)
    return seen


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, SIZE - 2050), min_size=1, max_size=40), st.sampled_from([2, 8, 2050]))
def test_every_window_reads_its_bytes_in_the_batch_order(blob: tuple[str, bytes], offsets: list[int], row: int) -> None:
    path, data = blob
    out = np.empty((len(offsets), row), np.uint8)
    read_remote_rows(path, None, np.array(offsets, np.int64), out)
    assert [bytes(r) for r in out] == [data[o:o + row] for o in offsets]


def test_nearby_windows_share_a_request_and_a_new_one_starts_past_a_run_boundary(blob, monkeypatch) -> None:
    path, data = blob
    seen = spans_read(monkeypatch)
    nbytes = 4 * 1025
    # a run of overlapping windows (token windows share their last token), a duplicate, one just
    # within the gap, one past it, and one across the first run boundary
    end = 1000 + 8 * 1024 + nbytes
    within = end + GAP_BYTES
    past = within + nbytes + GAP_BYTES + 1
    offsets = [1000, 1000 + 4 * 1024, 1000 + 8 * 1024, 1000, within, past, RUN_BYTES - 10, RUN_BYTES + 500]
    out = np.empty((len(offsets), 1025), np.uint32)
    read_remote_rows(path, None, np.array(offsets, np.int64), out)
    assert [out[j].tobytes() for j in range(len(offsets))] == [data[o:o + nbytes] for o in offsets]
    assert sorted(seen) == [(1000, within + nbytes), (past, past + nbytes),
                            (RUN_BYTES - 10, RUN_BYTES - 10 + nbytes), (RUN_BYTES + 500, RUN_BYTES + 500 + nbytes)]

