"""Shared benchmark harness: the environment a result came from, medians, and a table.

Every benchmark prints `environment()` first, so a number in bench/RESULTS.md always comes with
its machine, versions, git commit and date.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any


def environment() -> str:
    """One line: date, machine, cores, Python, torch, numpy, pyarrow, naiad's git commit."""
    import numpy
    import pyarrow
    import torch

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return (
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC | {platform.machine()} {platform.processor() or ''}"
        f" {os.cpu_count()} cores | Python {platform.python_version()} | torch {torch.__version__}"
        f" | numpy {numpy.__version__} | pyarrow {pyarrow.__version__} | naiad @ {sha}"
    )


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def tree_cpu_s() -> float:
    """CPU seconds of this process and its live children (the loaders' worker processes)."""
    import psutil  # here: the device check's benchmarks import this module without it

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a child that ended meanwhile
            pass
    return total


def epoch_rate(loader: Iterable[Any], expected: int, count: Callable[[Any], int]) -> tuple[float, float]:
    """Items per wall second and per CPU second of the process tree over one epoch of
    ``loader``, ``count(batch)`` items a batch; an epoch of other than ``expected`` items raises."""
    t0, c0 = time.perf_counter(), tree_cpu_s()
    seen = 0
    for batch in loader:
        seen += count(batch)
    elapsed, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
    if seen != expected:
        raise RuntimeError(f"an epoch delivered {seen} items, expected {expected}")
    return expected / elapsed, expected / max(1e-9, cpu)


def compare_epochs(made: dict[str, Any], expected: int, count: Callable[[Any], int], rounds: int,
                   baseline: str) -> list[list[Any]]:
    """Each loader of ``made`` over whole epochs, side by side: a warm-up epoch each, then
    ``rounds`` epochs each with the loaders alternating; each closed after (those that close).
    One row per loader: ``[name, rate, vs baseline, rate per CPU s, vs baseline, each round vs
    the baseline's median]``, medians of the rounds (:func:`epoch_rate`)."""
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in made}
    try:
        for loader in made.values():
            epoch_rate(loader, expected, count)  # warm-up: workers started, files in the page cache
        for _ in range(rounds):
            for name, loader in made.items():
                rates[name].append(epoch_rate(loader, expected, count))
    finally:
        for loader in made.values():
            close = getattr(loader, "close", None)
            if close is not None:
                close()
    base = statistics.median(w for w, _ in rates[baseline])
    base_cpu = statistics.median(c for _, c in rates[baseline])
    rows = []
    for name, got in rates.items():
        wall, cpu = statistics.median(w for w, _ in got), statistics.median(c for _, c in got)
        runs = ", ".join(f"{w / base:.2f}" for w, _ in got)
        rows.append([name, f"{wall:,.0f}", f"{wall / base:.2f}x", f"{cpu:,.0f}", f"{cpu / base_cpu:.2f}x", runs])
    return rows
