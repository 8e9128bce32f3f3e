"""naiad's threads never run Python's parser (``ast.parse``), so they can never break the training
thread's own parses on Python 3.11 (CPython gh-106905: one depth counter per interpreter, so two
parses at once raise ``SystemError: AST constructor recursion depth mismatch``; a CI run failed
so in pytest's import of a module). What used to parse in a thread: a thread worker putting its
task's traceback into words (NOTE [ Tracebacks cross processes only ] in parallel/protocol.py),
NumPy reading an ``.npy`` header (NOTE [ npy headers without ast ] in trust/npy_header.py).

A fresh interpreter records every call of ``ast.parse`` in a thread other than the main one
(``threading.setprofile`` reaches each thread started after it) while thread workers fail tasks
and read ``.npy`` files and token arrays, read-ahead on."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_to_end

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import json, os, sys, threading
    calls = {}
    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == "parse" and code.co_filename.endswith(os.sep + "ast.py"):
            caller = frame.f_back.f_code
            key = f"{threading.current_thread().name}: {caller.co_filename}:{caller.co_name}"
            calls[key] = calls.get(key, 0) + 1
    threading.setprofile(profile)

    import numpy as np
    import naiad

    folder, = sys.argv[1:]
    failures = 0

    class Flaky:
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if i % 5 == 0:
                raise ValueError(f"sample {i} is bad")
            return np.full(4, i, np.int64)

    # A thread worker's failed task: the consumer gets the exception, the epoch goes on.
    loader = naiad.DataLoader(Flaky(), batch_size=4, num_workers=2, worker_mode="thread")
    it = iter(loader)
    while True:
        try:
            next(it)
        except StopIteration:
            break
        except ValueError as exc:
            assert "is bad" in str(exc)
            failures += 1

    # .npy files and token arrays opened in worker and read-ahead threads.
    for i in range(4):
        np.save(os.path.join(folder, f"x{i}.npy"), np.arange(i * 1000, (i + 1) * 1000, dtype=np.float32).reshape(-1, 2))
        np.save(os.path.join(folder, f"t{i}.npy"), np.arange(5000, dtype=np.uint16))
    rows = 0
    for epoch in range(2):
        source = naiad.read_npy(os.path.join(folder, "x*.npy"), block_rows=50)
        for batch in naiad.DataLoader(source, batch_size=32, num_workers=2, worker_mode="thread", shuffle=True, seed=epoch):
            rows += len(next(iter(batch.values())))
    windows = 0
    tokens = naiad.read_tokens(os.path.join(folder, "t*.npy"), seq_len=64)
    for batch in naiad.DataLoader(tokens, batch_size=8, num_workers=2, worker_mode="thread"):
        windows += 1
    mains = {k: v for k, v in calls.items() if k.startswith("MainThread:")}
    print(json.dumps({"failures": failures, "rows": rows, "windows": windows,
                      "in_threads": {k: v for k, v in calls.items() if k not in mains}}))
""")


def test_no_naiad_thread_runs_the_python_parser(tmp_path: Path) -> None:
    proc = run_to_end([sys.executable, "-c", SCRIPT, str(tmp_path)], timeout_s=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failures"] == 13 and got["rows"] == 2 * 2000 and got["windows"] > 0, got
    assert got["in_threads"] == {}, f"ast.parse ran in naiad's threads: {got['in_threads']}"
