"""A stream's decode stage in the loader's worker processes (NOTE [ Decode stage in the worker
processes ] in stream/decode_workers.py): a transform declaring ``Placement(holds_gil=True)``
(``naiad.decode_video``, or a user's) runs in the worker processes when the loader has them, on
the stage's threads otherwise, with the same pixels either way, for 0 and 2 workers and after an
exact or elastic resume; bad samples ledgered or named; a break, an error and a timeout leave no
process behind."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import torch

import naiad
from naiad.errors import DecodeError, WorkerError
from naiad.media.video import DecodeVideo
from tests.conftest_stream import two_ranks_then_three
from tests.helpers import INTERRUPTIBLE, child_pids, started, wait_gone
from tests.integration.test_videos import by_path as videos_by_path
from tests.integration.test_videos import same, write_folder

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(240)

ROOT = str(Path(__file__).resolve().parents[2])


class PidDecode(DecodeVideo):
    """decode_video that notes, per clip, the process and thread it was decoded in. Picklable."""

    def __call__(self, batch: Any) -> dict[str, Any]:
        out = super().__call__(batch)
        rows = len(out["video"])
        out["pid"] = torch.full((rows,), os.getpid())
        out["main_thread"] = torch.full((rows,), threading.current_thread() is threading.main_thread())
        return out


def clips(**kw: Any) -> PidDecode:
    """Random clips, crops and flips of 32x32 (12 KiB a clip: the decode stage, not the reads)."""
    made = naiad.decode_video("video", frames=4, stride=2, clip="random", size=32, crop="random", flip=True, **kw)
    return PidDecode(made.column, made.options, seed=made.seed, key=made.key)


def by_path(batches: list[dict[str, Any]]) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    return videos_by_path(batches, size=32)


def no_process_left(before: set[int], timeout_s: float = 10.0) -> None:
    """Wait for the worker processes started since ``before`` to go, then assert none is left
    (``helpers.settle_workers`` without its /dev/shm check: the slots have no name there, and
    another test run on the machine may come and go in /dev/shm meanwhile)."""
    gc.collect()
    deadline = time.monotonic() + timeout_s
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child_pids() - before, f"workers left behind: {child_pids() - before}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("videos") / "train"
    write_folder(root)
    return root


def make(root: Path, workers: int, mode: str | None = None, **kw: Any) -> naiad.DataLoader:
    loader = naiad.DataLoader(naiad.read_videos(root), batch_size=3, shuffle=True, seed=11, num_workers=workers,
                              worker_mode=mode, transform=clips(), **kw)  # type: ignore[arg-type]
    loader.set_epoch(1)
    return loader


def epoch(loader: naiad.DataLoader) -> tuple[list[dict[str, Any]], set[int], Any]:
    """One epoch's batches, the pass's worker pids and the loader's stage times."""
    try:
        it = iter(loader)
        batches = list(it)
        return batches, {w.pid for w in it._workers if hasattr(w, "pid")}, loader.stats().stages
    finally:
        loader.close()


def test_video_clips_decode_in_the_worker_processes_with_the_pixels_of_the_stage_threads(folder):
    runs = {}
    for name, workers, mode in (("inline", 0, None), ("threads", 2, "thread"), ("processes", 2, "process"),
                                ("default", 2, None)):
        loader = make(folder, workers, mode)
        batches, workers_pids, stages = epoch(loader)
        decoded_in = {int(p) for b in batches for p in b["pid"]}
        if name in ("processes", "default"):
            assert loader.worker_mode == "process"  # a decode that holds the GIL: processes by default
            # Both workers, none of it in the loop's process: batch k goes to worker k mod 2.
            assert decoded_in == workers_pids and len(decoded_in) == 2 and os.getpid() not in decoded_in
            assert "decode" in stages and stages["decode"].count == len(batches)
        else:  # the stage's threads of the loop's process (inline too), never the loop's thread
            assert decoded_in == {os.getpid()}
            assert not any(bool(m) for b in batches for m in b["main_thread"])
        runs[name] = by_path(batches)
    for name in ("threads", "processes", "default"):
        same(runs["inline"], runs[name])


def test_an_exact_and_an_elastic_resume_decode_the_same_clips_in_the_worker_processes(folder):
    whole = by_path(epoch(make(folder, 0))[0])
    first = make(folder, 2, "process")
    it = iter(first)
    before = [next(it), next(it)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = make(folder, 2, "process")
    resumed.load_state_dict(state)
    rest = epoch(resumed)[0]
    same(whole, by_path(before + rest))
    assert all(os.getpid() not in {int(p) for p in b["pid"]} for b in before + rest)

    def ranked(rank: int, world_size: int) -> naiad.DataLoader:
        loader = naiad.DataLoader(naiad.read_videos(folder), batch_size=1, shuffle=True, seed=11, rank=rank,
                                  world_size=world_size, num_workers=2, worker_mode="process", transform=clips())
        loader.set_epoch(1)
        return loader

    seen, counts = two_ranks_then_three(ranked, 2)
    assert len(set(counts)) == 1
    same(by_path(seen), whole)
    assert os.getpid() not in {int(p) for b in seen for p in b["pid"]}


def test_videos_that_do_not_decode_in_the_worker_processes_are_ledgered_or_end_the_pass(tmp_path):
    paths = write_folder(tmp_path / "train", bad=("bowling_1.mp4",))
    before = child_pids()
    ledgers = {}
    for workers in (0, 2):
        loader = naiad.DataLoader(naiad.read_videos(tmp_path / "train", on_bad_rows="skip"), batch_size=4,
                                  num_workers=workers, worker_mode="process", transform=clips())
        try:
            batches = list(loader)
            ledgers[workers] = loader.stats().bad_row_ledger
        finally:
            loader.close()
        assert sorted(p for b in batches for p in b["path"]) == sorted(p for p in paths if not p.endswith("bowling_1.mp4"))
    assert ledgers[0] == ledgers[2]
    assert [Path(e["key"]).name for e in ledgers[2]] == ["bowling_1.mp4"] and ledgers[2][0]["column"] == "video"
    assert ledgers[2][0]["file"] == str(tmp_path / "train") and "not a video FFmpeg can read" in ledgers[2][0]["reason"]
    strict = naiad.DataLoader(naiad.read_videos(tmp_path / "train"), batch_size=4, num_workers=2,
                              worker_mode="process", transform=clips())
    try:
        with pytest.raises(DecodeError) as info:
            list(strict)
    finally:
        strict.close()
    assert "bowling_1.mp4" in str(info.value) and info.value.path == str(tmp_path / "train")
    assert any("raised in worker" in note for note in getattr(info.value, "__notes__", []))
    no_process_left(before)


class Slow:
    """A transform that holds the GIL, stuck for ``sleep_s`` on each batch. Picklable."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def placement(self) -> naiad.Placement:
        return naiad.Placement("workers", holds_gil=True)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.sleep_s)
        return {"x": batch["x"], "y": batch["x"] * 2, "pid": torch.full((len(batch["x"]),), os.getpid())}


@pytest.fixture
def csv_path(tmp_path: Path) -> str:
    path = tmp_path / "x.csv"
    pacsv.write_csv(pa.table({"x": [float(i) for i in range(200)]}), path)
    return str(path)


def test_a_users_transform_declaring_holds_gil_runs_in_the_worker_processes(csv_path):
    kwargs: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 3, "num_workers": 2}
    loader = naiad.DataLoader(naiad.read_csv(csv_path), transform=Slow(0.0), **kwargs)
    assert loader.worker_mode == "process"
    batches, workers_pids, _ = epoch(loader)
    assert {int(p) for b in batches for p in b["pid"]} == workers_pids and os.getpid() not in workers_pids
    threads, _, _ = epoch(naiad.DataLoader(naiad.read_csv(csv_path), transform=Slow(0.0), worker_mode="thread", **kwargs))
    assert {int(p) for b in threads for p in b["pid"]} == {os.getpid()}  # thread workers: the stage's threads
    for a, b in zip(batches, threads, strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])


def test_a_break_and_a_timeout_in_the_worker_processes_leave_no_process(csv_path):
    before = child_pids()
    loader = naiad.DataLoader(naiad.read_csv(csv_path), batch_size=16, num_workers=2, transform=Slow(0.0))
    for _ in loader:
        break
    del loader
    no_process_left(before)
    stuck = naiad.DataLoader(naiad.read_csv(csv_path), batch_size=16, num_workers=2, timeout=1, transform=Slow(30.0))
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="timed out after 1 seconds") as info:
        next(iter(stuck))
    assert "the decode of batch 0 of epoch 0" in str(info.value)
    stuck.close()
    assert time.monotonic() - t0 < 20
    no_process_left(before)


CTRL_C_SCRIPT = INTERRUPTIBLE + textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import psutil
    import naiad
    from tests.integration.test_decode_stage_processes import Slow
    loader = naiad.DataLoader(naiad.read_csv({path!r}), batch_size=2, num_workers=2, persistent_workers=True,
                              transform=Slow(0.01))
    it = iter(loader)
    next(it)
    print(" ".join(str(p.pid) for p in psutil.Process().children()), flush=True)
    while True:
        for batch in loader:
            pass
    """
)


def test_ctrl_c_while_the_workers_decode_leaves_no_process(csv_path):
    script = CTRL_C_SCRIPT.format(root=ROOT, path=csv_path)
    with started([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 cwd=ROOT) as proc:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) >= 2
        time.sleep(0.5)  # into the decode tasks
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        assert err.count("Traceback") == 1, err  # the training process's only: workers stay quiet
        wait_gone(workers, 10, "a worker outlived the interrupted training process")
