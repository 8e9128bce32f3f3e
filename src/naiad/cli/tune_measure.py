"""What ``naiad tune`` measures: the data it sweeps on (:class:`Target`), one setting's loop run
for a few seconds on a fresh reader with the process tree's CPU time and memory sampled
(:func:`measure`), and each block size's and buffer's shuffle figures from a dry run
(:func:`shuffle_figures`)."""

from __future__ import annotations

import glob
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from naiad.cli.tune_report import Measurement, Setting

__all__ = ["Target", "load_source", "measure", "shuffle_figures"]


@dataclass
class Target:
    """What ``naiad tune`` sweeps on: the files, and the dataset each setting rebuilds from them."""

    words: str
    paths: list[str]
    memory: Any = None
    """The ``TensorDataset`` with ``--load memory``; None when streamed."""
    source: Any = None
    """A streaming source with the reader's defaults, kept to name them after the sweep."""

    @property
    def line_blocks(self) -> bool:
        """Whether ``block_bytes`` applies: CSV, JSONL and text readers cut blocks of lines."""
        return self.source is not None and hasattr(self.source, "block_bytes")

    def dataset(self, block_bytes: int | None) -> Any:
        """A fresh dataset: ``naiad.read(paths)``, with ``block_bytes`` only when not the default."""
        if self.memory is not None:
            return self.memory
        import naiad

        spec = self.paths if len(self.paths) > 1 else self.paths[0]
        return naiad.read(spec) if block_bytes is None else naiad.read(spec, block_bytes=block_bytes)

    def default_block_bytes(self) -> int | None:
        """The median block size the reader's default gives (None: not a line source, or compressed)."""
        if not self.line_blocks:
            return None
        sizes = sorted(b.stop - b.start for b in self.source.blocks() if b.stop >= 0)
        return sizes[len(sizes) // 2] if sizes else None


def load_source(spec: str, *, rows: int, load: str) -> Target:
    """The data to sweep on, described."""
    from naiad.errors import ConfigError

    if spec == "demo":
        from naiad.cli.demo_data import diabetes_csv

        paths = [str(diabetes_csv(rows=rows))]
        words = f"demo (diabetes-shaped CSV, {rows:,} rows)"
    else:
        paths = sorted(glob.glob(spec)) or ([spec] if Path(spec).exists() else [])
        if not paths:
            raise ConfigError(f"`source` must be 'demo', a file or a glob that matches files, got {spec!r}.")
        words = paths[0] if len(paths) == 1 else f"{spec} ({len(paths)} files)"
    suffix = Path(paths[0]).suffix.lower()
    if load == "memory":
        return Target(words + ", in memory", paths, memory=_in_memory(paths, suffix))
    target = Target(words + ", streamed", paths)
    target.source = target.dataset(None)
    return target


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


def shuffle_figures(source: Any, shuffle_buffer: int | None, batch_size: int, epochs: int = 2) -> tuple[float, float]:
    """``(corr, span)`` of the order ``naiad.DataLoader(source, batch_size=batch_size, shuffle=True,
    seed=0, shuffle_buffer=shuffle_buffer)`` delivers: the largest ``|corr(position, row)|`` and
    the least batch span over its first ``epochs`` epochs.

    From the coverage check's dry run (NOTE [ Coverage check ]): the plan and the shuffle buffer
    over row numbers, no row read. Workers never change the order, so a block size and a buffer
    have one figure whatever the workers.
    """
    import numpy as np

    from naiad.tools.coverage import PositionSource, Topology, planned_batches
    from naiad.tools.coverage_report import shuffle_quality_of

    pos = PositionSource(source)
    topology = Topology(1, batch_size=batch_size, shuffle_buffer=shuffle_buffer)
    corr, span = 0.0, 1.0
    for epoch in range(epochs):
        batches = planned_batches(pos, topology, 0, epoch=epoch)
        sizes = np.fromiter((len(b) for b in batches), np.int64, count=len(batches))
        rows = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        q = shuffle_quality_of([(rows, sizes)], len(rows))
        corr = max(corr, q.pearson, key=abs)
        span = min(span, q.batch_span)
    return corr, span


def _rows(batch: Any) -> int:
    from naiad.device.tree import count_rows

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


def _join_worker_threads(timeout_s: float = 30.0) -> None:
    # close() waits 1 s for thread workers; on a busy machine one may still be parsing a queued
    # block. It would take CPU from the next setting, and a thread still inside PyArrow when the
    # interpreter exits aborts it, so wait for them.
    deadline = time.monotonic() + timeout_s
    for t in threading.enumerate():
        if t.name.startswith("naiad-worker-") and t is not threading.current_thread():
            t.join(timeout=max(0.0, deadline - time.monotonic()))


def measure(target: Target, setting: Setting, *, batch_size: int, step_s: float, seconds: float) -> Measurement:
    """Run the loop for ``seconds`` (after the first batch) in one setting, on a fresh dataset.

    Options at their default are not passed, so :data:`DEFAULTS` runs exactly
    ``naiad.DataLoader(naiad.read(path), batch_size=B, shuffle=True, seed=0)``.
    """
    import naiad

    kwargs: dict[str, Any] = {}
    if setting.num_workers:
        kwargs = dict(num_workers=setting.num_workers, worker_mode=setting.worker_mode,
                      prefetch_factor=setting.prefetch_factor, persistent_workers=True)
    if setting.shuffle_buffer is not None:
        kwargs["shuffle_buffer"] = setting.shuffle_buffer
    with _Sampler() as sampler:
        t0 = time.perf_counter()  # building the reader counts towards the first batch
        dataset = target.dataset(setting.block_bytes)
        loader: naiad.DataLoader[Any] = naiad.DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=0, **kwargs)

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
        _join_worker_threads()
    return Measurement(
        setting=setting,
        rows_per_s=rows / elapsed if elapsed > 0 else 0.0,
        wait_ms_per_step=1e3 * wait_s / max(1, steps),
        cpu_percent=sampler.cpu_percent,
        peak_mem_mb=sampler.peak_mem / 2**20,
        first_batch_s=first_s,
        steps=steps,
    )
