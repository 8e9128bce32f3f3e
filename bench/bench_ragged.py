"""Tokenized rows as they are (NOTE [ Ragged columns ]): ``naiad.read_hf`` on a Hugging Face
dataset of ``input_ids`` and ``attention_mask`` of any length per row, against
``dataset.with_format("torch")`` under torch's DataLoader.

The data is made here (nothing is downloaded): ``--sizes`` rows of 16 to 512 token ids (int32,
a vocabulary of 50,000) and their attention masks (int8), a label, as a ``datasets.Dataset``
written by ``save_to_disk`` and opened with ``load_from_disk``: memory-mapped Arrow stream files,
as ``load_dataset`` leaves a tokenized dataset. Side by side in one run, each loader with the same
worker count (``--workers``, persistent: torch's processes, naiad's default for a stream,
threads), batches of ``--batch``, a shuffled epoch, every loader giving the same batch (a list of
1-D tensors per ragged column, the labels one tensor); rows per wall second and per CPU second of
the process tree over a whole epoch (median of ``--rounds``, after a warm-up epoch, the loaders
alternating):

* ``torch with_format``: ``torch.utils.data.DataLoader(dataset.with_format("torch"),
  shuffle=True, collate_fn=...)``: ``datasets`` makes each row's tensors in the workers (int64,
  its torch format's integer type), the collate lists them (torch's ``default_collate`` refuses
  rows of unequal length).
* ``torch with_format, batched``: the same dataset indexed a batch at a time (a ``BatchSampler``
  as the sampler, ``batch_size=None``): ``dataset[indices]`` gives each ragged column as a list of
  tensors, one call per batch instead of one per row; and that in the loop's own process
  (``num_workers=0``): torch's workers send each tensor in a shared-memory file of its own, two
  per row here.
* ``naiad read_hf``: ``naiad.DataLoader(naiad.read_hf(dataset), shuffle=True, seed=0)`` (the
  columns' own int32 and int8).
* ``naiad read_hf, process workers``: the same with ``worker_mode="process"``.

Run: ``python bench/bench_ragged.py [--sizes 20000 100000 --rounds 3 --workers 2]``. The machines
here are shared and noisy: compare the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import compare_epochs, environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

try:
    import datasets
except ImportError:  # pragma: no cover
    sys.exit("bench_ragged needs Hugging Face datasets: pip install 'naiad[test]'")

COLUMNS = ["input_ids", "attention_mask", "label"]


def make_dataset(count: int, folder: Path) -> Any:
    """``count`` tokenized rows as a saved and reloaded ``datasets.Dataset``."""
    rng = np.random.default_rng(count)
    lengths = rng.integers(16, 513, count)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)))
    mask = pa.ListArray.from_arrays(offsets, pa.array(np.ones(int(lengths.sum()), np.int8)))
    table = pa.table({"input_ids": ids, "attention_mask": mask, "label": pa.array(rng.integers(0, 2, count))})
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "attention_mask": datasets.Sequence(datasets.Value("int8")),
                                  "label": datasets.Value("int64")})
    ds = datasets.Dataset(datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features))
    ds.save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


def listed(rows: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """torch's side of the same batch: each ragged column a list of its rows' tensors."""
    return {"input_ids": [r["input_ids"] for r in rows], "attention_mask": [r["attention_mask"] for r in rows],
            "label": torch.stack([r["label"] for r in rows])}


def loaders(ds: Any, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    common = {"batch_size": args.batch, "num_workers": args.workers, "persistent_workers": True}
    return {
        "torch with_format": lambda: torch.utils.data.DataLoader(ds.with_format("torch", columns=COLUMNS), shuffle=True,
                                                                 collate_fn=listed, **common),
        "torch with_format, batched": lambda: torch.utils.data.DataLoader(
            ds.with_format("torch", columns=COLUMNS), batch_size=None, num_workers=args.workers, persistent_workers=True,
            sampler=torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), args.batch, drop_last=False)),
        "torch with_format, batched, no workers": lambda: torch.utils.data.DataLoader(
            ds.with_format("torch", columns=COLUMNS), batch_size=None,
            sampler=torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), args.batch, drop_last=False)),
        "naiad read_hf": lambda: naiad.DataLoader(naiad.read_hf(ds, columns=COLUMNS), shuffle=True, seed=0, **common),
        "naiad read_hf, process workers": lambda: naiad.DataLoader(naiad.read_hf(ds, columns=COLUMNS), shuffle=True,
                                                                   seed=0, worker_mode="process", **common),
    }


def run_size(count: int, args: argparse.Namespace, root: Path) -> list[list[Any]]:
    ds = make_dataset(count, root / f"saved-{count}")
    made = {name: make() for name, make in loaders(ds, args).items()}
    for name, loader in made.items():  # the same batch from each: a list of 1-D tensors per ragged column
        batch = next(iter(loader))
        if not all(isinstance(batch[c], list) and batch[c][0].ndim == 1 for c in COLUMNS[:2]):
            raise RuntimeError(f"{name}: not a list of 1-D tensors per row")
    return [[count, *row] for row in compare_epochs(made, count, lambda batch: len(batch["label"]), args.rounds, "torch with_format")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    print(environment())
    print(f"datasets {datasets.__version__}, {args.workers} workers, batches of {args.batch}, {args.rounds} rounds")
    rows = []
    with tempfile.TemporaryDirectory(prefix="naiad-bench-ragged-") as d:
        for count in args.sizes:
            rows += run_size(count, args, Path(d))
            print(f"  {count} rows done", flush=True)
    print(markdown_table(["rows", "loader", "rows/s (wall)", "vs torch", "rows/CPU s", "vs torch (CPU)",
                          "rounds vs torch's median"], rows))


if __name__ == "__main__":
    main()
