"""Streaming end to end through WorkerPool: exactly once, determinism, ranks, resume, errors."""

from __future__ import annotations

import functools
import json
import os
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from naiad import sources
from naiad.errors import SourceError, StateError
from naiad.parallel import WorkerPool
from naiad.stream.batches import StreamCounters, StreamOptions, iter_batches, num_batches
from naiad.stream.batching import pack_xy
from naiad.stream.reads import make_handler_factory
from tests.conftest_stream import FORMATS, ids_of, open_numbered, run_epoch, write_numbered


def _ids(batches: list[dict]) -> np.ndarray:
    return np.concatenate([ids_of(b) for b in batches]) if batches else np.zeros(0, np.int64)


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fmt=st.sampled_from(FORMATS),
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    world_size=st.integers(1, 4),
    batch_size=st.integers(1, 8),
    shuffle=st.booleans(),
    buffer_rows=st.integers(1, 20),
    seed=st.integers(0, 1000),
    num_workers=st.sampled_from([0, 1, 3]),
)
def test_every_row_exactly_once_over_ranks_with_equal_batch_counts(fmt, sizes, world_size, batch_size, shuffle, buffer_rows, seed, num_workers):
    # Thread workers here (a process pool per example would be slow); processes are covered below.
    with tempfile.TemporaryDirectory() as d:
        src = open_numbered(write_numbered(d, fmt, sizes), fmt)
        per_rank = []
        for rank in range(world_size):
            opts = StreamOptions(batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer=buffer_rows,
                                 rank=rank, world_size=world_size)
            batches = run_epoch(src, opts, num_workers=num_workers, mode="thread")
            assert len(batches) == num_batches(src, opts)
            per_rank.append(batches)
        assert len({len(b) for b in per_rank}) == 1
        ids = np.concatenate([_ids(b) for b in per_rank])
        assert sorted(ids.tolist()) == list(range(sum(sizes)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_workers,mode", [(2, "process"), (3, "thread")])
def test_same_batches_whatever_the_workers(tmp_path, fmt, num_workers, mode):
    # Uneven files, an empty one, and (for 3 workers) fewer files than workers.
    src = open_numbered(write_numbered(str(tmp_path), fmt, [37, 0, 5]), fmt)
    opts = StreamOptions(batch_size=4, shuffle=True, seed=11, shuffle_buffer=6, rank=1, world_size=2)
    inline = _ids(run_epoch(src, opts))
    parallel = _ids(run_epoch(src, opts, num_workers=num_workers, mode=mode))
    assert np.array_equal(inline, parallel)
    other = _ids(run_epoch(src, StreamOptions(batch_size=4, shuffle=True, seed=11, shuffle_buffer=6, rank=0, world_size=2),
                           num_workers=num_workers, mode=mode))
    assert sorted(np.concatenate([inline, other]).tolist()) == list(range(42))


def test_one_file_shuffles_within_itself(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [300]), "csv")
    ids = _ids(run_epoch(src, StreamOptions(batch_size=10, shuffle=True, shuffle_buffer=30)))
    assert sorted(ids.tolist()) == list(range(300)) and not np.array_equal(ids, np.arange(300))


def test_new_epoch_new_order_same_seed_same_order(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "parquet", [200, 100]), "parquet")
    opts = StreamOptions(batch_size=16, shuffle=True, seed=3, shuffle_buffer=20)
    e0, e0_again, e1 = (_ids(run_epoch(src, opts, epoch=e)) for e in (0, 0, 1))
    assert np.array_equal(e0, e0_again)
    assert not np.array_equal(e0, e1)


def test_no_shuffle_is_file_order(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "jsonl", [20, 13]), "jsonl")
    assert _ids(run_epoch(src, StreamOptions(batch_size=5))).tolist() == list(range(33))


def test_batches_are_column_dicts_of_tensors_and_lists(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("f1,f2,name,label\n" + "".join(f"{i},{i / 2},n{i},{i % 2}\n" for i in range(10)))
    batch = run_epoch(sources.read_csv(str(p)), StreamOptions(batch_size=4))[0]
    assert list(batch) == ["f1", "f2", "name", "label"]
    assert batch["f1"].dtype == torch.int64 and batch["f2"].dtype == torch.float64
    assert batch["name"] == ["n0", "n1", "n2", "n3"]


def test_pack_xy_makes_x_and_y_for_the_tutorial_case(tmp_path):
    p = tmp_path / "diabetes.csv"
    p.write_text("a,b,Outcome\n" + "".join(f"{i},{i / 2},{i % 2}\n" for i in range(10)))
    opts = StreamOptions(batch_size=4, transform=pack_xy(label="Outcome"))
    batch = run_epoch(sources.read_csv(str(p)), opts)[0]
    assert batch["x"].shape == (4, 2) and batch["x"].dtype == torch.float32
    assert batch["y"].tolist() == [0, 1, 0, 1]
    last = pack_xy()({"a": torch.ones(2), "y": torch.zeros(2)})  # label = last column
    assert last["x"].shape == (2, 1)


def test_drop_last_yields_only_full_batches_on_every_rank(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "npy", [23]), "npy")
    for rank in range(2):
        opts = StreamOptions(batch_size=5, drop_last=True, shuffle=True, rank=rank, world_size=2)
        batches = run_epoch(src, opts)
        assert [len(ids_of(b)) for b in batches] == [5, 5]


def test_a_rank_with_no_rows_yields_empty_batches(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [1]), "csv")
    counts = [[len(ids_of(b)) for b in run_epoch(src, StreamOptions(batch_size=2, rank=r, world_size=2))] for r in range(2)]
    assert counts == [[0], [1]]


@pytest.mark.timeout(60)
def test_bad_row_in_a_worker_raises_source_error_in_the_training_process(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n" + "".join(f"{i},{i}\n" for i in range(100)) + "5,x\n")
    src = sources.read_csv(str(p), block_bytes=64)
    with pytest.raises(SourceError, match="line 102") as info:
        run_epoch(src, StreamOptions(batch_size=8, shuffle=True), num_workers=2)
    assert info.value.path == str(p) and info.value.line == 102


def test_skipped_rows_are_counted_and_batch_count_is_kept(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n" + "".join(f"{i},{i}\n" if i % 10 else f"{i},oops\n" for i in range(100)))
    src = sources.read_csv(str(p), block_bytes=64, on_bad_rows="skip")
    opts = StreamOptions(batch_size=8, shuffle=True)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    counters = StreamCounters()
    batches = list(iter_batches(src, opts, epoch=0, imap=pool.imap, counters=counters))
    assert len(batches) == num_batches(src, opts) == 13
    assert counters.bad_rows == 10 and counters.bad_rows_by_file == {str(p): 10}
    assert sum(len(b["a"]) for b in batches) == 90
    assert sorted(torch.cat([b["a"] for b in batches]).tolist()) == [i for i in range(100) if i % 10]


def _resumed_after(k: int, src, opts: StreamOptions, epoch: int, pool: WorkerPool) -> list[np.ndarray]:
    """The ids of the batches a stream yields when resumed from its JSON state after ``k`` batches."""
    stream = iter_batches(src, opts, epoch=epoch, imap=pool.imap)
    for _ in range(k):
        next(stream)
    state = json.loads(json.dumps(stream.get_state()))
    stream.close()
    return [ids_of(b) for b in iter_batches(src, opts, epoch=epoch, imap=pool.imap, state=state)]


@pytest.mark.parametrize("shuffle,drop_last,world_size,buffer", [
    (False, False, 1, 9), (True, False, 1, 9), (True, True, 2, 9), (False, True, 3, 9),
    (True, False, 1, 3), (True, True, 2, 3),  # blocks of 7 rows: exchanges of the whole buffer
])
@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy"])
def test_resume_mid_epoch_gives_the_same_remaining_batches(tmp_path, fmt, shuffle, drop_last, world_size, buffer):
    src = open_numbered(write_numbered(str(tmp_path), fmt, [61, 40]), fmt)
    opts = StreamOptions(batch_size=7, shuffle=shuffle, seed=5, shuffle_buffer=buffer, drop_last=drop_last,
                         rank=world_size - 1, world_size=world_size)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    full = [ids_of(b) for b in iter_batches(src, opts, epoch=2, imap=pool.imap)]
    for k in sorted({0, 1, min(5, len(full)), max(len(full) - 1, 0), len(full)}):
        rest = _resumed_after(k, src, opts, 2, pool)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:], strict=True):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_resume_through_threaded_and_drawn_ahead_exchanges(tmp_path, monkeypatch, fmt):
    # Every exchange split across two threads, the next whole-buffer one drawn while the helper
    # works: resuming must still continue exactly.
    import naiad.stream.shuffle as shuffle_module

    monkeypatch.setattr(shuffle_module, "_SPLIT_MIN_VALUES", 1)
    src = open_numbered(write_numbered(str(tmp_path), fmt, [61, 40], chunk_rows=20), fmt)
    opts = StreamOptions(batch_size=7, shuffle=True, seed=9, shuffle_buffer=6)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    full = [ids_of(b) for b in iter_batches(src, opts, epoch=1, imap=pool.imap)]
    assert sorted(np.concatenate(full).tolist()) == list(range(101))
    for k in (1, 4, len(full) - 1):
        rest = _resumed_after(k, src, opts, 1, pool)
        assert [a.tolist() for a in rest] == [b.tolist() for b in full[k:]]


def test_set_state_resumes_and_is_refused_once_started(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "npy", [40]), "npy")
    opts = StreamOptions(batch_size=4, shuffle=True, shuffle_buffer=5)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    first = iter_batches(src, opts, epoch=0, imap=pool.imap)
    head = [ids_of(next(first)) for _ in range(3)]
    resumed = iter_batches(src, opts, epoch=0, imap=pool.imap)
    resumed.set_state(first.get_state())
    got = [ids_of(next(resumed))]
    with pytest.raises(StateError, match="after iteration started"):
        resumed.set_state(first.get_state())
    got += [ids_of(b) for b in resumed]
    rest = [ids_of(b) for b in first]
    assert [b.tolist() for b in got] == [b.tolist() for b in rest]
    assert sorted(np.concatenate(head + rest).tolist()) == list(range(40))


def test_resume_rejects_another_seed_or_other_data(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "npy", [30]), "npy")
    opts = StreamOptions(batch_size=4, shuffle=True, rank=0, world_size=2)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    stream = iter_batches(src, opts, epoch=0, imap=pool.imap)
    next(stream)
    state = stream.get_state()
    with pytest.raises(StateError, match="'seed': stored 0, current 1"):
        iter_batches(src, StreamOptions(batch_size=4, shuffle=True, seed=1), epoch=0, imap=pool.imap, state=state)
    other = open_numbered(write_numbered(str(tmp_path / "x") if os.makedirs(tmp_path / "x") is None else "", "npy", [31]), "npy")
    with pytest.raises(StateError, match="'total_rows': stored 30, current 31"):
        iter_batches(other, opts, epoch=0, imap=pool.imap, state=state)


@pytest.mark.timeout(60)
def test_breaking_out_of_an_epoch_leaves_the_pool_usable(tmp_path):
    src = open_numbered(write_numbered(str(tmp_path), "csv", [200]), "csv")
    opts = StreamOptions(batch_size=4, shuffle=True, shuffle_buffer=10)
    with WorkerPool(make_handler_factory(src), num_workers=2, mode="thread") as pool:
        imap = functools.partial(pool.imap, prefetch=2)
        stream = iter_batches(src, opts, epoch=0, imap=imap)
        next(stream)
        stream.close()
        assert sorted(_ids(list(iter_batches(src, opts, epoch=1, imap=imap))).tolist()) == list(range(200))


def test_rank_and_world_size_come_from_torch_distributed_when_initialised(tmp_path, monkeypatch):
    # The environment (torchrun's RANK, WORLD_SIZE) is not read: as given, else torch.distributed's.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert StreamOptions(batch_size=2).topology() == (0, 1)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    assert StreamOptions(batch_size=2).topology() == (1, 3)
    assert StreamOptions(batch_size=2, rank=0, world_size=1).topology() == (0, 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_dataloader_streams_a_source_exactly_once_per_rank(tmp_path, mode):
    import naiad

    src = open_numbered(write_numbered(str(tmp_path), "csv", [50, 0, 27]), "csv")
    per_rank = []
    for rank in range(3):
        loader = naiad.DataLoader(src, batch_size=4, shuffle=True, seed=1, shuffle_buffer=8, num_workers=2,
                                  worker_mode=mode, rank=rank, world_size=3)
        per_rank.append([ids_of(b) for b in loader])
        assert len(per_rank[-1]) == len(loader)
    assert len({len(b) for b in per_rank}) == 1
    assert sorted(np.concatenate([np.concatenate(b) for b in per_rank]).tolist()) == list(range(77))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_same_dtype_columns_stay_aligned_through_the_buffer_and_resume(tmp_path, num_workers):
    # id, twice and thrice share a dtype, so they travel as one (rows, 3) matrix.
    p = tmp_path / "d.csv"
    p.write_text("id,half,twice,name,thrice\n" + "".join(f"{i},{i / 2},{2 * i},n{i},{3 * i}\n" for i in range(500)))
    src = sources.read_csv(str(p), block_bytes=256)
    opts = StreamOptions(batch_size=16, shuffle=True, seed=4, shuffle_buffer=40)
    with WorkerPool(make_handler_factory(src), num_workers=num_workers) as pool:
        stream = iter_batches(src, opts, epoch=0, imap=pool.imap)
        head = [next(stream) for _ in range(7)]
        tail = list(iter_batches(src, opts, epoch=0, imap=pool.imap, state=stream.get_state()))
    stream.close()
    batches = head + tail
    assert list(batches[0]) == ["id", "half", "twice", "name", "thrice"]
    ids = torch.cat([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(500))
    for b in batches:
        assert b["twice"].is_contiguous()
        assert torch.equal(b["twice"], 2 * b["id"]) and torch.equal(b["thrice"], 3 * b["id"])
        assert torch.equal(b["half"], b["id"] / 2) and b["name"] == [f"n{i}" for i in b["id"].tolist()]


def test_golden_order_of_a_small_shuffled_stream(tmp_path):
    # Frozen: a change to the plan (the stratified block order) or the buffer's draws changes
    # every user's order.
    src = open_numbered(write_numbered(str(tmp_path), "npy", [60]), "npy")
    batches = run_epoch(src, StreamOptions(batch_size=6, shuffle=True, seed=123, shuffle_buffer=10))
    assert [ids_of(b).tolist() for b in batches[:2]] == [[58, 57, 56, 6, 9, 7], [8, 20, 22, 59, 55, 53]]
    # Small CSV blocks joined into read groups of half the buffer (plan.group_rows).
    (tmp_path / "grouped").mkdir()
    src = open_numbered(write_numbered(str(tmp_path / "grouped"), "csv", [200]), "csv")
    batches = run_epoch(src, StreamOptions(batch_size=6, shuffle=True, seed=123, shuffle_buffer=40))
    assert [ids_of(b).tolist() for b in batches[10:12]] == [[127, 168, 54, 167, 57, 195], [100, 98, 99, 123, 188, 80]]


def test_resume_after_skipped_rows_in_the_window_is_exact(tmp_path):
    # Skipped rows keep their positions (NOTE [ Bad rows keep their positions ]): the rows the
    # buffer held, bad ones among them, are restored in place and the rest of the epoch is the same.
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n" + "".join(f"{i},{i}\n" if i % 10 else f"{i},oops\n" for i in range(100)))
    src = sources.read_csv(str(p), block_bytes=64, on_bad_rows="skip")
    opts = StreamOptions(batch_size=8, shuffle=True, shuffle_buffer=9)
    pool = WorkerPool(make_handler_factory(src), num_workers=0)
    whole = [b["a"].tolist() for b in iter_batches(src, opts, epoch=0, imap=pool.imap)]
    stream = iter_batches(src, opts, epoch=0, imap=pool.imap)
    for _ in range(3):
        next(stream)
    state = json.loads(json.dumps(stream.get_state()))
    assert state["bad_rows"]["skipped"] > 0 and state["bad_rows"]["ledger"]["total"] == state["bad_rows"]["skipped"]
    counters = StreamCounters()
    rest = [b["a"].tolist() for b in iter_batches(src, opts, epoch=0, imap=pool.imap, state=state, counters=counters)]
    assert rest == whole[3:]
    assert counters.bad_rows == 10  # counted once each: before the state, or after it


def test_resume_rejects_another_block_layout_and_accepts_a_state_without_one(tmp_path):
    import naiad

    path = write_numbered(str(tmp_path), "csv", [400])

    def make(block_bytes: int) -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_csv(path, block_bytes=block_bytes), batch_size=16, shuffle=True, seed=2,
                                shuffle_buffer=64)

    loader = make(300)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    other = make(500)
    with pytest.raises(StateError, match=r"'blocks': stored \d+, current \d+.*block_bytes"):
        other.load_state_dict(state)
        next(iter(other))
    # A state from before the block count was recorded still loads (the layout is assumed).
    old = json.loads(json.dumps(state).replace('"blocks": ', '"blocks_": '))
    same = make(300)
    same.load_state_dict(old)
    expected = [ids_of(b).tolist() for b in it]
    assert [ids_of(b).tolist() for b in same] == expected
