"""A streaming source left at num_workers=0 is read ahead on threads (`read_ahead=`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import naiad
from naiad.stream.pipeline import default_read_ahead


def make_csv(path: Path, n: int = 5000) -> str:
    path.write_text("id,x\n" + "".join(f"{i},{i % 17}.5\n" for i in range(n)))
    return str(path)


def batches(loader: naiad.DataLoader) -> list[np.ndarray]:
    return [b["id"].numpy().copy() for b in loader]


@pytest.mark.timeout(120)
def test_read_ahead_changes_nothing_but_where_blocks_are_read(tmp_path: Path) -> None:
    path = make_csv(tmp_path / "d.csv")
    seen: set[str] = set()

    class Spy:
        def __call__(self, batch: dict) -> dict:
            seen.add(threading.current_thread().name)
            return batch

    runs = {}
    for ahead in (0, 1, 2, 3):
        loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=2000), batch_size=100, shuffle=True, seed=4,
                                  shuffle_buffer=700, read_ahead=ahead, transform=Spy())
        runs[ahead] = batches(loader)
        info = loader.stats().workers
        assert info["num_workers"] == 0 and info.get("read_ahead", 0) == ahead
    for ahead in (1, 2, 3):
        assert len(runs[ahead]) == len(runs[0])
        assert all(np.array_equal(a, b) for a, b in zip(runs[ahead], runs[0], strict=True))
    assert seen == {threading.current_thread().name}  # the transform stays in the training thread


def test_the_default(tmp_path: Path) -> None:
    path = make_csv(tmp_path / "d.csv", 100)
    loader = naiad.DataLoader(naiad.read_csv(path), batch_size=10)
    assert loader.read_ahead_threads() == default_read_ahead()
    assert loader.stats().workers.get("read_ahead", 0) == default_read_ahead()
    # Workers of their own, a tuner, or a map-style dataset: no read-ahead threads.
    assert naiad.DataLoader(naiad.read_csv(path), batch_size=10, num_workers=2).read_ahead_threads() == 0
    assert naiad.DataLoader(torch.arange(10), batch_size=2).read_ahead_threads() == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_bad_values(tmp_path: Path, bad: object) -> None:
    path = make_csv(tmp_path / "d.csv", 10)
    with pytest.raises(naiad.ConfigError, match="read_ahead"):
        naiad.DataLoader(naiad.read_csv(path), batch_size=2, read_ahead=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_break_and_errors_leave_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,x\n" + "".join(f"{i},1.0\n" for i in range(3000)) + "oops,1.0\n")
    clean = make_csv(tmp_path / "clean.csv", 3000)
    before = set(threading.enumerate())
    loader = naiad.DataLoader(naiad.read_csv(clean, block_bytes=500), batch_size=50, read_ahead=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    with pytest.raises(naiad.SourceError, match="line 3002"):
        list(naiad.DataLoader(naiad.read_csv(path, block_bytes=500), batch_size=50, read_ahead=2))
    # The read-ahead threads are kept across passes while their loader lives, and go with it.
    # (The column helper, naiad-columns, is one per process by design: parallel/threads.py.)
    del loader
    import gc

    gc.collect()

    def started() -> list[str]:
        return [t.name for t in set(threading.enumerate()) - before if not t.name.startswith("naiad-columns")]

    deadline = time.monotonic() + 10
    while started() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started() == []


@pytest.mark.timeout(120)
def test_the_threads_are_kept_across_epochs(tmp_path: Path) -> None:
    # Starting and joining the threads every epoch cost a 10 MB file's epoch 10-15%.
    path = make_csv(tmp_path / "d.csv", 4000)

    def readers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("naiad-worker")}

    before = readers()
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=700), batch_size=64, shuffle=True, seed=1,
                              shuffle_buffer=500, read_ahead=2)
    first = np.concatenate(batches(loader))
    kept = readers() - before
    assert len(kept) == 2
    for epoch in range(1, 4):
        loader.set_epoch(epoch)
        for i, _ in enumerate(loader):  # a pass left at a break: its reads still in flight
            if i == 5:
                break
        loader.set_epoch(epoch)
        got = np.concatenate(batches(loader))
        assert sorted(got.tolist()) == list(range(4000))
        assert readers() - before == kept
    loader.set_epoch(0)
    assert np.array_equal(np.concatenate(batches(loader)), first)
    loader.close()
    deadline = time.monotonic() + 10
    while readers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not readers() - before


@pytest.mark.timeout(120)
def test_rows_that_fit_in_the_buffer_and_one_read_group_are_read_inline(tmp_path: Path) -> None:
    # Every read of such an epoch but the last comes before its first batch: threads overlap
    # (almost) nothing.
    import pyarrow as pa
    import pyarrow.parquet as pq

    def readers() -> int:
        return sum(t.name.startswith("naiad-worker") for t in threading.enumerate())

    before = readers()
    path = make_csv(tmp_path / "d.csv", 3000)
    loader = naiad.DataLoader(naiad.read_csv(path, block_bytes=700), batch_size=64, shuffle=True, seed=1)
    assert loader.read_ahead_threads() == default_read_ahead()  # the rows are not counted yet
    first = batches(loader)
    assert loader.read_ahead_threads() == 0 and loader.stats().workers.get("read_ahead", 0) == 0
    loader.set_epoch(0)
    again = batches(loader)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert readers() == before  # the first epoch's threads are gone
    # More rows than the buffer, or no shuffle: read ahead as before.
    assert naiad.DataLoader(naiad.read_csv(path), batch_size=64, shuffle=True, shuffle_buffer=500,
                            read_ahead=None).read_ahead_threads() == default_read_ahead()
    unshuffled = naiad.DataLoader(naiad.read_csv(path), batch_size=64)
    batches(unshuffled)
    assert unshuffled.read_ahead_threads() == default_read_ahead()
    # Parquet's rows are in its footer: inline from the first epoch.
    pq.write_table(pa.table({"id": np.arange(3000)}), tmp_path / "d.parquet", row_group_size=500)
    loader = naiad.DataLoader(naiad.read_parquet(tmp_path / "d.parquet"), batch_size=64, shuffle=True, seed=1)
    assert loader.read_ahead_threads() == 0
    assert sorted(np.concatenate(batches(loader)).tolist()) == list(range(3000))
    np.save(tmp_path / "d.npy", np.arange(3000))  # an .npy file's header says too
    assert naiad.DataLoader(naiad.read(tmp_path / "d.npy"), batch_size=64, shuffle=True).read_ahead_threads() == 0
    # The buffer and one read group (half a buffer) more: 2,000 + 1,000 rows are; 1,998 + 999 are not.
    for buffer, threads in ((2000, 0), (1998, default_read_ahead())):
        loader = naiad.DataLoader(naiad.read(tmp_path / "d.npy"), batch_size=64, shuffle=True, shuffle_buffer=buffer)
        assert loader.read_ahead_threads() == threads


def _count_rows(loader: naiad.DataLoader, out: object) -> None:
    out.put(sum(len(b["id"]) for b in loader))  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_a_forked_child_starts_threads_of_its_own(tmp_path: Path) -> None:
    import multiprocessing as mp

    loader = naiad.DataLoader(naiad.read_csv(make_csv(tmp_path / "d.csv", 3000), block_bytes=700), batch_size=64,
                              shuffle=True, seed=1, read_ahead=2)
    assert sum(len(b["id"]) for b in loader) == 3000  # the parent's threads now exist
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_count_rows, args=(loader, out))
    child.start()
    try:
        assert out.get(timeout=60) == 3000  # the parent's pool has no threads in the child: not used
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


EXIT_MID_READ = """
import sys, naiad
loader = naiad.DataLoader(naiad.read_csv(sys.argv[1]), batch_size=64, shuffle=True, seed=0)
it = iter(loader)
next(it)
# The read-ahead threads are parsing the next groups; the interpreter goes now, the pass open.
"""


@pytest.mark.timeout(300)
def test_exit_while_threads_parse_is_clean(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        f.write("id,a,b,c\n")
        for k in range(0, 400_000, 50_000):
            f.write("".join(f"{i},{i * 0.5},{i % 7},{i * 3}\n" for i in range(k, k + 50_000)))
    for _ in range(4):
        out = subprocess.run([sys.executable, "-c", EXIT_MID_READ, str(path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "terminate called" not in out.stderr


def test_a_remote_source_reads_further_ahead() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("memory://naiad-read-ahead/d.csv", "w") as f:
        f.write("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(200)))
    loader = naiad.DataLoader(naiad.read_csv("memory://naiad-read-ahead/d.csv"), batch_size=10)
    try:
        assert loader.read_ahead_threads() == default_read_ahead(remote=True) >= 4
        assert default_read_ahead(remote=True) > default_read_ahead()
        assert sorted(int(v) for b in loader for v in b["a"]) == list(range(200))
        assert naiad.DataLoader(naiad.read_csv("memory://naiad-read-ahead/d.csv"), batch_size=10,
                                read_ahead=1).read_ahead_threads() == 1
    finally:
        fs.rm("memory://naiad-read-ahead", recursive=True)


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _run_until_decided(path: str, step: Callable[[], None] | None, limit_s: float = 60.0) -> tuple[naiad.DataLoader, list[np.ndarray]]:
    loader = naiad.DataLoader(naiad.read_csv(path), batch_size=256, shuffle=True, seed=0, shuffle_buffer=8192)
    first: list[np.ndarray] = []
    start, busy, own = time.monotonic(), _machine_busy_s(), time.process_time()
    epoch = 0
    while not loader.stats().workers.get("read_ahead_tuning", {}).get("settled"):
        assert time.monotonic() - start < limit_s, loader.stats().workers
        loader.set_epoch(epoch)
        for b in loader:
            if epoch == 0:
                first.append(b["id"].numpy().copy())
            if step is not None:
                step()
        epoch += 1
    # The tuner weighs this process's CPU against the cores; other processes busy on them take
    # the cores it counts as free, and the decision is then not the one this test names.
    others = (_machine_busy_s() - busy - (time.process_time() - own)) / (time.monotonic() - start)
    if others > 0.5:
        pytest.skip(f"other processes kept {others:.1f} cores busy while the tuner measured")
    return loader, first


@pytest.mark.timeout(180)
def test_the_default_reads_inline_when_a_cpu_bound_step_fills_the_cores(tmp_path: Path) -> None:
    """NOTE [ Tuned read-ahead ]: a training step on torch's threads keeps every core busy, so
    the read-ahead threads go; a loop that leaves the cores free keeps them. Either way, the
    batches are those of reading inline."""
    if default_read_ahead() == 0:
        pytest.skip("one core: no read-ahead threads to tune")
    path = make_csv(tmp_path / "d.csv", 150_000)
    a = torch.randn(384, 384)

    def cpu_step() -> None:  # about 6 ms of matmuls on every core, as a CPU training step
        # (long against the loop's own work between steps, so the step's share of the process's
        # CPU is clear of the tuner's bar, cores - 0.5, on a loaded machine too)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.006:
            a @ a

    stepped, first = _run_until_decided(path, cpu_step)
    info = stepped.stats().workers
    assert info["read_ahead"] == 0 and "reading inline" in info["reason"], info
    inline = naiad.DataLoader(naiad.read_csv(path), batch_size=256, shuffle=True, seed=0, shuffle_buffer=8192, read_ahead=0)
    want = batches(inline)
    assert len(first) == len(want) and all(np.array_equal(x, y) for x, y in zip(first, want, strict=True))

    idle, first = _run_until_decided(path, None)
    info = idle.stats().workers
    assert info["read_ahead"] == default_read_ahead() and "leaves cores free" in info["reason"], info
    assert all(np.array_equal(x, y) for x, y in zip(first, want, strict=True))
