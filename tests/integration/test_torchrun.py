"""Real torchrun jobs (gloo, CPU, loopback): DDP training on uneven CSV files through naiad.

Every row once per epoch across the ranks, equal steps on every rank, a new order each epoch; and
a job SIGKILLed mid-epoch resumes from its last checkpoint, on the same or another number of
ranks, delivering exactly the rows its checkpoint had not covered. The job is ``torchrun_job.py``.

Each torchrun launch costs several seconds here (torch is imported by torchrun and by every
rank), so the data is tiny and the killed run of each world size is shared by the cases that
restart from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.integration.torchrun_job import make_loader, write_data

pytestmark = pytest.mark.slow  # about a minute of CPU on 2 cores: 7 launches, 27 torch imports

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("torchrun_job.py")
SIZES = (37, 120, 0, 83, 61)  # uneven, one empty: ranks' ranges straddle files and blocks
TOTAL = sum(SIZES)
BATCH_SIZE = 8
SEED = 5
EPOCHS = 2
CKPT_EVERY = 4
STALL_AFTER = 6  # killed after step 6: steps 5 and 6 were delivered but no checkpoint covers them
RUN_TIMEOUT_S = 75  # per launch; a killed run plus its restart stay inside the test timeout
MARKER = "NAIAD_TORCHRUN_TEST_JOB"
_RANK_ERROR = re.compile(r"^\[rank\d+\]: ((?:\w+\.)*\w*(?:Error|Exception): .*)$", re.MULTILINE)


@dataclass
class Job:
    proc: subprocess.Popen
    marker: str
    output: Path

    def tail(self, chars: int = 4000) -> str:
        """The exceptions the ranks raised, then the end of torchrun's output."""
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        errors = dict.fromkeys(m.group(1) for m in _RANK_ERROR.finditer(text))
        return "".join(f"{e}\n" for e in errors) + "--- output ---\n" + text[-chars:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(marker: str, tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    # torchrun's agent makes a folder in the temporary directory per job and leaves it when the
    # job is killed: under the test's own folder, it goes with it.
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    # The ranks import naiad from this checkout, as the test does.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    if "lo" in {name for _, name in socket.if_nameindex()}:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only, whatever the host name resolves to
    env[MARKER] = marker  # finds the ranks again after torchrun is gone (see _kill_job)
    return env


def _launch(nproc: int, data: Path, out: Path, tag: str, *extra: str) -> Job:
    marker = uuid.uuid4().hex
    output = out / f"torchrun-{tag}.out"
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--rdzv-backend", "static", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        "--local-addr", "127.0.0.1", "--max-restarts", "0", "--monitor-interval", "0.1",
        str(JOB), "--data", str(data), "--out", str(out), "--tag", tag,
        "--epochs", str(EPOCHS), "--batch-size", str(BATCH_SIZE), "--seed", str(SEED),
        "--num-workers", "1", "--ckpt-every", str(CKPT_EVERY), *extra,
    ]
    with open(output, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(marker, out / "tmp"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group, to kill as one
    return Job(proc, marker, output)


def _marked(job: Job) -> list[psutil.Process]:
    """The job's live processes, found by the marker in their environment."""
    found = []
    for p in psutil.process_iter():
        with suppress(psutil.Error):
            if p.environ().get(MARKER) == job.marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


def _kill_job(job: Job) -> None:
    """SIGKILL torchrun's process group, then every rank: torchrun (2.x) starts each rank in a
    session of its own, so killing torchrun's group alone would leave the ranks running."""
    try:
        ranks = psutil.Process(job.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    with suppress(ProcessLookupError):
        os.killpg(job.proc.pid, signal.SIGKILL)
    ranks += [p for p in _marked(job) if p not in ranks]
    for p in ranks:
        with suppress(ProcessLookupError, psutil.Error):
            pgid = os.getpgid(p.pid)
            if pgid != os.getpgrp():
                os.killpg(pgid, signal.SIGKILL)
            p.kill()
    job.proc.wait(timeout=10)
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, f"ranks still alive after SIGKILL: {alive}"


@pytest.fixture
def jobs():
    """Launched jobs; whatever is still running when the test ends is killed, ranks and all."""
    launched: list[Job] = []
    yield launched
    for job in launched:
        _kill_job(job)


def _wait(job: Job) -> None:
    try:
        rc = job.proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_job(job)
        pytest.fail(f"torchrun did not finish in {RUN_TIMEOUT_S} s; its output:\n{job.tail()}")
    assert rc == 0, f"torchrun exited with {rc}; its output:\n{job.tail()}"
    assert not _marked(job), "a rank outlived torchrun's clean exit"


def _records(out: Path, tag: str, rank: int) -> list[dict]:
    path = out / f"log-{tag}-rank{rank}.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1]]  # the last piece is "" or a line being written


def _steps(out: Path, tag: str, world_size: int) -> list[list[dict]]:
    return [[r for r in _records(out, tag, rank) if r["kind"] == "step"] for rank in range(world_size)]


def _ids_in(steps: list[dict], epoch: int) -> list[list[int]]:
    return [s["ids"] for s in steps if s["epoch"] == epoch]


def _reference(data: Path, world_size: int, epoch: int) -> list[list[list[int]]]:
    """Per rank, the batches' ids of a fresh loader told rank and world_size explicitly."""
    paths = sorted(str(p) for p in data.glob("*.csv"))
    per_rank = []
    for rank in range(world_size):
        loader = make_loader(paths, batch_size=BATCH_SIZE, seed=SEED, num_workers=0, rank=rank, world_size=world_size)
        loader.set_epoch(epoch)
        per_rank.append([batch["id"].tolist() for batch in loader])
    return per_rank


def _assert_exactly_once(ids: list[int], what: str) -> None:
    counts = Counter(ids)
    repeated = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(range(TOTAL)) - counts.keys())
    extra = sorted(counts.keys() - set(range(TOTAL)))
    assert not (repeated or missing or extra), (
        f"{what}: {len(ids)} rows for {TOTAL}; repeated {repeated[:20]}, missing {missing[:20]}, unknown {extra[:20]}"
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("csv")
    write_data(str(d), SIZES)
    return d


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_see_every_row_once_per_epoch_in_equal_steps(nproc, data, tmp_path, jobs):
    jobs.append(job := _launch(nproc, data, tmp_path, "full"))
    _wait(job)
    steps = _steps(tmp_path, "full", nproc)
    for rank in range(nproc):
        assert _records(tmp_path, "full", rank)[-1]["kind"] == "done", f"rank {rank} did not finish"
    for epoch in range(EPOCHS):
        per_rank = [_ids_in(s, epoch) for s in steps]
        assert len({len(b) for b in per_rank}) == 1, f"epoch {epoch}: steps per rank {[len(b) for b in per_rank]}"
        _assert_exactly_once([i for b in per_rank for batch in b for i in batch], f"epoch {epoch}")
        # Rank and world size came from torch.distributed: the same batches as when given.
        assert per_rank == _reference(data, nproc, epoch)
    for rank in range(nproc):
        assert _ids_in(steps[rank], 0) != _ids_in(steps[rank], 1), f"rank {rank}: epoch 1 repeated epoch 0's order"
        assert [s["step"] for s in steps[rank]] == list(range(1, len(steps[rank]) + 1))


_killed: dict[int, Path] = {}


def _killed_run(world_size: int, data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job on ``world_size`` ranks, checkpointed after step 4 and SIGKILLed while stalled after
    step 6; made once per world size (the restart cases copy its folder)."""
    if world_size in _killed:
        return _killed[world_size]
    out = tmp_path_factory.mktemp(f"killed-w{world_size}")
    job = _launch(world_size, data, out, "first", "--stall-after-step", str(STALL_AFTER))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            stalled = all(any(s["step"] == STALL_AFTER for s in ranks) for ranks in _steps(out, "first", world_size))
            if stalled and (out / "ckpt.pt").exists():
                break
            if job.proc.poll() is not None:
                pytest.fail(f"torchrun exited with {job.proc.returncode} before step {STALL_AFTER}:\n{job.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no rank stalled after step {STALL_AFTER} in {RUN_TIMEOUT_S} s:\n{job.tail()}")
            time.sleep(0.05)
        assert job.proc.poll() is None, "the job should be stalled, not finished"
    finally:
        _kill_job(job)  # mid-epoch, with the loader's reads of later steps in flight
    _killed[world_size] = out
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("before", "after"), [(2, 2), (2, 3), (3, 2)], ids=["2to2", "2to3", "3to2"])
def test_killed_job_resumes_from_checkpoint_on_any_world_size(before, after, data, tmp_path_factory, tmp_path, jobs):
    first = _killed_run(before, data, tmp_path_factory)
    out = tmp_path / "run"
    shutil.copytree(first, out)
    first_steps = _steps(out, "first", before)
    ckpt = [r for r in _records(out, "first", 0) if r["kind"] == "checkpoint"][-1]
    assert (ckpt["step"], ckpt["epoch"], ckpt["batch"]) == (CKPT_EVERY, 0, CKPT_EVERY)
    epoch, covered = ckpt["epoch"], ckpt["step"]
    ref_before = _reference(data, before, epoch)
    for rank in range(before):  # the killed run delivered the planned batches up to the stall
        assert _ids_in(first_steps[rank], epoch) == ref_before[rank][:STALL_AFTER]

    jobs.append(job := _launch(after, data, out, "second", "--resume", str(out / "ckpt.pt")))
    _wait(job)
    records = [_records(out, "second", rank) for rank in range(after)]
    steps = _steps(out, "second", after)

    # Model and optimizer come back as checkpointed; the step count goes on from there.
    for rank in range(after):
        resume = records[rank][0]
        assert resume["kind"] == "resume" and resume["step"] == covered and resume["epoch"] == epoch
        assert (resume["param_sum"], resume["momentum_sum"]) == (ckpt["param_sum"], ckpt["momentum_sum"])
        assert ckpt["momentum_sum"] > 0
        assert [s["step"] for s in steps[rank]] == list(range(covered + 1, covered + 1 + len(steps[rank])))
        assert records[rank][-1]["kind"] == "done"

    # The interrupted epoch: the checkpointed steps plus everything after the restart is every
    # row once (steps 5 and 6 of the killed run are delivered again, as no checkpoint covers them).
    resumed = [_ids_in(s, epoch) for s in steps]
    assert len({len(b) for b in resumed}) == 1, f"steps per rank after the restart: {[len(b) for b in resumed]}"
    before_ckpt = [i for s in first_steps for step in s if step["epoch"] == epoch and step["step"] <= covered for i in step["ids"]]
    _assert_exactly_once(before_ckpt + [i for b in resumed for batch in b for i in batch], f"epoch {epoch} across the restart")
    if before == after:  # same topology: exactly the batches the uninterrupted run would have had
        assert resumed == [r[ckpt["batch"]:] for r in ref_before]

    # The next epoch is an ordinary one on the new world size.
    following = [_ids_in(s, epoch + 1) for s in steps]
    assert following == _reference(data, after, epoch + 1)
    _assert_exactly_once([i for b in following for batch in b for i in batch], f"epoch {epoch + 1}")
