"""Shared test helpers: deep comparison of batches, a dataset that fails at given rows, process
accounting, child processes."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


def assert_same_batch(a: Any, b: Any, path: str = "batch") -> None:
    """Assert ``a`` and ``b`` are the same batch: types, nesting, shapes, dtypes and values."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), path
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same_batch(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_batch(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_batches(expected: list[Any], got: list[Any]) -> None:
    """Assert two lists of batches are the same, batch by batch."""
    assert len(expected) == len(got), f"{len(got)} batches, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert_same_batch(a, b, f"batch {i}")


class FailsAt(Dataset):
    """A map-style dataset of the rows 0..n-1; the rows listed in ``bad`` raise ValueError."""

    def __init__(self, n: int, bad: tuple[int, ...]) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise ValueError(f"bad row {i}")
        return i


def child_pids() -> set[int]:
    """PIDs of this process's live (non-zombie) descendants."""
    import psutil

    out = set()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: Sequence[int], timeout_s: float, what: str) -> None:
    """Wait until none of ``pids`` runs (gone, or a zombie); fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(_running(p) for p in pids):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def shm_entries() -> set[str]:
    """Names in /dev/shm (empty where it does not exist)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def settle_workers(before_pids: set[int], before_shm: set[str], timeout_s: float = 10.0) -> None:
    """Wait for the workers started since ``before_pids`` to go (garbage-collecting what holds
    them), then assert that none and no shared memory outside ``before_shm`` is left."""
    gc.collect()
    deadline = time.monotonic() + timeout_s
    while child_pids() - before_pids and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (child_pids() - before_pids), f"workers left behind: {child_pids() - before_pids}"
    assert shm_entries() <= before_shm, f"shared memory left behind: {shm_entries() - before_shm}"


# The first line of a child script that a test interrupts with SIGINT. Python turns SIGINT into
# KeyboardInterrupt only where it starts with SIGINT at its default; a suite run with SIGINT
# ignored (under nohup, or as a script's `&` job, as .ci/run does) passes the ignore on to every
# child across exec, and the child would never see the test's Ctrl-C.
INTERRUPTIBLE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"

_CHILD_MARKER = "NAIAD_TEST_CHILD"


@contextmanager
def started(args: list[str], **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(args, **kwargs)`` whose whole process tree is killed when the block
    ends, however it ends (a failed assert, an exception, pytest-timeout's interrupt).

    The child's environment (``env=``, else this process's) gets a marker of its own, which every
    process it starts inherits: they are found by it, reparented orphans included.
    """
    marker = uuid.uuid4().hex
    kwargs["env"] = {**(kwargs.get("env") or os.environ), _CHILD_MARKER: marker}
    from tests.processes import kill, marked

    with subprocess.Popen(args, **kwargs) as proc:  # on exit: its pipes closed, itself reaped
        try:
            yield proc
        finally:
            left = kill(marked(marker, _CHILD_MARKER))
            assert not left, f"processes that SIGKILL did not end: {left}"


def run_to_end(args: list[str], *, timeout_s: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``args`` run to their end with stdout and stderr captured as text, as ``subprocess.run``
    does, but with the whole process tree killed however the call ends (:func:`started`): a
    command that starts workers leaves none behind when it hangs past ``timeout_s``."""
    with started(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def kill_tree(pid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL the process ``pid`` (one this process started and has not reaped) and all its
    descendants, and wait for them to go."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    assert not alive, f"processes that SIGKILL did not end: {alive}"


def run_naiad_demo(*args: str, cache: Path | str) -> subprocess.CompletedProcess[str]:
    """`python -m naiad ...` with its cache in ``cache``, its whole process tree killed whatever
    happens (the demos' tests)."""
    env = {**os.environ, "NAIAD_CACHE_DIR": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    return run_to_end([sys.executable, "-m", "naiad", *args], timeout_s=280, env=env)


def demo_table_rows(stdout: str, loaders: Sequence[str]) -> dict[str, list[str]]:
    """A demo's table: each loader's row, split into fields after its name."""
    rows = {}
    for line in stdout.splitlines():
        for name in loaders:
            if line.startswith(name + " ") and re.search(r"\d%$", line):
                rows[name] = line[len(name):].split()
    return rows
