"""naiad.DataLoader inside the tools people train with: PyTorch Lightning (single process and DDP
with 2 processes on CPU, a crash and a resume from the trainer's own checkpoint, on the same
and on another number of processes) and Hugging Face Accelerate (prepare() keeps naiad's
loader). Every row exactly once per epoch, equal steps on every rank."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest_stream import write_numbered
from tests.integration.test_torchrun import Job, _env, _free_port, _kill_job

pytest.importorskip("lightning")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow  # each run imports torch and Lightning in every process

JOBS = Path(__file__).resolve().parent / "jobs"
ROOT = JOBS.parents[2]
ROWS = 100  # both jobs: TensorDataset(arange(100)), or CSV files of 37 + 50 + 13 rows
RUN_TIMEOUT_S = 150


@pytest.fixture
def jobs():
    """Launched jobs; whatever of them is still running when the test ends is killed: a job
    that exited (a crash the test asked for) may have left ranks behind."""
    launched: list[Job] = []
    yield launched
    for job in launched:
        _kill_job(job)


def _run(jobs: list[Job], out: Path, cmd: list[str], expect: int = 0) -> str:
    out.mkdir(parents=True, exist_ok=True)
    output = out / f"run-{uuid.uuid4().hex[:6]}.out"
    marker = uuid.uuid4().hex  # finds the job's ranks, whatever session or parent they have
    with open(output, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(marker, out / "tmp"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    job = Job(proc, marker, output)
    jobs.append(job)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_job(job)
        pytest.fail(f"{cmd[2:4]} did not finish in {RUN_TIMEOUT_S} s:\n{job.tail()}")
    assert rc == expect, f"exit code {rc}, expected {expect}:\n{job.tail()}"
    return output.read_text(errors="replace")


def _lightning(jobs: list[Job], out: Path, *args: str, expect: int = 0) -> str:
    return _run(jobs, out, [sys.executable, str(JOBS / "lightning_job.py"), "--out", str(out), *args], expect)


def _steps(out: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(out.glob("log-rank*.jsonl"))]


def _epochs(per_rank: list[list[dict]], before_step: int | None = None) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for steps in per_rank:
        for s in steps:
            if before_step is None or s["step"] < before_step:
                seen.setdefault(s["epoch"], []).extend(s["ids"])
    return seen


def _exactly_once(ids: list[int], what: str) -> None:
    counts = Counter(ids)
    repeated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(range(ROWS)) - set(counts))
    assert not repeated and not missing, f"{what}: repeated {repeated[:10]}, missing {missing[:10]}"


@pytest.fixture(scope="module")
def csv_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("csv")
    write_numbered(str(d), "csv", [37, 50, 13])
    return d


@pytest.mark.timeout(400)
@pytest.mark.parametrize("source", ["map", "stream"])
def test_lightning_ddp_every_row_once_then_a_crash_resumed_from_its_checkpoint(source, csv_data, tmp_path, jobs):
    # The plain import swap (shuffle=True, no seed): Lightning checkpoints the loader at every
    # checkpoint and, under DDP, rebuilds it with its DistributedSampler.
    data = ["--source", source, "--data", str(csv_data)]
    first = tmp_path / "first"
    _lightning(jobs, first, "--devices", "2", *data, "--ckpt-every", "3", "--crash-at", "5", expect=3)
    resumed = tmp_path / "resumed"
    _lightning(jobs, resumed, "--devices", "2", *data, "--resume", str(first / "ckpt" / "step=3.ckpt"))
    before = _epochs(_steps(first), before_step=3)
    after = _epochs(_steps(resumed))
    _exactly_once(before[0] + after[0], f"{source}: epoch 0, 3 steps before the crash and the rest after it")
    _exactly_once(after[1], f"{source}: epoch 1 after the resume")
    per_rank = _steps(resumed)
    for epoch in (0, 1):
        counts = [sum(1 for s in steps if s["epoch"] == epoch) for steps in per_rank]
        assert len(set(counts)) == 1, f"epoch {epoch}: unequal steps per rank {counts}"
    assert after[1] != before[0] + after[0]  # a new order for the next epoch


@pytest.mark.timeout(300)
def test_lightning_resumes_a_ddp_checkpoint_on_one_process(csv_data, tmp_path, jobs):
    # Lightning saves rank 0's loader state; with seed= the single-process run continues the
    # epoch elastically: every row the two ranks had not delivered, once.
    first = tmp_path / "first"
    _lightning(jobs, first, "--devices", "2", "--seed", "0", "--ckpt-every", "3", "--crash-at", "5", expect=3)
    resumed = tmp_path / "resumed"
    _lightning(jobs, resumed, "--seed", "0", "--resume", str(first / "ckpt" / "step=3.ckpt"))
    before, after = _epochs(_steps(first), before_step=3), _epochs(_steps(resumed))
    _exactly_once(before[0] + after[0], "epoch 0 across the 2-process run and the 1-process resume")
    _exactly_once(after[1], "epoch 1 on one process")


@pytest.mark.timeout(300)
def test_lightning_single_process_crash_and_resume(tmp_path, jobs):
    first = tmp_path / "first"
    _lightning(jobs, first, "--ckpt-every", "4", "--crash-at", "6", expect=3)
    resumed = tmp_path / "resumed"
    _lightning(jobs, resumed, "--resume", str(first / "ckpt" / "step=4.ckpt"))
    before, after = _epochs(_steps(first), before_step=4), _epochs(_steps(resumed))
    _exactly_once(before[0] + after[0], "epoch 0")
    _exactly_once(after[1], "epoch 1")


def _accelerate(jobs: list[Job], out: Path, nproc: int, *args: str, expect: int = 0) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--rdzv-backend", "static", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "--local-addr", "127.0.0.1", "--max-restarts", "0", str(JOBS / "accelerate_job.py"), "--out", str(out),
           *args]
    return _run(jobs, out, cmd, expect)


def _accelerate_steps(out: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(out.glob("accelerate-*.jsonl"))]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("source", ["map", "stream"])
def test_accelerate_prepare_keeps_naiads_loader_shards_and_resumes_from_save_state(source, csv_data, tmp_path, jobs):
    data = ["--source", source, "--data", str(csv_data)]
    first = tmp_path / "first"
    _accelerate(jobs, first, 2, *data, "--save-at", "3", "--crash-at", "5", expect=1)  # torchrun: a rank died
    resumed = tmp_path / "resumed"
    _accelerate(jobs, resumed, 2, *data, "--resume", str(first / "state"))
    before = _epochs(_accelerate_steps(first), before_step=4)  # steps 1..3 are in the saved state
    after = _epochs(_accelerate_steps(resumed))
    _exactly_once(before[0] + after[0], f"{source}: epoch 0 across the crash")
    _exactly_once(after[1], f"{source}: epoch 1")
    per_rank = _accelerate_steps(resumed)
    for epoch in (0, 1):
        assert len({sum(1 for s in steps if s["epoch"] == epoch) for steps in per_rank}) == 1
    assert {s["fetch"] for steps in per_rank for s in steps} == {"gather" if source == "map" else "stream"}


@pytest.mark.timeout(200)
def test_accelerate_single_process_keeps_naiads_loader(tmp_path, jobs):
    _run(jobs, tmp_path, [sys.executable, str(JOBS / "accelerate_job.py"), "--out", str(tmp_path)])
    (steps,) = _accelerate_steps(tmp_path)
    for epoch in (0, 1):
        _exactly_once([i for s in steps if s["epoch"] == epoch for i in s["ids"]], f"epoch {epoch}")


@pytest.mark.timeout(200)
def test_accelerate_refuses_an_unsharded_map_style_loader(tmp_path, jobs):
    text = _accelerate(jobs, tmp_path, 2, "--unsharded", expect=1)
    assert "world_size=accelerator.num_processes" in text
    shutil.rmtree(tmp_path, ignore_errors=True)
