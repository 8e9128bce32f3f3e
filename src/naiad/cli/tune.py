"""``naiad tune``: sweep worker counts, modes and prefetch depths on your data; recommend one.

Instead of changing ``num_workers`` by hand and timing each run, ``naiad tune SOURCE`` runs the
same loop for every setting: a few seconds each, with ``--step-ms`` of training step (a sleep,
standing for the accelerator: the CPU is free meanwhile). Per setting it reports the rows per
second, the time the loop waited for each batch, the CPU the loader used (training process plus
workers, 100% = one core), the peak memory (proportional set size, so pages shared by forked
workers count once) and the time to the first batch. It recommends the cheapest setting (fewest
workers, threads before processes, shallow prefetch) within 5% of the best throughput.

    naiad tune demo --step-ms 2
    naiad tune "data/*.parquet" --batch-size 512 --json tune.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import threading
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NAME = "tune"
HELP = "Sweep num_workers, worker_mode and prefetch_factor on a source; recommend a setting."

# Settings within this fraction of the best throughput count as equally fast.
_TOLERANCE = 0.05


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("process", "thread")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are 'process' and 'thread', got {text!r}")
    return modes


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad tune`` options to ``parser``."""
    parser.add_argument("source", help="'demo' (built-in diabetes-shaped CSV), a file, or a glob")
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the demo data (default 200,000)")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    parser.add_argument(
        "--step-ms", type=float, default=0.0,
        help="synthetic training step per batch, in ms: a sleep, the CPU stays free (default 0)",
    )
    parser.add_argument(
        "--load", choices=("stream", "memory"), default="stream",
        help="stream the file with naiad's reader (default), or load it into a TensorDataset "
        "first, as the PyTorch tutorial does (CSV and Parquet)",
    )
    parser.add_argument(
        "--workers", type=_ints, default=None,
        help=f"worker counts to try (default 0..{_usable_cores()}, the usable cores)",
    )
    parser.add_argument("--modes", type=_modes, default=["process", "thread"], help="default process,thread")
    parser.add_argument("--prefetch", type=_ints, default=[2, 4], help="prefetch_factor values (default 2,4)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per setting (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


@dataclass(frozen=True)
class Setting:
    """One point of the sweep."""

    num_workers: int
    worker_mode: str
    prefetch_factor: int | None

    def words(self) -> str:
        if self.num_workers == 0:
            return "num_workers=0"
        return f"num_workers={self.num_workers}, worker_mode={self.worker_mode!r}, prefetch_factor={self.prefetch_factor}"

    def cost(self) -> tuple[int, int, int]:
        # Fewer workers first; a thread shares the process's memory, a process does not.
        return (self.num_workers, 0 if self.worker_mode == "thread" else 1, self.prefetch_factor or 0)


@dataclass
class Measurement:
    """What one setting gave."""

    setting: Setting
    rows_per_s: float
    wait_ms_per_step: float
    cpu_percent: float
    peak_mem_mb: float
    first_batch_s: float
    steps: int


def settings_for(workers: list[int], modes: list[str], prefetch: list[int]) -> list[Setting]:
    """Every combination, with 0 workers once (it has no mode and no prefetch)."""
    out = []
    for w in sorted(set(workers)):
        if w == 0:
            out.append(Setting(0, "inline", None))
            continue
        for m in modes:
            for p in sorted(set(prefetch)):
                out.append(Setting(w, m, max(1, p)))
    return out


def load_source(spec: str, *, rows: int, load: str) -> tuple[Any, str]:
    """The dataset to sweep on, and words describing it."""
    import naiad
    from naiad.errors import ConfigError

    if spec == "demo":
        from naiad.datasets import diabetes_csv

        paths = [str(diabetes_csv(rows=rows))]
        words = f"demo (diabetes-shaped CSV, {rows:,} rows)"
    else:
        paths = sorted(glob.glob(spec)) or ([spec] if Path(spec).exists() else [])
        if not paths:
            raise ConfigError(f"`source` must be 'demo', a file or a glob that matches files, got {spec!r}.")
        words = paths[0] if len(paths) == 1 else f"{spec} ({len(paths)} files)"
    suffix = Path(paths[0]).suffix.lower()
    if load == "memory":
        return _in_memory(paths, suffix), words + ", in memory"
    return naiad.read(paths if len(paths) > 1 else paths[0]), words + ", streamed"


def _in_memory(paths: list[str], suffix: str) -> Any:
    # The tutorial's way: the whole table in memory, features float32, the last column the label.
    import numpy as np
    import pyarrow as pa
    import torch
    from torch.utils.data import TensorDataset

    from naiad.errors import ConfigError

    if suffix in (".csv", ".tsv"):
        import pyarrow.csv as pacsv

        opts = pacsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
        table = pa.concat_tables([pacsv.read_csv(p, parse_options=opts) for p in paths])
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pa.concat_tables([pq.read_table(p) for p in paths])
    else:
        raise ConfigError(f"`--load memory` reads CSV and Parquet, got {suffix!r}; use --load stream.")
    columns = [np.asarray(c.to_numpy(zero_copy_only=False), dtype=np.float32) for c in table.columns]
    x = np.column_stack(columns[:-1]) if len(columns) > 1 else columns[0][:, None]
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(columns[-1])))


def _rows(batch: Any) -> int:
    from naiad.tree import count_rows

    return count_rows(batch) or 0


class _Sampler:
    """Samples CPU time and proportional memory of this process and its children, in a thread."""

    def __init__(self, interval_s: float = 0.2) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self._interval_s = interval_s
        self._cpu: dict[int, float] = {}
        self._base: dict[int, float] = {}
        self.peak_mem = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="naiad-tune-sampler", daemon=True)

    def __enter__(self) -> _Sampler:
        self._base = {self._me.pid: self._cpu_of(self._me)}
        for c in self._me.children(recursive=True):  # e.g. a forkserver: not this setting's
            try:
                self._base[c.pid] = self._cpu_of(c)
            except self._psutil.Error:
                pass
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    @staticmethod
    def _cpu_of(p: Any) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    def sample(self) -> None:
        mem = 0
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                self._cpu[p.pid] = self._cpu_of(p)
                info = p.memory_full_info()
                mem += getattr(info, "pss", info.rss)
            except self._psutil.Error:
                pass  # it ended between the listing and the reading
        self.peak_mem = max(self.peak_mem, mem)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def __exit__(self, *exc: object) -> None:
        self.sample()
        self.wall_s = time.perf_counter() - self._t0
        self._stop.set()
        self._thread.join()

    @property
    def cpu_percent(self) -> float:
        used = sum(cpu - self._base.get(pid, 0.0) for pid, cpu in self._cpu.items())
        return 100.0 * used / self.wall_s if self.wall_s > 0 else 0.0


def measure(dataset: Any, setting: Setting, *, batch_size: int, step_s: float, seconds: float) -> Measurement:
    """Run the loop for ``seconds`` (after the first batch) in one setting."""
    import naiad

    kwargs: dict[str, Any] = {}
    if setting.num_workers:
        kwargs = dict(worker_mode=setting.worker_mode, prefetch_factor=setting.prefetch_factor, persistent_workers=True)
    with _Sampler() as sampler:
        t0 = time.perf_counter()
        loader: naiad.DataLoader[Any] = naiad.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, seed=0, num_workers=setting.num_workers, **kwargs
        )

        def batches() -> Generator[Any, None, None]:
            while True:  # as many epochs as the time allows
                yield from loader

        it = batches()
        first = next(it)
        first_s = time.perf_counter() - t0
        rows = _rows(first)
        steps, wait_s = 0, 0.0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            if step_s:
                time.sleep(step_s)
            t = time.perf_counter()
            if t >= deadline:
                break
            batch = next(it)
            wait_s += time.perf_counter() - t
            rows += _rows(batch)
            steps += 1
        elapsed = time.perf_counter() - start
        it.close()
        loader.close()  # noqa: SLF001 - persistent workers end with the setting
    return Measurement(
        setting=setting,
        rows_per_s=rows / elapsed if elapsed > 0 else 0.0,
        wait_ms_per_step=1e3 * wait_s / max(1, steps),
        cpu_percent=sampler.cpu_percent,
        peak_mem_mb=sampler.peak_mem / 2**20,
        first_batch_s=first_s,
        steps=steps,
    )


def recommend(results: list[Measurement]) -> Measurement:
    """The cheapest setting within 5% of the best throughput."""
    best = max(r.rows_per_s for r in results)
    fast = [r for r in results if r.rows_per_s >= (1 - _TOLERANCE) * best]
    return min(fast, key=lambda r: r.setting.cost())


def format_table(results: list[Measurement], chosen: Measurement) -> str:
    """The sweep as an aligned text table; the recommended row is starred."""
    header = ["", "workers", "mode", "prefetch", "rows/s", "wait/step ms", "CPU %", "peak mem MB", "first batch s"]
    rows = []
    for r in results:
        s = r.setting
        rows.append([
            "*" if r is chosen else "",
            str(s.num_workers),
            s.worker_mode if s.num_workers else "-",
            str(s.prefetch_factor) if s.prefetch_factor else "-",
            f"{r.rows_per_s:,.0f}",
            f"{r.wait_ms_per_step:.3f}",
            f"{r.cpu_percent:.0f}",
            f"{r.peak_mem_mb:,.0f}",
            f"{r.first_batch_s:.2f}",
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


class _Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per step otherwise)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.tty = sys.stderr.isatty()

    def show(self, done: int, words: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * done // max(1, self.total)
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {words}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            if done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    """Run ``naiad tune``; the exit status."""
    from naiad.errors import ConfigError, NaiadError

    if args.batch_size < 1:
        print(f"naiad tune: `--batch-size` must be >= 1, got {args.batch_size}.", file=sys.stderr)
        return 2
    if args.seconds <= 0:
        print(f"naiad tune: `--seconds` must be > 0, got {args.seconds}.", file=sys.stderr)
        return 2
    try:
        dataset, words = load_source(args.source, rows=args.rows, load=args.load)
    except (ConfigError, NaiadError, OSError) as exc:
        print(f"naiad tune: {exc}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else list(range(_usable_cores() + 1))
    sweep = settings_for(workers, args.modes, args.prefetch)
    print(f"naiad tune: {words}; batch size {args.batch_size}; step {args.step_ms:g} ms; "
          f"{len(sweep)} settings, {args.seconds:g} s each; {_usable_cores()} usable cores")
    progress = _Progress(len(sweep), not args.no_progress)
    results = []
    for i, setting in enumerate(sweep):
        progress.show(i, setting.words())
        results.append(
            measure(dataset, setting, batch_size=args.batch_size, step_s=args.step_ms / 1e3, seconds=args.seconds)
        )
    progress.show(len(sweep), "done")
    chosen = recommend(results)
    print(format_table(results, chosen))
    inline = next((r for r in results if r.setting.num_workers == 0), None)
    gain = f" ({chosen.rows_per_s / inline.rows_per_s:.2f}x the rows/s of num_workers=0)" if inline and inline is not chosen else ""
    print(f"\nRecommended: naiad.DataLoader(..., {chosen.setting.words()}){gain}")
    print(f"  the cheapest setting within {_TOLERANCE:.0%} of the best rows/s; "
          f"the loop waits {chosen.wait_ms_per_step:.3f} ms per step there.")
    if args.json:
        payload = {
            "source": words,
            "batch_size": args.batch_size,
            "step_ms": args.step_ms,
            "results": [{**asdict(r.setting), **{k: v for k, v in asdict(r).items() if k != "setting"}} for r in results],
            "recommended": asdict(chosen.setting),
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return 0
