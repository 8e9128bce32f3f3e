"""The shuffle buffer: a permutation, deterministic, well mixed, resumable by replay."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.errors import ConfigError
from naiad.stream.shuffle import (
    PERMUTATION_MIN_SLOTS,
    ShuffleBuffer,
    draw_order,
    draw_slots,
    shuffle_quality,
)


def _run(capacity: int, chunks: list[int], seed: int) -> np.ndarray:
    buf = ShuffleBuffer(capacity, np.random.default_rng(seed))
    out, start = [], 0
    for n in chunks:
        ids = np.arange(start, start + n)
        start += n
        out += [c["id"] for c in buf.push({"id": ids, "s": ids.astype(str).astype(object)})]
    last = buf.flush()
    if last:
        out.append(last["id"])
    return np.concatenate(out) if out else np.zeros(0, int)


@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 50), chunks=st.lists(st.integers(0, 120), max_size=10), seed=st.integers(0, 99))
def test_buffer_output_is_a_permutation_of_its_input(capacity, chunks, seed):
    assert sorted(_run(capacity, chunks, seed).tolist()) == list(range(sum(chunks)))


def test_buffer_is_deterministic_per_generator_seed():
    assert np.array_equal(_run(100, [64] * 20, 5), _run(100, [64] * 20, 5))
    assert not np.array_equal(_run(100, [64] * 20, 5), _run(100, [64] * 20, 6))


def test_buffer_keeps_every_column_aligned():
    buf = ShuffleBuffer(10, np.random.default_rng(0))
    ids = np.arange(50)
    chunks = buf.push({"id": ids, "twice": ids * 2, "m": np.stack([ids, -ids], 1)}) + [buf.flush()]
    for c in chunks:
        assert np.array_equal(c["twice"], c["id"] * 2)
        assert np.array_equal(c["m"][:, 1], -c["id"])


def test_buffer_of_one_percent_mixes_a_block_ordered_stream():
    # 100k rows in blocks of 250 (already block-permuted upstream: here in file order, the
    # hardest case for the buffer alone), buffer = 1% of the rows.
    order = _run(1000, [250] * 400, 0)
    q = shuffle_quality(order)
    assert q["neighbour_share"] < 0.01  # file order: 1.0
    window = order[:1000]
    assert np.unique(window // 250).size > 5  # the first thousand rows come from many blocks


def test_quality_of_file_order_and_of_a_uniform_shuffle():
    n = 10_000
    assert shuffle_quality(np.arange(n))["position_correlation"] == pytest.approx(1.0)
    q = shuffle_quality(np.random.default_rng(0).permutation(n))
    assert abs(q["position_correlation"]) < 0.05 and q["neighbour_share"] < 0.01
    assert q["mean_displacement"] == pytest.approx(1 / 3, abs=0.02)


def test_buffer_rejects_a_capacity_below_one():
    with pytest.raises(ConfigError, match="`shuffle_buffer` must be >= 1, got 0"):
        ShuffleBuffer(0, np.random.default_rng(0))


def test_multidimensional_columns_keep_rows_whole_and_aligned() -> None:
    buf = ShuffleBuffer(64, np.random.default_rng(3))
    out = []
    for start in range(0, 1000, 37):
        ids = np.arange(start, min(start + 37, 1000))
        x = np.stack([ids * 10 + k for k in range(5)], axis=1).astype(np.float32).reshape(-1, 5, 1)
        out += buf.push({"id": ids, "x": x})
    out.append(buf.flush())
    ids = np.concatenate([c["id"] for c in out])
    x = np.concatenate([c["x"] for c in out])
    assert sorted(ids.tolist()) == list(range(1000))
    expected = (ids[:, None] * 10 + np.arange(5)).astype(np.float32)[:, :, None]
    assert np.array_equal(x, expected)


def _mixed_columns(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "id": ids,
        "f32": ids.astype(np.float32) / 3,
        "flag": ids % 3 == 0,
        "when": ids.astype("datetime64[s]"),
        "x": np.stack([ids, -ids], axis=1).astype(np.float64),
        "s": ids.astype(str).astype(object),
    }


@pytest.mark.parametrize("chunk", [4096, 500])  # exchanges that warm the slots, and that do not
def test_warming_the_slots_changes_no_value_and_no_order(monkeypatch, chunk):
    import naiad.stream.shuffle as shuffle

    def run() -> list[dict[str, np.ndarray]]:
        buf = ShuffleBuffer(8192, np.random.default_rng(11))
        out = []
        for start in range(0, 40_000, chunk):
            out += buf.push(_mixed_columns(np.arange(start, min(start + chunk, 40_000))))
        return out + [buf.flush()]

    monkeypatch.setattr(shuffle, "_WARM_MAX_BYTES", 1 << 30)  # every numeric column warmed
    warmed = run()
    monkeypatch.setattr(shuffle, "_WARM_MAX_BYTES", 0)  # none
    cold = run()
    assert len(warmed) == len(cold)
    for a, b in zip(warmed, cold, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(a[name], b[name]), name
    ids = np.concatenate([c["id"] for c in warmed])
    assert sorted(ids.tolist()) == list(range(40_000))


def test_cache_sizes_are_read_from_sysfs_or_defaulted(tmp_path):
    from naiad.stream.shuffle import _cache_bytes, _l2_cache_bytes, warm_max_bytes

    for name, level, size in [("index0", "1", "48K"), ("index2", "2", "2048K"), ("index3", "3", "260M")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")
    assert _l2_cache_bytes(str(tmp_path)) == 2 << 20
    assert _cache_bytes(3, str(tmp_path)) == 260 << 20
    assert warm_max_bytes(str(tmp_path)) == (260 << 20) // 8  # an eighth of the L3: more than half the L2
    assert _l2_cache_bytes(str(tmp_path / "missing"), default=12345) == 12345
    assert warm_max_bytes(str(tmp_path / "missing")) == 512 << 10  # no L3 known: half the default L2
    (tmp_path / "index3" / "size").write_text("2048K\n")
    assert warm_max_bytes(str(tmp_path)) == 1 << 20  # a small L3: half the L2
    (tmp_path / "index2" / "size").write_text("lots\n")
    assert _l2_cache_bytes(str(tmp_path), default=7) == 7


def _reference_exchange(capacity: int, chunks: list[int], seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The classic streaming shuffle written plainly: draw slots, emit their rows, put new rows there."""
    rng = np.random.default_rng(seed)
    slots, size, out, start = np.zeros(capacity, np.int64), 0, [], 0
    key = lambda: np.random.SeedSequence(int(rng.integers(2**63)))  # noqa: E731 - the buffer's seed per draw
    for n in chunks:
        ids = np.arange(start, start + n)
        start += n
        take = min(capacity - size, n)
        slots[size : size + take] = ids[:take]
        size += take
        for pos in range(take, n, capacity):
            m = min(capacity, n - pos)
            idx = draw_slots(capacity, m, key())
            out.append(slots[idx].copy())
            slots[idx] = ids[pos : pos + m]
    held = slots[:size].copy()
    out.append(slots[:size][draw_order(size, key())])
    return out, held


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 40), chunks=st.lists(st.integers(0, 130), max_size=8), seed=st.integers(0, 99))
def test_whole_buffer_exchanges_emit_what_the_plain_exchange_emits(capacity, chunks, seed):
    # Chunks of `capacity` rows or more skip the scatter and remap the slots instead: the rows,
    # their order and the slots' contents must match the plain exchange's exactly.
    expected, expected_held = _reference_exchange(capacity, chunks, seed)
    buf = ShuffleBuffer(capacity, np.random.default_rng(seed))
    got, start = [], 0
    for n in chunks:
        ids = np.arange(start, start + n)
        start += n
        got += buf.push({"id": ids, "x": np.stack([ids, -ids], 1).astype(np.float32), "s": ids.astype(str).astype(object)})
    held = buf.held()
    assert np.array_equal(held.get("id", np.zeros(0, np.int64)), expected_held)
    got.append(buf.flush())
    got_ids = [c["id"] for c in got if c]
    assert np.array_equal(np.concatenate(got_ids) if got_ids else np.zeros(0, np.int64), np.concatenate(expected))
    for c in got:
        if c:
            assert np.array_equal(c["x"][:, 1], -c["id"].astype(np.float32))
            assert c["s"].tolist() == c["id"].astype(str).tolist()


def test_big_exchanges_split_across_threads_and_drawn_ahead_match_the_plain_exchange():
    # Chunks big enough to split the columns across two threads, several whole-buffer exchanges
    # per push (the next one drawn while the helper works), and partial ones between them.
    capacity, chunks = 20_000, [50_000, 70_000, 20_000, 45_000, 7]
    expected, expected_held = _reference_exchange(capacity, chunks, 3)
    buf = ShuffleBuffer(capacity, np.random.default_rng(3))
    got, start = [], 0
    for n in chunks:
        got += buf.push(_mixed_columns(np.arange(start, start + n)))
        start += n
    assert np.array_equal(buf.held()["id"], expected_held)
    got.append(buf.flush())
    ids = np.concatenate([c["id"] for c in got])
    assert np.array_equal(ids, np.concatenate(expected))
    for c in got:
        assert np.array_equal(c["f32"], c["id"].astype(np.float32) / 3)
        assert np.array_equal(c["x"], np.stack([c["id"], -c["id"]], axis=1).astype(np.float64))
        assert np.array_equal(c["when"], c["id"].astype("datetime64[s]"))
        assert c["s"].tolist() == c["id"].astype(str).tolist()


def _forward_replay(capacity: int, keys: tuple[int, ...], sizes: list[int], start: int):
    """What a keyed buffer holds and owes once the exchange that emits row ``start`` is made, by
    pushing the positions one exchange at a time (the simple, slow way)."""
    buf = ShuffleBuffer(capacity, keys)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    emitted, owed, filled = 0, [], 0
    for k in range(len(sizes)):
        a, n = int(offsets[k]), int(sizes[k])
        p = min(capacity - filled, n)
        filled += p
        buf.push({"p": np.arange(a, a + p)})
        while p < n:
            m = min(capacity, n - p)
            (chunk,) = buf.push({"p": np.arange(a + p, a + p + m)})
            p += m
            emitted += m
            if emitted > start:
                owed.append(chunk["p"][max(0, m - (emitted - start)):])
            if emitted >= start:
                owed_rows = np.concatenate(owed) if owed else np.zeros(0, np.int64)
                return buf.held().get("p", np.zeros(0, np.int64)), owed_rows, a + p, buf.draws
    flushed = buf.flush().get("p", np.zeros(0, np.int64))
    return np.zeros(0, np.int64), np.concatenate([*owed, flushed[max(0, start - emitted):]]), int(offsets[-1]), buf.draws


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 30), sizes=st.lists(st.integers(1, 70), min_size=1, max_size=12),
       seed=st.integers(0, 50), data=st.data())
def test_backward_replay_of_the_draws_matches_pushing_every_chunk(capacity, sizes, seed, data):
    from naiad.stream.replay import _replay_draws

    start = data.draw(st.integers(1, sum(sizes)))
    keys = (seed, 1, 0, 1, 0)
    held, owed, consumed, draws = _replay_draws(capacity, keys, np.concatenate(([0], np.cumsum(sizes))), start)
    f_held, f_owed, f_consumed, f_draws = _forward_replay(capacity, keys, sizes, start)
    assert consumed == f_consumed and draws == f_draws
    assert held.tolist() == f_held.tolist()
    assert owed.tolist() == f_owed.tolist()


def test_backward_replay_cost_does_not_grow_with_the_position(monkeypatch):
    # A million-row epoch in 1,000-row chunks through a 5,000-row buffer: the draws made again
    # to resume near its end are those of about capacity * ln(capacity) rows, not the epoch's.
    import naiad.stream.replay as replay_module

    calls = []
    real = replay_module.draw_key

    def counting(keys, j):
        calls.append(j)
        return real(keys, j)

    monkeypatch.setattr(replay_module, "draw_key", counting)
    replay_module._replay_draws(5000, (0, 0, 0, 1, 0), np.arange(0, 1_000_001, 1000), 990_000)
    assert len(calls) < 5000 * np.log(5000) / 1000 * 2  # ~43 expected, versus ~1,000 forwards


@pytest.mark.parametrize("start", [70_000, 150_001, 260_000, 407_000])
def test_backward_replay_through_the_keyed_permutation_matches_pushing_every_chunk(monkeypatch, start):
    # A buffer big enough to draw from the keyed permutation: the walk asks it about the slots
    # left once they are fewer than an exchange draws (chunks smaller and bigger than the buffer).
    import naiad.stream.replay as replay_module

    asked = []
    from naiad.order.permutation import Permutation

    real = Permutation.inverse

    def inverse(self, value):
        asked.append(len(value))
        return real(self, value)

    monkeypatch.setattr(Permutation, "inverse", inverse)
    capacity = PERMUTATION_MIN_SLOTS
    sizes = [40_000] * 6 + [5_000, 70_000, 131_072, 17_000, 30_000]
    keys = (3, 0, 0, 1, 0)
    held, owed, consumed, draws = replay_module._replay_draws(capacity, keys, np.concatenate(([0], np.cumsum(sizes))), start)
    f_held, f_owed, f_consumed, f_draws = _forward_replay(capacity, keys, sizes, start)
    assert (consumed, draws) == (f_consumed, f_draws)
    assert np.array_equal(held, f_held) and np.array_equal(owed, f_owed)
    # Only the slots still to place, one by one, once the walk goes back far enough.
    assert bool(asked) == (start > 100_000) and max(asked, default=0) < capacity


def test_draws_of_a_big_buffer_are_distinct_slots_that_differ_by_key():
    capacity = PERMUTATION_MIN_SLOTS + 123
    seed = np.random.SeedSequence
    a, b = draw_slots(capacity, 50_000, seed(1)), draw_slots(capacity, 50_000, seed(2))
    assert len(np.unique(a)) == 50_000 and a.min() >= 0 and a.max() < capacity
    assert np.mean(a == b) < 0.01
    # Each slot is drawn with probability m / capacity over keys; no part of the range favoured.
    hits = np.bincount(np.concatenate([draw_slots(capacity, 6_000, seed(k)) for k in range(200)]) * 16 // capacity, minlength=16)
    assert np.all(np.abs(hits / hits.sum() - 1 / 16) < 0.005)


@pytest.mark.parametrize("capacity", [1000, PERMUTATION_MIN_SLOTS + 77])
def test_draining_in_chunks_emits_what_one_flush_emits(capacity):
    def filled() -> ShuffleBuffer:
        buf = ShuffleBuffer(capacity, (4, 0, 0, 1, 0))
        ids = np.arange(3 * capacity + 5)
        buf.push({"id": ids, "x": np.stack([ids, -ids], 1)})
        return buf

    whole, buf = filled().flush(), filled()
    chunks = list(buf.drain(chunk_rows=999))
    assert buf.size == 0 and buf.held() == {} and buf.flush() == {}  # empty at once
    assert [len(c["id"]) for c in chunks[:-1]] == [999] * (len(chunks) - 1)
    assert np.array_equal(np.concatenate([c["id"] for c in chunks]), whole["id"])
    assert sorted(whole["id"].tolist()) != whole["id"].tolist() and len(whole["id"]) == capacity
    assert all(np.array_equal(c["x"][:, 1], -c["id"]) for c in chunks)
