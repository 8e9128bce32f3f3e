"""``naiad check`` and ``naiad.testing.check_coverage``: the dry run is the loader's real order, its
checks pass on sound configurations and fail, with the reason, on broken ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.cli import main
from naiad.testing import check_coverage
from naiad.tools.coverage import Topology, planned_batches
from tests.conftest_stream import ids_of, open_numbered, write_numbered

ROOT = Path(__file__).resolve().parents[2]
SIZES = [23, 0, 41, 17]  # 81 rows; an empty file among them
TOTAL = sum(SIZES)


def _loader(paths: list[str], fmt: str, topo: Topology, rank: int, **kw: Any) -> naiad.DataLoader:
    return naiad.DataLoader(open_numbered(paths, fmt), batch_size=topo.batch_size, shuffle=kw.get("shuffle", True),
                            seed=kw.get("seed", 5), shuffle_buffer=topo.shuffle_buffer, rank=rank,
                            world_size=topo.world_size, drop_last=topo.drop_last, num_workers=topo.num_workers)


def _planned(paths: list[str], fmt: str, topo: Topology, rank: int, **kw: Any) -> list[list[int]]:
    src = open_numbered(paths, fmt)
    return [b.tolist() for b in planned_batches(src, topo, rank, **kw)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize(("world_size", "batch_size", "drop_last", "buffer", "workers"), [
    (1, 8, False, 10, 0), (2, 5, False, 7, 2), (3, 4, True, 16, 0), (4, 6, False, None, 0), (3, 7, True, 5, 2),
])
def test_dry_run_is_the_loaders_order_batch_for_batch(tmp_path, fmt, world_size, batch_size, drop_last, buffer, workers):
    paths = write_numbered(str(tmp_path), fmt, SIZES)
    topo = Topology(world_size, workers, batch_size, drop_last, buffer)
    for epoch in (0, 1):
        for rank in range(world_size):
            loader = _loader(paths, fmt, topo, rank)
            loader.set_epoch(epoch)
            got = [ids_of(b).tolist() for b in loader]
            loader.close()
            assert got == _planned(paths, fmt, topo, rank, epoch=epoch, seed=5), (epoch, rank)


def test_dry_run_takes_the_default_buffer_of_the_source_not_of_its_row_numbers(tmp_path):
    # Three row groups of 60,000 rows: few metadata blocks that fit the budget, so the loader's
    # default buffer holds all 180,000 rows, more than the 131,072 a source of unknown blocks gets.
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"id": np.arange(180_000, dtype=np.int64)}), path, row_group_size=60_000)
    loader = naiad.DataLoader(naiad.read_parquet(str(path)), batch_size=4096, shuffle=True, seed=3)
    got = [ids_of(b) for b in loader]
    planned = planned_batches(naiad.read_parquet(str(path)), Topology(1, batch_size=4096), 0, seed=3)
    assert len(got) == len(planned) and all(np.array_equal(a, b) for a, b in zip(got, planned, strict=True))
    assert np.median([(b.max() - b.min()) / 180_000 for b in planned]) > 0.99  # mixed whole


def test_dry_run_without_shuffle_is_file_order_in_contiguous_ranges(tmp_path):
    paths = write_numbered(str(tmp_path), "csv", SIZES)
    batches = [_planned(paths, "csv", Topology(2, batch_size=10), r, shuffle=False) for r in range(2)]
    assert sum(batches[0], []) == list(range(40)) and sum(batches[1], []) == list(range(40, 81))
    # 5 batches on both ranks: the rank with a row fewer splits its last 10 rows in two
    assert [len(b) for b in batches[0]] == [10, 10, 10, 5, 5]
    assert [len(b) for b in batches[1]] == [10, 10, 10, 10, 1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize(("old", "new", "k"), [
    (Topology(2, 0, 5, False, 9), Topology(3, 2, 4, False, 6), 3),   # elastic 2 -> 3, another batch size
    (Topology(3, 0, 4, False, 12), Topology(2, 0, 4, False, 12), 2),  # elastic 3 -> 2
    (Topology(2, 0, 5, False, 9), Topology(2, 2, 5, False, 9), 4),   # the same topology, more workers
])
def test_dry_run_of_a_resume_is_the_loaders_order(tmp_path, fmt, old, new, k):
    paths = write_numbered(str(tmp_path), fmt, SIZES)
    seen: list[int] = []
    state = None
    for rank in range(old.world_size):
        loader = _loader(paths, fmt, old, rank)
        loader.set_epoch(1)
        it = iter(loader)
        first = [ids_of(next(it)).tolist() for _ in range(k)]
        assert first == _planned(paths, fmt, old, rank, epoch=1, seed=5)[:k]
        seen += sum(first, [])
        if rank == 0:
            state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    for rank in range(new.world_size):
        loader = _loader(paths, fmt, new, rank)
        loader.load_state_dict(state)
        got = [ids_of(b).tolist() for b in loader]
        loader.close()
        assert got == _planned(paths, fmt, new, rank, epoch=1, seed=5, resumed=(old, k)), rank
        seen += sum(got, [])
    assert sorted(seen) == list(range(TOTAL))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize("kw", [
    {"world_size": 3, "batch_size": 4, "epochs": 2},
    {"world_size": 2, "batch_size": 5, "drop_last": True, "shuffle_buffer": 8},
    {"world_size": 2, "batch_size": 5, "epochs": 2, "resume_at": 1.5, "new_world_size": 3, "new_num_workers": 2},
    {"world_size": 3, "batch_size": 4, "resume_at": 0.4, "new_world_size": 2, "new_batch_size": 6, "shuffle": False},
    {"world_size": 2, "batch_size": 3, "drop_last": True, "resume_at": 0.5, "new_shuffle_buffer": 4},
])
def test_check_coverage_passes_sound_configurations(tmp_path, fmt, kw):
    src = open_numbered(write_numbered(str(tmp_path), fmt, SIZES), fmt)
    report = check_coverage(src, num_workers=2, **kw)
    assert report.ok, report.problems
    assert report.total_rows == TOTAL and report.files == 4
    assert len(report.epochs) == kw.get("epochs", 1)
    for e in report.epochs:
        assert e.rows_delivered + e.rows_unused == TOTAL
        assert e.rows_unused == 0 or kw.get("drop_last")
    if "resume_at" in kw:
        resumed = report.epochs[int(kw["resume_at"])]
        assert resumed.resumed_after == int((kw["resume_at"] % 1) * report.batches_per_rank)
        assert any("after the resume" in c and "matched" in c for c in report.stream_checks)
    data = json.loads(json.dumps(report.as_dict()))
    assert data["ok"] is True and data["total_rows"] == TOTAL


def test_quality_figures_tell_file_order_from_a_shuffle(tmp_path):
    paths = write_numbered(str(tmp_path), "parquet", [4000], chunk_rows=100)
    src = naiad.read(paths)
    # File order: the figures of ShuffleQuality's definitions, exactly.
    plain = check_coverage(src, batch_size=10, shuffle=False).quality
    assert plain is not None
    assert (plain.spearman, plain.pearson, plain.worst_rank_spearman, plain.neighbour_share) == (1, 1, 1, 1)
    assert plain.batch_span == 9 / 4000
    # Blocks shuffled, no buffer: the order is far from the file's, but neighbours stay together.
    blocks = check_coverage(src, batch_size=10, shuffle=True, shuffle_buffer=1).quality
    assert blocks is not None and blocks.neighbour_share > 0.95 and blocks.batch_span < 0.01
    mixed = check_coverage(src, world_size=2, batch_size=10, shuffle_buffer=4000)
    q = mixed.quality
    assert q is not None and abs(q.spearman) < 0.2 and q.neighbour_share < 0.02 and q.batch_span > 0.5


# -- the command line ---------------------------------------------------------------------------


def naiad_check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "naiad", "check", *args], capture_output=True, text=True,
                          timeout=100, cwd=ROOT, env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_cli_prints_rows_batches_and_quality_and_writes_json(tmp_path, fmt):
    paths = write_numbered(str(tmp_path), fmt, SIZES)
    out = tmp_path / "check.json"
    proc = naiad_check(os.path.join(str(tmp_path), f"part-*.{fmt}"), "--world-size", "3", "--num-workers", "2",
                       "--batch-size", "4", "--epochs", "2", "--shuffle-buffer", "10", "--seed", "5",
                       "--resume-at", "0.5", "--new-world-size", "2", "--new-batch-size", "6", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"{TOTAL} rows in 4 file(s)" in proc.stdout
    loader = _loader(paths, fmt, Topology(3, batch_size=4), 0)
    assert f"batches per rank: {len(loader)} per epoch" in proc.stdout  # the loader's own count
    assert "Spearman" in proc.stdout and "batch span" in proc.stdout
    assert "workers do not enter the plan" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("OK: every row exactly once")
    data = json.loads(out.read_text())
    assert data["ok"] and data["total_rows"] == TOTAL and data["batches_per_rank"] == len(loader)
    assert data["epochs"][0]["resumed_after"] == len(loader) // 2
    assert data["settings"]["new_world_size"] == 2


@pytest.mark.timeout(120)
def test_cli_json_to_stdout_is_the_report_alone(tmp_path):
    write_numbered(str(tmp_path), "parquet", SIZES)
    proc = naiad_check(str(tmp_path / "part-*.parquet"), "--world-size", "2", "--batch-size", "8", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total_rows"] == TOTAL


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("args", "reason"), [
    (["--world-size", "100"], "empty batch"),  # 81 rows over 100 ranks: some ranks have none
    (["--world-size", "4", "--batch-size", "30", "--drop-last"], "no batches on any rank"),
])
def test_cli_fails_an_impossible_configuration_with_the_reason(tmp_path, args, reason):
    write_numbered(str(tmp_path), "csv", SIZES)
    proc = naiad_check(str(tmp_path / "part-*.csv"), *args)
    assert proc.returncode == 1
    assert "naiad check: FAILED:" in proc.stderr and reason in proc.stderr
    assert "FAILED" in proc.stdout.splitlines()[-1]


def test_cli_fails_a_plan_that_reads_a_block_twice(tmp_path, monkeypatch, capsys):
    write_numbered(str(tmp_path), "parquet", SIZES, chunk_rows=7)
    import naiad.stream.plan

    real = naiad.stream.plan.block_permutation

    def broken(num_blocks: int, **kw: Any) -> np.ndarray:
        order = real(num_blocks, **kw)
        order[order == num_blocks - 1] = order[0] if order[0] != num_blocks - 1 else order[1]
        return order  # the file's last block never, another one twice

    monkeypatch.setattr(naiad.stream.plan, "block_permutation", broken)
    code = main(["check", str(tmp_path / "part-*.parquet"), "--world-size", "3", "--batch-size", "4"])
    err = capsys.readouterr().err
    assert code == 1
    assert "row(s) delivered more than once" in err and "2 times" in err
    # The last block of the last file (17 rows in blocks of 7: rows 14..16 of part-003) is missed.
    assert "3 row(s) never delivered, first row 78 (part-003.parquet, its row 14)" in err


def test_cli_fails_when_the_real_stream_differs_from_the_plan(tmp_path, monkeypatch, capsys):
    write_numbered(str(tmp_path), "csv", SIZES)
    from naiad.stream.batching import Batcher

    real = Batcher._take

    def reversed_take(self: Any, k: int) -> dict[str, np.ndarray]:
        return {name: col[::-1] for name, col in real(self, k).items()}

    monkeypatch.setattr(Batcher, "_take", reversed_take)
    code = main(["check", str(tmp_path / "part-*.csv"), "--batch-size", "8"])
    err = capsys.readouterr().err
    assert code == 1
    assert "real stream over row numbers (num_workers=0) differs from the dry run at batch 0" in err


def test_cli_refuses_new_settings_without_a_resume(tmp_path, capsys):
    write_numbered(str(tmp_path), "csv", SIZES)
    assert main(["check", str(tmp_path / "part-*.csv"), "--new-world-size", "3"]) == 1
    assert "give --resume-at too" in capsys.readouterr().err


def test_cli_refuses_a_resume_past_the_last_epoch(tmp_path, capsys):
    write_numbered(str(tmp_path), "csv", SIZES)
    assert main(["check", str(tmp_path / "part-*.csv"), "--epochs", "2", "--resume-at", "2.5"]) == 1
    assert "`resume_at` must be in [0, epochs=2)" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["npy", "csv", "parquet"])
def test_check_coverage_never_reads_a_row(tmp_path, monkeypatch, fmt):
    if fmt == "npy":  # 2 M rows, a sparse file: only its header is ever written or read
        path = tmp_path / "big.npy"
        header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int64))
        header["shape"] = (2_000_000,)
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header)
            f.truncate(f.tell() + 2_000_000 * 8)
        paths, total = [str(path)], 2_000_000
    else:
        paths, total = write_numbered(str(tmp_path), fmt, SIZES), TOTAL
    src = naiad.read(paths)

    def no_reads(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the check read rows")

    monkeypatch.setattr(type(src), "_read", no_reads)
    monkeypatch.setattr(type(src), "_read_rows_many", no_reads)
    batch_size = 256 if fmt == "npy" else 2
    report = check_coverage(src, world_size=8, batch_size=batch_size, resume_at=0.5, new_world_size=5)
    assert report.ok, report.problems
    assert report.total_rows == total
