"""Run one step of bench/bench_peers.py in a new process and watch its process tree's memory.

Used by the driver only (it needs psutil, which the peers' environments need not have).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

PEERS_DIR = os.path.dirname(os.path.abspath(__file__))
SRC_DIR = os.path.join(os.path.dirname(os.path.dirname(PEERS_DIR)), "src")


@dataclass
class TreeMemory:
    """Peak sums of PSS and RSS over a process and its descendants, sampled on a thread."""

    pid: int
    interval_s: float = 0.05
    peak_pss: int = 0
    peak_rss: int = 0
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Sample until ``stop()``."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            pss = rss = 0
            for proc in procs:
                self.seen.setdefault(proc.pid, proc)
                p, r = _pss_rss(proc.pid)
                pss, rss = pss + p, rss + r
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self._stop.wait(self.interval_s)


def _pss_rss(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of one process in bytes; (0, 0) once it is gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss


def run_child(python: str, step: str, runner_module: str, opts: dict[str, Any], paths: dict[str, Any],
              work: str, timeout_s: float) -> dict[str, Any]:
    """Run bench/peers/run_one.py in a new process; its result, peak memory, or the error."""
    os.makedirs(work, exist_ok=True)
    result_json, ids_npz = os.path.join(work, "result.json"), os.path.join(work, "ids.npz")
    for stale in (result_json, ids_npz):
        if os.path.exists(stale):
            os.remove(stale)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PEERS_DIR, SRC_DIR]), PYTHONUNBUFFERED="1")
    cmd = [python, os.path.join(PEERS_DIR, "run_one.py"), step, runner_module, json.dumps(opts),
           json.dumps(paths), result_json, ids_npz]
    with open(os.path.join(work, "stdout.txt"), "w") as out, open(os.path.join(work, "stderr.txt"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=work, start_new_session=True)
        memory = TreeMemory(proc.pid)
        memory.start()
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # Ctrl-C included: the child is in a session of its own and would outlive us
            memory.stop()
            _end_leftovers(proc, memory)
    if rc != 0:
        lines = [ln for ln in open(os.path.join(work, "stderr.txt")).read().splitlines() if ln.strip()]
        why = f"timed out after {timeout_s:.0f} s" if rc is None else (lines[-1] if lines else f"exit code {rc}")
        return {"error": why[:240]}
    result = json.load(open(result_json))
    result["peak_pss_mb"], result["peak_rss_mb"] = memory.peak_pss / 1e6, memory.peak_rss / 1e6
    if step == "epoch":
        with np.load(ids_npz) as f:
            result["ids"], result["lengths"] = f["ids"], f["lengths"]
    return result


def _end_leftovers(proc: subprocess.Popen[bytes], memory: TreeMemory) -> None:
    """Terminate, then kill, what the child started and left running (or the child, after a timeout)."""
    alive = [p for p in memory.seen.values() if p.is_running()]
    if proc.poll() is None:
        alive.append(psutil.Process(proc.pid))
    for p in alive:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=5)
    for p in still:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
