"""Batcher: row chunks of any sizes cut into the planned batch sizes, in order, every row once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.device.tree import count_rows
from naiad.stream.batching import Batcher, to_torch


def chunk(lo: int, hi: int) -> dict[str, np.ndarray]:
    ids = np.arange(lo, hi)
    return {"id": ids, "x": np.stack([ids, -ids], axis=1).astype(np.float32)}


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.integers(0, 40), min_size=0, max_size=12), batch=st.integers(1, 17))
def test_batches_are_the_rows_in_order_whatever_the_chunks(chunks: list[int], batch: int) -> None:
    total = sum(chunks)
    sizes = np.array([batch] * (total // batch) + ([total % batch] if total % batch else []), np.int64)
    b = Batcher(sizes, 0, chunk(0, 0), batch)
    out, pos = [], 0
    for n in chunks:
        b.add(chunk(pos, pos + n))
        pos += n
        out += list(b.ready())
    out += list(b.finish())
    assert [len(o["id"]) for o in out] == sizes.tolist()
    ids = np.concatenate([o["id"] for o in out]) if out else np.zeros(0, np.int64)
    assert ids.tolist() == list(range(total))
    for o in out:  # the columns stay aligned row by row
        assert np.array_equal(o["x"][:, 0], o["id"].astype(np.float32))
    assert b.done and b.rows == 0


def test_rows_skipped_as_bad_make_the_last_batches_short_not_missing() -> None:
    b = Batcher(np.array([4, 4, 4]), 0, chunk(0, 0), 4)
    b.add(chunk(0, 3))
    b.add(chunk(3, 9))  # 9 rows where 12 were planned
    ready = list(b.ready())
    assert [o["id"].tolist() for o in ready] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    last = list(b.finish())
    assert [o["id"].tolist() for o in last] == [[8]]
    assert b.done


def test_a_resumed_batcher_starts_at_its_batch() -> None:
    b = Batcher(np.array([2, 3, 5]), 1, chunk(0, 0), 2)
    b.add(chunk(0, 8))
    assert [o["id"].tolist() for o in b.ready()] == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert b.done


def test_to_torch_shares_writable_arrays_and_copies_read_only_ones() -> None:
    writable = np.arange(4.0)
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    out = to_torch({"a": writable, "b": frozen, "s": np.array(["p", "q"], dtype=object), "t": np.arange(8.0)[::2]})
    assert out["a"].data_ptr() == writable.ctypes.data
    assert out["b"].data_ptr() != frozen.ctypes.data and out["b"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out["s"] == ["p", "q"]
    assert out["t"].tolist() == [0.0, 2.0, 4.0, 6.0] and out["t"].is_contiguous()


@pytest.mark.parametrize(("batch", "rows"), [
    ({"x": torch.zeros(5, 3), "y": torch.zeros(5)}, 5),
    ({"text": ["a", "b"], "x": torch.zeros(2)}, 2),
    ({"x": torch.tensor(1.0)}, 1),
    ({"nested": {"x": torch.zeros(7)}}, 7),
    ({}, None),
])
def test_count_rows_of_dict_batches(batch: dict, rows: int | None) -> None:
    assert count_rows(batch) == rows
