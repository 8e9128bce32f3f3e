"""``naiad bench``: how long does the training loop wait for data, serial against naiad?

Runs the same source and the same training step twice and prints, side by side:

* **serial**: the plain loop users write first: ``torch.utils.data.DataLoader`` with no
  workers, then ``batch.to(device)``, then the step; loading and training take turns;
* **naiad**: ``naiad.DataLoader(..., device=...)``, which prefetches to the device, so
  loading overlaps the step; its ``stats()`` tell how long its stages took.

For each: total time, time per step, the time spent loading data, and the *exposed* wait: the
part of loading the training loop actually waited for. The step is a synthetic one of
``--step-ms`` (a sleep on the CPU, a GPU kernel of that length with ``--device cuda``), or with
``--train`` a real small MLP training step on the batch's first tensor.

Example:
    naiad bench demo --step-ms 5 --load-ms 5
    naiad bench "data/*.parquet" --batch-size 1024 --num-workers 2 --plot wait.png
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

import naiad
from naiad.cli.bench_report import RunResult, format_table, load_pyplot, plot_waits
from naiad.cli.steps import Step, synthetic_step, training_step
from naiad.device.transfer import move_to_device
from naiad.errors import ConfigError

NAME = "bench"
HELP = "Measure the time a training loop waits for data, serial against naiad."

__all__ = [
    "HELP",
    "NAME",
    "add_arguments",
    "measure",
    "resolve_source",
    "run",
]



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``naiad bench``'s arguments to ``parser``."""
    parser.add_argument(
        "source",
        help="a file or glob (.csv, .tsv, .parquet, .arrow, .jsonl, .npy), or 'demo' for built-in data",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
    parser.add_argument(
        "--batches", type=int, default=200, help="measured steps per run (default 200)"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="steps run before measuring (default 5)"
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=5.0,
        help="length of the synthetic training step (default 5)",
    )
    parser.add_argument(
        "--train", action="store_true", help="a real step: a small MLP on the batch's first tensor"
    )
    parser.add_argument(
        "--load-ms",
        type=float,
        default=0.0,
        help="added latency per batch, standing for slow storage (a sleep; default 0)",
    )
    parser.add_argument(
        "--rows", type=int, default=100_000, help="rows of the demo data (default 100000)"
    )
    parser.add_argument(
        "--num-workers", type=int, default=0, help="naiad's loading workers (default 0)"
    )
    parser.add_argument("--shuffle", action="store_true", help="shuffle the rows")
    parser.add_argument(
        "--device",
        default=None,
        help="where batches go: cpu or cuda (default: cuda when available)",
    )
    parser.add_argument("--depth", type=int, default=2, help="batches prefetched ahead (default 2)")
    parser.add_argument(
        "--plot", metavar="PNG", help="draw the wait per step to this file (matplotlib)"
    )
    parser.add_argument(
        "--trace", metavar="JSON", help="write naiad's run as a Chrome trace (open it in Perfetto)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


# --------------------------------------------------------------------------------------------
# Sources.


class _LatencyDataset(Dataset[Any]):
    """A dataset whose every batch costs ``latency_s`` more, like a read from slow storage.

    The latency is a sleep, which releases the GIL the way waiting on I/O does.
    """

    def __init__(self, base: Any, latency_s: float) -> None:
        self.base = base
        self.latency_s = latency_s

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        return self.base[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        time.sleep(self.latency_s)
        getitems = getattr(self.base, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [self.base[i] for i in indices]


def resolve_source(spec: str, *, rows: int = 100_000, load_ms: float = 0.0) -> tuple[Any, str]:
    """The dataset ``naiad bench`` measures, and a few words describing it.

    ``"demo"`` is naiad's built-in diabetes-shaped table (8 float features and a 0/1 label, see
    :mod:`naiad.cli.demo_data`), in memory. A path or glob becomes a streaming source, from naiad's
    reader for its suffix (``naiad.read_csv``, ``read_parquet``, ``read_arrow``,
    ``read_jsonl``, ``read_npy``).

    Args:
        spec: ``"demo"``, a file path, or a glob.
        rows: rows of the demo data.
        load_ms: latency added to each batch (see ``--load-ms``).

    Example:
        >>> ds, words = resolve_source("demo", rows=1000)
        >>> len(ds), words
        (1000, 'demo (1,000 rows: 8 float features, 1 label)')
    """
    if spec == "demo":
        from naiad.cli.demo_data import DIABETES_COLUMNS, make_diabetes_table

        table = make_diabetes_table(rows)
        features = np.column_stack([table.column(c).to_numpy() for c in DIABETES_COLUMNS[:-1]])
        labels = np.array(table.column(DIABETES_COLUMNS[-1]).to_numpy())  # a writable copy
        dataset: Any = TensorDataset(torch.from_numpy(features), torch.from_numpy(labels))
        words = f"demo ({rows:,} rows: {features.shape[1]} float features, 1 label)"
    else:
        paths = sorted(glob.glob(spec)) or ([spec] if Path(spec).exists() else [])
        if not paths:
            raise ConfigError(
                f"`source` must be 'demo', a file or a glob that matches files, got {spec!r}."
            )
        dataset, words = _read_files(spec, paths)
    if load_ms > 0:
        if not isinstance(dataset, Dataset):
            raise ConfigError("`--load-ms` applies to 'demo' only, not to a file source.")
        dataset = _LatencyDataset(dataset, load_ms / 1e3)
        words += f", +{load_ms:g} ms per batch"
    return dataset, words


def _read_files(spec: str, paths: list[str]) -> tuple[Any, str]:
    from naiad.sources.auto import reader_name

    source = naiad.read(spec)
    return source, f"{len(paths)} {Path(paths[0]).suffix.lower()} file(s) read by naiad.{reader_name(spec)}"


# --------------------------------------------------------------------------------------------
# Loaders: the plain one, and naiad's.


def _serial_loader(dataset: Any, args: argparse.Namespace) -> Iterable[Any]:
    """The loop without overlap: torch's DataLoader where it can read the data, else (a file
    source torch cannot read) naiad's loader with no workers and no device prefetch."""
    if isinstance(dataset, Dataset):
        return torch.utils.data.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=args.shuffle
        )
    return naiad.DataLoader(dataset, batch_size=args.batch_size, shuffle=args.shuffle)


def _naiad_loader(dataset: Any, args: argparse.Namespace, device: torch.device) -> naiad.DataLoader[Any]:
    """naiad's loader over ``dataset``, prefetching to ``device``; it keeps its own stats."""
    return naiad.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        num_workers=args.num_workers,
        device=device,
        device_prefetch=args.depth,
    )


# --------------------------------------------------------------------------------------------
# Measuring.


def measure(
    name: str,
    batches: Iterable[Any],
    step: Step,
    *,
    steps: int,
    warmup: int = 0,
    move: Callable[[Any], Any] | None = None,
) -> RunResult:
    """Run ``warmup + steps`` steps of ``for batch in batches: step(move(batch))`` and time them.

    The wait of a step is the time in ``next()`` plus ``move`` (a synchronous copy to the device
    in a plain loop): everything the loop does before it can train. The source repeats when it
    runs out before ``steps``.

    Example:
        >>> r = measure("serial", [1, 2, 3], lambda b: None, steps=5)
        >>> r.steps
        5
    """
    result = RunResult(name)
    perf = time.perf_counter
    it: Iterator[Any] = iter(batches)
    t_start = perf()
    for i in range(warmup + steps):
        if i == warmup:
            t_start = perf()
        t0 = perf()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(batches)  # a new epoch; its start-up cost is part of loading
            batch = next(it)
        if move is not None:
            batch = move(batch)
        t1 = perf()
        step(batch)
        t2 = perf()
        if i >= warmup:
            result.waits_s.append(t1 - t0)
            result.steps_s.append(t2 - t1)
    result.total_s = perf() - t_start
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return result


def _run_both(
    args: argparse.Namespace, dataset: Any, device: torch.device, step: Step
) -> list[RunResult]:
    steps, warmup = args.batches, args.warmup

    def to_device(batch: Any) -> Any:
        moved = move_to_device(batch, device)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # what a plain .to() costs the loop
        return moved

    serial = measure(
        "serial", _serial_loader(dataset, args), step, steps=steps, warmup=warmup, move=to_device
    )
    serial.load_s = sum(serial.waits_s)
    serial.how = (
        "torch DataLoader (no workers)"
        if isinstance(dataset, Dataset)
        else "naiad.DataLoader (no workers)"
    ) + ", then .to(device), then the step, one after the other"

    loader = _naiad_loader(dataset, args, device)
    overlapped = measure("naiad", loader, step, steps=steps, warmup=warmup)
    overlapped.how = (
        f"naiad.DataLoader(device={str(device)!r}), {_workers(args.num_workers)}; loading and the copy to the "
        "device run in the background while the step runs"
    )
    stats = loader.stats()
    if args.trace:
        loader.export_trace(args.trace)
    overlapped.stats = stats.to_dict()
    # Time the pipeline worked for these batches, wherever it ran (threads, workers).
    # Includes the warm-up steps' loading, so scale to the measured share.
    work = sum(s.seconds for s in stats.stages.values())
    if stats.batches:
        overlapped.load_s = work * min(1.0, steps / stats.batches)
    return [serial, overlapped]


# --------------------------------------------------------------------------------------------
# Output.


def _workers(n: int) -> str:
    return "no workers" if n == 0 else f"{n} worker{'s' if n > 1 else ''}"


def run(args: argparse.Namespace) -> int:
    """Run ``naiad bench``; returns the exit status."""
    try:
        plt = _check_arguments(args)
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise _Refused("--device cuda, but CUDA is not available; use --device cpu.")
        dataset, words = resolve_source(args.source, rows=args.rows, load_ms=args.load_ms)
    except (_Refused, ConfigError) as exc:
        print(f"naiad bench: {exc}", file=sys.stderr)
        return 2
    if args.train:
        step = training_step(device)
        step_words = "a real MLP training step"
    else:
        step = synthetic_step(args.step_ms, device)
        step_words = (
            f"a {args.step_ms:g} ms step ({'GPU kernel' if device.type == 'cuda' else 'sleep'})"
        )
    header = (
        f"naiad bench: {words}; batch {args.batch_size}, {args.batches} steps (+{args.warmup} warm-up), "
        f"{step_words}, device {device}, {_workers(args.num_workers)}"
    )
    results = _run_both(args, dataset, device, step)
    if args.json:
        print(json.dumps({"header": header, "runs": [r.to_dict() for r in results]}, indent=1))
    else:
        print(format_table(results, header))
    if plt is not None:
        plot_waits(results, args.plot, header, plt)
        if not args.json:
            print(f"\nwait per step drawn to {args.plot}")
    if args.trace and not args.json:
        print(f"\nnaiad's run traced to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


class _Refused(Exception):
    """An argument ``naiad bench`` cannot run with (exit status 2, the message on stderr)."""


def _check_arguments(args: argparse.Namespace) -> Any:
    """The numbers in range, and matplotlib's pyplot when ``--plot`` asks for it (else None).

    Raises:
        _Refused: saying which argument and why.
    """
    for name in ("batch_size", "batches", "rows", "depth"):
        if getattr(args, name) < 1:
            raise _Refused(f"`--{name.replace('_', '-')}` must be >= 1, got {getattr(args, name)}.")
    if args.step_ms < 0 or args.load_ms < 0 or args.warmup < 0 or args.num_workers < 0:
        raise _Refused("--step-ms, --load-ms, --warmup and --num-workers must be >= 0.")
    if not args.plot:
        return None
    plt = load_pyplot()
    if plt is None:
        raise _Refused("--plot needs matplotlib, which is not installed; install it with: pip install 'naiad[plot]'")
    return plt
