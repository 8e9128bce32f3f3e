"""naiad.DataLoader beyond torch: streaming sources, resumption, device prefetch, telemetry."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import naiad
from naiad.cli.demo_data import diabetes_csv
from naiad.sources import read_csv, read_parquet
from tests.helpers import assert_same_batches

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(diabetes_csv(rows=5003, path=tmp_path_factory.mktemp("data") / "diabetes.csv"))


def _row_ids(batches: list[dict[str, Any]]) -> np.ndarray:
    # Each generated row is unique enough by (Glucose, BMI, Age, Insulin, Pedigree) to identify it.
    cols = ["Glucose", "BMI", "Age", "Insulin", "DiabetesPedigreeFunction"]
    return np.concatenate([np.stack([b[c].double().numpy() for c in cols], axis=1) for b in batches])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streaming_source_every_row_once_same_order_any_workers(diabetes: str, num_workers: int) -> None:
    src = read_csv(diabetes)
    loader = naiad.DataLoader(src, batch_size=128, shuffle=True, seed=5, num_workers=num_workers)
    assert loader.fetch_strategy == "stream"
    batches = list(loader)
    assert len(batches) == len(loader) == -(-5003 // 128)
    rows = _row_ids(batches)
    assert len(rows) == 5003
    reference = _row_ids(list(naiad.DataLoader(src, batch_size=5003)))
    assert sorted(map(tuple, rows)) == sorted(map(tuple, reference))
    assert not np.array_equal(rows, reference)  # shuffled
    serial = _row_ids(list(naiad.DataLoader(src, batch_size=128, shuffle=True, seed=5)))
    assert np.array_equal(rows, serial)


def test_streaming_ranks_split_rows_exactly_once_with_equal_steps(diabetes: str) -> None:
    src = read_csv(diabetes)
    per_rank = [
        list(naiad.DataLoader(src, batch_size=100, shuffle=True, seed=1, rank=r, world_size=3)) for r in range(3)
    ]
    assert len({len(b) for b in per_rank}) == 1  # the same number of steps on every rank
    rows = np.concatenate([_row_ids(b) for b in per_rank])
    assert sorted(map(tuple, rows)) == sorted(map(tuple, _row_ids(list(naiad.DataLoader(src, batch_size=5003)))))


def test_streaming_rejects_map_style_arguments(diabetes: str) -> None:
    with pytest.raises(naiad.ConfigError, match="sampler"):
        naiad.DataLoader(read_csv(diabetes), batch_size=4, sampler=[0, 1])
    with pytest.raises(naiad.ConfigError, match="shuffle_buffer"):
        naiad.DataLoader(TensorDataset(torch.zeros(4)), shuffle_buffer=10)


@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_mid_epoch_exactly(diabetes: str, kind: str, num_workers: int, tmp_path: Any) -> None:
    if kind == "map":
        dataset: Any = TensorDataset(torch.arange(3000), torch.randn(3000, 2))

        def key(b: Any) -> torch.Tensor:
            return b[0]
    else:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        pq.write_table(pacsv.read_csv(diabetes), tmp_path / "d.parquet", row_group_size=700)
        dataset = read_parquet(str(tmp_path / "d.parquet"))

        def key(b: Any) -> torch.Tensor:
            return b["Glucose"]

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(dataset, batch_size=64, shuffle=True, seed=9, num_workers=num_workers)

    loader = make()
    list(loader)  # epoch 0
    it = iter(loader)  # epoch 1, interrupted after 7 batches
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))  # plain JSON
    assert state["epoch"] == 1 and state["batches_yielded"] == 7
    rest, after = list(it), list(loader)
    resumed = make()
    resumed.load_state_dict(state)
    got_rest, got_after = list(resumed), list(resumed)
    assert len(got_rest) == len(rest)
    assert all(torch.equal(key(a), key(b)) for a, b in zip(rest, got_rest, strict=True))
    assert all(torch.equal(key(a), key(b)) for a, b in zip(after, got_after, strict=True))


def test_load_state_dict_refuses_another_seed_or_length() -> None:
    ds = TensorDataset(torch.arange(10))
    state = naiad.DataLoader(ds, batch_size=2, shuffle=True, seed=1).state_dict()
    with pytest.raises(naiad.StateError, match="seed"):
        naiad.DataLoader(ds, batch_size=2, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(naiad.StateError, match="'length': stored 10, current 11"):
        naiad.DataLoader(TensorDataset(torch.arange(11)), batch_size=2, shuffle=True, seed=1).load_state_dict(state)
    naiad.DataLoader(ds, batch_size=3, shuffle=True, seed=1).load_state_dict(state)  # elastic: allowed


def test_device_cpu_prefetches_same_batches_and_records_waits() -> None:
    ds = TensorDataset(torch.randn(500, 4), torch.arange(500))
    expected = list(naiad.DataLoader(ds, batch_size=50, shuffle=True, seed=2))
    loader = naiad.DataLoader(ds, batch_size=50, shuffle=True, seed=2, device="cpu")
    got = list(loader)
    assert_same_batches(expected, got)
    stats = loader.stats()
    assert stats.batches == 10 and stats.rows == 500
    assert "fetch" in stats.stages


def test_stats_count_batches_rows_and_stages(tmp_path: Any) -> None:
    ds = TensorDataset(torch.randn(1000, 3))
    loader = naiad.DataLoader(ds, batch_size=100, num_workers=2)
    list(loader)
    s = loader.stats()
    assert s.batches == 10 and s.rows == 1000
    assert s.wait.total_s > 0 and s.stages["fetch"].count == 10
    trace = json.loads(open(loader.export_trace(tmp_path / "t.json")).read())
    assert any(e.get("name") == "wait" for e in trace["traceEvents"])


def test_transform_runs_on_whole_batches() -> None:
    ds = TensorDataset(torch.arange(10.0))
    seen: list[int] = []

    def double(batch: list[torch.Tensor]) -> torch.Tensor:
        seen.append(len(batch[0]))
        return batch[0] * 2

    out = list(naiad.DataLoader(ds, batch_size=4, transform=double))
    assert seen == [4, 4, 2] and torch.equal(torch.cat(out), torch.arange(10.0) * 2)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_map_style_ranks_every_index_once_equal_steps(shuffle: bool, drop_last: bool) -> None:
    ds = TensorDataset(torch.arange(103))
    kwargs: dict[str, Any] = dict(batch_size=10, shuffle=shuffle, drop_last=drop_last, seed=4 if shuffle else None)
    loaders = [naiad.DataLoader(ds, rank=r, world_size=4, **kwargs) for r in range(4)]
    outs = [list(loader) for loader in loaders]
    assert len({len(o) for o in outs}) == 1 and all(len(o) == len(loader) for o, loader in zip(outs, loaders, strict=True))
    seen = torch.cat([b[0] for o in outs for b in o]).tolist()
    assert len(seen) == len(set(seen))  # never repeated
    if drop_last:
        assert all(len(b[0]) == 10 for o in outs for b in o)
    else:
        assert sorted(seen) == list(range(103))  # never lost
        assert all(len(b[0]) > 0 for o in outs for b in o)
    if shuffle:
        assert seen != sorted(seen)
        again = [list(naiad.DataLoader(ds, rank=r, world_size=4, **kwargs)) for r in range(4)]
        assert all(torch.equal(a[0], b[0]) for o, p in zip(outs, again, strict=True) for a, b in zip(o, p, strict=True))


def test_map_style_ranks_need_a_shared_order() -> None:
    ds = TensorDataset(torch.arange(10))
    with pytest.raises(naiad.ConfigError, match="seed="):
        naiad.DataLoader(ds, batch_size=2, shuffle=True, rank=0, world_size=2)
    with pytest.raises(naiad.ConfigError, match="both"):
        naiad.DataLoader(ds, batch_size=2, rank=0)


def test_map_style_ranks_resume_mid_epoch() -> None:
    ds = TensorDataset(torch.arange(200))
    make = lambda: naiad.DataLoader(ds, batch_size=8, shuffle=True, seed=3, rank=1, world_size=3)  # noqa: E731
    loader = make()
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    rest = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    got = list(resumed)
    assert len(got) == len(rest) and all(torch.equal(a[0], b[0]) for a, b in zip(rest, got, strict=True))


def test_resume_after_skipped_bad_rows_is_exact(tmp_path: Any) -> None:
    path = tmp_path / "bad.csv"
    lines = ["a,b"] + [f"{i},{i * 2}" for i in range(300)]
    lines[5] = "4,not-a-number"
    path.write_text("\n".join(lines) + "\n")
    src = read_csv(str(path), on_bad_rows="skip")
    whole = [b["a"].tolist() for b in naiad.DataLoader(read_csv(str(path), on_bad_rows="skip"), batch_size=10)]
    loader = naiad.DataLoader(src, batch_size=10)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert sum(loader.bad_rows.values()) == 1
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["pipeline"]["bad_rows"]["skipped"] == 1
    resumed = naiad.DataLoader(read_csv(str(path), on_bad_rows="skip"), batch_size=10)
    resumed.load_state_dict(state)
    assert [b["a"].tolist() for b in resumed] == whole[5:]
    assert resumed.bad_rows == {str(path): 1}  # the ledger came with the state


def test_streaming_sources_default_to_thread_workers(diabetes: str) -> None:
    assert naiad.DataLoader(read_csv(diabetes), batch_size=8, num_workers=2).worker_mode == "thread"
    assert naiad.DataLoader(TensorDataset(torch.zeros(4)), num_workers=2).worker_mode == "process"


@pytest.mark.timeout(180)
def test_auto_workers_settles_on_zero_for_in_memory_tensors_and_reports_why() -> None:
    ds = TensorDataset(torch.randn(300_000, 8), torch.arange(300_000))
    loader = naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=0, num_workers="auto")
    seen = torch.cat([b[1] for b in loader])
    assert sorted(seen.tolist()) == list(range(300_000))  # tuning never loses or repeats a batch
    info = loader.stats().workers
    assert info["setting"] == "auto" and info["num_workers"] == 0 and info["reason"]
    expected = torch.cat([b[1] for b in naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=0)])
    assert torch.equal(seen, expected)  # and keeps the plan's order
    loader.close()


def test_auto_workers_refuses_iterable_datasets() -> None:
    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(3))

    with pytest.raises(naiad.ConfigError, match="auto"):
        naiad.DataLoader(Numbers(), num_workers="auto")
    with pytest.raises(naiad.ConfigError, match="auto"):
        naiad.DataLoader(TensorDataset(torch.zeros(3)), num_workers="many")  # type: ignore[arg-type]
