"""Does prefetching turn T1 + T2 into max(T1, T2)? And what does telemetry cost?

The question: a training step of T2 = 5 ms (a sleep, standing for the accelerator: the CPU is
free while it runs) is fed by loading that costs T1 = 5 ms of real CPU work per batch. The plain
loop takes T1 + T2 per step; with loading in the background it should take max(T1, T2). The
target: overlapped step <= 1.15 x max(T1, T2).

What makes the overlap real on a 2-core machine: the step leaves the CPU free (a sleep, or a
GPU kernel the CPU waits on), so one core can load while the step runs. The loading must not
hold the GIL for long, or the training thread, waking up from its step, waits for the GIL (up
to ``sys.getswitchinterval()``, 5 ms) before it can take its batch. So the variants:

* ``plain loop``: load, then step. T1 + T2.
* ``prefetch thread, GIL-free load``: DevicePrefetcher's thread runs NumPy ufuncs over large
  arrays, which release the GIL in their inner loops. Expect max(T1, T2).
* ``prefetch thread, GIL-holding load``: the same thread runs a pure-Python loop. Shown to make
  the point: overlap is still partial, but each step's hand-over waits for the GIL.
* ``worker process + prefetch, GIL-holding load``: the pure-Python loop in a torch DataLoader
  worker process (its own GIL), batches through shared memory, then DevicePrefetcher. Expect
  max(T1, T2) plus the inter-process hand-over.
* ``naiad.DataLoader(1 worker, device='cpu')``: the same through naiad's own loader, which
  wraps its workers' batches in a DevicePrefetcher.

Then the same loaders against a step that needs the interpreter (Python between its waits, as a
training step launching kernels does): there a GIL-holding loader thread does slow the step.

Then the telemetry overhead: the calls a loader makes per batch, timed in a tight loop, as a
share of the 100 µs a batch lasts at 10,000 batches per second (target: under 2%), and the
DevicePrefetcher's per-batch cost with and without telemetry.

Run: ``python bench/bench_overlap.py [--steps 100] [--repeats 5]``. Timings are medians over
repeats; the machine is noisy, compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import naiad
from naiad.device.prefetch import DevicePrefetcher
from naiad.telemetry import Telemetry

T_MS = 5.0  # both T1 (loading) and T2 (the step)

_ARRAY = np.random.default_rng(0).random(200_000)
_OUT = np.empty_like(_ARRAY)


def numpy_work(reps: int) -> float:
    """CPU work that releases the GIL: ufuncs over an array too large for one time slice."""
    for _ in range(reps):
        np.sqrt(_ARRAY, out=_OUT)
        np.sin(_OUT, out=_OUT)
    return float(_OUT[0])


def python_work(reps: int) -> float:
    """CPU work that holds the GIL: a pure-Python loop."""
    s = 0
    for i in range(reps):
        s += i * i
    return float(s)


def calibrate(work: Callable[[int], float], target_ms: float) -> int:
    """Repetitions of ``work`` that take ``target_ms`` of CPU time (not wall time, which other
    processes on a shared machine would inflate)."""
    reps = 1
    while True:
        t0 = time.thread_time()
        work(reps)
        if time.thread_time() - t0 > target_ms / 1e3 / 4:
            break
        reps *= 2
    for _ in range(3):
        ms = _median_cpu_ms(lambda r=reps: work(r), 7)
        reps = max(1, round(reps * target_ms / ms))
    return reps


def _median_cpu_ms(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def _median_ms(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


class WorkDataset(Dataset):
    """Item i is batch i: a tensor of 256 rows, made by ``reps`` of ``kind`` work.

    A top-level class so DataLoader worker processes can unpickle it.
    """

    def __init__(self, n: int, kind: str, reps: int) -> None:
        self.n, self.kind, self.reps = n, kind, reps

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        (numpy_work if self.kind == "numpy" else python_work)(self.reps)
        return torch.full((256, 16), float(i))


def timed_loop(batches: Iterable[Any], steps: int, warmup: int = 5) -> float:
    """Median-free single run: ms per step over ``steps`` steps after ``warmup``."""
    it: Iterator[Any] = iter(batches)
    for _ in range(warmup):
        next(it)
        time.sleep(T_MS / 1e3)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
        time.sleep(T_MS / 1e3)  # the step: the accelerator works, the CPU is free
    ms = (time.perf_counter() - t0) / steps * 1e3
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return ms


def overlap_table(steps: int, repeats: int) -> list[tuple[str, float]]:
    torch.set_num_threads(1)  # one core loads, as on the 2-core machines this runs on
    np_reps = calibrate(numpy_work, T_MS)
    py_reps = calibrate(python_work, T_MS)
    n = steps + 10

    def gen(kind: str, reps: int) -> Iterator[torch.Tensor]:
        ds = WorkDataset(n, kind, reps)
        for i in range(n):
            yield ds[i]

    variants: list[tuple[str, Callable[[], Iterable[Any]], str]] = [
        ("plain loop, GIL-free load", lambda: gen("numpy", np_reps), "numpy"),
        (
            "prefetch thread, GIL-free load",
            lambda: DevicePrefetcher(gen("numpy", np_reps), "cpu"),
            "numpy",
        ),
        (
            "prefetch thread, GIL-holding load",
            lambda: DevicePrefetcher(gen("python", py_reps), "cpu"),
            "python",
        ),
        (
            "worker process + prefetch, GIL-holding load",
            lambda: DevicePrefetcher(
                DataLoader(
                    WorkDataset(n, "python", py_reps),
                    batch_size=None,
                    num_workers=1,
                    prefetch_factor=2,
                ),
                "cpu",
            ),
            "python",
        ),
        (
            "naiad.DataLoader(1 worker, device='cpu'), GIL-holding",
            lambda: naiad.DataLoader(
                WorkDataset(n, "python", py_reps), batch_size=None, num_workers=1, device="cpu"
            ),
            "python",
        ),
    ]
    # Machines here are shared and noisy: run the variants round-robin, and measure T1 and T2
    # again in every round, so each ratio compares times taken under the same conditions.
    per_step: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    t1s: dict[str, list[float]] = {"numpy": [], "python": []}
    t2s: list[float] = []
    for _ in range(repeats):
        t1 = {
            "numpy": _median_ms(lambda: numpy_work(np_reps), 11),
            "python": _median_ms(lambda: python_work(py_reps), 11),
        }
        t2 = _median_ms(lambda: time.sleep(T_MS / 1e3), 11)
        for k, v in t1.items():
            t1s[k].append(v)
        t2s.append(t2)
        for name, make, kind in variants:
            ms = timed_loop(make(), steps)
            per_step[name].append(ms)
            ratios[name].append(ms / max(t1[kind], t2))
    med = statistics.median
    print(
        f"T1 = {med(t1s['numpy']):.2f} ms (NumPy, GIL-free), {med(t1s['python']):.2f} ms "
        f"(pure Python); T2 = {med(t2s):.2f} ms (sleep {T_MS:g} ms); medians over {repeats} rounds\n"
    )
    print(f"{'variant':<56}{'ms/step':>9}{'T1+T2':>8}{'/max(T1,T2)':>13}  target <= 1.15")
    rows = []
    for name, _, kind in variants:
        ms, ratio = med(per_step[name]), med(ratios[name])
        verdict = "" if name.startswith("plain") else ("ok" if ratio <= 1.15 else "MISSED")
        both = med(t1s[kind]) + med(t2s)
        print(f"{name:<56}{ms:>9.2f}{both:>8.2f}{ratio:>13.2f}  {verdict}")
        rows.append((name, ms))
    plain = rows[0][1]
    print(
        "\nspeed-up over the plain loop: "
        + ", ".join(f"{n}: {plain / ms:.2f}x" for n, ms in rows[1:])
    )
    return rows


def gil_table(steps: int, repeats: int) -> None:
    """The same loading against a step that needs the interpreter between its waits.

    A real training step launches many kernels from Python: it needs the GIL often, briefly.
    Here: 20 times, 50 µs of Python then a 0.2 ms wait (about 5 ms in all). A loader thread
    that holds the GIL makes each of those 20 returns queue behind it.
    """
    py_reps = calibrate(python_work, T_MS)
    np_reps = calibrate(numpy_work, T_MS)
    launch_reps = calibrate(python_work, 0.05)
    n = steps + 10

    def gen(kind: str, reps: int) -> Iterator[int]:
        work = numpy_work if kind == "numpy" else python_work
        for i in range(n):
            work(reps)
            yield i

    def loop(batches: Iterable[Any]) -> float:
        it = iter(batches)
        for _ in range(5):
            next(it)
        t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
            for _ in range(20):
                python_work(launch_reps)  # launching a kernel: Python, needs the GIL
                time.sleep(0.0002)  # the kernel runs; the CPU waits
        ms = (time.perf_counter() - t0) / steps * 1e3
        close = getattr(it, "close", None)
        if close is not None:
            close()
        return ms

    variants: list[tuple[str, Callable[[], Iterable[Any]]]] = [
        ("the step alone (no loading)", lambda: iter(range(n))),
        ("prefetch thread, GIL-free load", lambda: DevicePrefetcher(gen("numpy", np_reps), "cpu")),
        (
            "prefetch thread, GIL-holding load",
            lambda: DevicePrefetcher(gen("python", py_reps), "cpu"),
        ),
        (
            "naiad.DataLoader(1 worker, device='cpu'), GIL-holding",
            lambda: naiad.DataLoader(
                WorkDataset(n, "python", py_reps), batch_size=None, num_workers=1, device="cpu"
            ),
        ),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(repeats):
        for name, make in variants:
            times[name].append(loop(make()))
    alone = statistics.median(times[variants[0][0]])
    print(f"\na step that needs the GIL 20 times (about {T_MS:g} ms), loading T1 = {T_MS:g} ms:")
    print(f"{'variant':<56}{'ms/step':>9}{'/step alone':>13}")
    for name, _ in variants:
        ms = statistics.median(times[name])
        print(f"{name:<56}{ms:>9.2f}{ms / alone:>13.2f}")


def telemetry_overhead(repeats: int) -> None:
    tel = Telemetry()
    n = 200_000

    def per_batch_calls() -> None:
        # What a loader does per batch: two stages timed in this process (begin/end), the
        # stage timings a worker shipped with the batch (one add_stages), the loop's step.
        begin, end, add_stages, record_step = tel.begin, tel.end, tel.add_stages, tel.record_step
        shipped = {"read": 1e-5, "parse": 1e-5}
        for _ in range(n):
            t0 = begin()
            end("collate", t0)
            t0 = begin()
            end("transfer", t0)
            add_stages(shipped)
            record_step(2e-5, 256)

    def per_stage_adds() -> None:
        add = tel.add
        for _ in range(n):
            add("read", 1e-5)
            add("parse", 1e-5)

    def spans() -> None:
        for _ in range(n):
            with tel.span("collate"):
                pass

    def empty() -> None:
        for _ in range(n):
            pass

    # CPU time of this thread, not wall time: other processes on a shared machine don't count.
    base = _median_cpu_ms(empty, repeats)
    cost_us = (_median_cpu_ms(per_batch_calls, repeats) - base) / n * 1e3
    print(
        f"\ntelemetry calls per batch (2 begin/end, 1 add_stages of 2, 1 record_step): {cost_us:.2f} us"
        f" = {cost_us / 100 * 100:.2f}% of a batch at 10,000 batches/s (target < 2%)"
    )
    span_us = (_median_cpu_ms(spans, repeats) - base) / n * 1e3
    adds_us = (_median_cpu_ms(per_stage_adds, repeats) - base) / n * 1e3
    print(f"the same 2 stages as 2 add() calls instead of 1 add_stages(): {adds_us:.2f} us")
    print(f"one `with tel.span(...)`: {span_us:.2f} us (begin/end is the cheaper form)")

    batches = [torch.zeros(1)] * 50_000

    def drain(telemetry: Telemetry | None) -> float:
        # CPU time of the process: the consumer and the prefetch thread together.
        t0 = time.process_time()
        for _ in DevicePrefetcher(batches, "cpu", depth=8, telemetry=telemetry):
            pass
        return (time.process_time() - t0) / len(batches) * 1e6

    pairs = [(drain(None), drain(Telemetry())) for _ in range(max(9, repeats))]  # interleaved
    without = statistics.median(p[0] for p in pairs)
    with_tel = statistics.median(p[1] for p in pairs)
    print(
        f"DevicePrefetcher(cpu) CPU time per batch, nothing else to do: {without:.1f} us without telemetry, "
        f"{with_tel:.1f} us with ({with_tel - without:+.1f} us; "
        f"{(with_tel - without) / 100 * 100:+.1f}% of a 100 us batch)"
    )


def environment() -> str:
    """Machine, versions, git SHA and date, for the results file."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()} {os.cpu_count()} cores "
        f"({platform.processor() or platform.platform()}), {gpu}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}, git {sha}, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps per run (default 50)")
    parser.add_argument(
        "--repeats", type=int, default=15, help="rounds of all variants (default 15)"
    )
    parser.add_argument("--skip-telemetry", action="store_true")
    args = parser.parse_args()
    print(environment())
    print(f"command: python bench/bench_overlap.py {' '.join(sys.argv[1:])}\n")
    overlap_table(args.steps, args.repeats)
    gil_table(args.steps, max(3, args.repeats // 3))
    if not args.skip_telemetry:
        telemetry_overhead(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
