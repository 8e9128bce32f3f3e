"""Hugging Face ``datasets`` as they are: ``naiad.read_hf`` + ``naiad.decode_images`` against
``dataset.with_format("torch")`` under torch's DataLoader (issue 38, item 4; target >= 1.5x).

The data is made here (nothing is downloaded): ``--sizes`` counts of 256x256 photo-like JPEGs
(quality 90, Pillow), four classes, as a ``datasets.Dataset`` with an ``Image`` column and a
``ClassLabel``, written by ``save_to_disk`` and opened with ``load_from_disk``: memory-mapped
Arrow stream files, as ``load_dataset`` leaves a dataset. Side by side in one run, each loader
with the same worker count (``--workers``, persistent: torch's processes, naiad's default for a
stream, threads), batches of ``--batch``, a shuffled epoch; images per wall second and per CPU
second of the process tree over a whole epoch (median of ``--rounds``, after a warm-up epoch, the
loaders alternating):

* ``torch with_format``: ``torch.utils.data.DataLoader(dataset.with_format("torch"),
  shuffle=True)``: ``datasets`` decodes each image with Pillow in the workers and torch's collate
  stacks them, what its documentation shows for PyTorch.
* ``naiad read_hf``: ``naiad.DataLoader(naiad.read_hf(dataset), shuffle=True, seed=0,
  transform=naiad.decode_images("image"))``, the decode's defaults (each image its own
  ``uint8 [3, H, W]`` tensor; libjpeg-turbo through simplejpeg where installed).
* ``naiad read_hf, shuffled view``: the same over ``dataset.shuffle(seed=0)``, whose indices
  mapping ``read_hf`` honours (``HFSource``: its blocks are runs of the mapping).

Run: ``python bench/bench_hf.py [--sizes 1000 3000 --rounds 3 --workers 2]``. The machines here
are shared and noisy: compare the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import photo  # noqa: E402
from harness import compare_epochs, environment, markdown_table  # noqa: E402

import naiad  # noqa: E402

try:
    import datasets
except ImportError:  # pragma: no cover
    sys.exit("bench_hf needs Hugging Face datasets: pip install 'naiad[test]'")

CLASSES = ["a", "b", "c", "d"]


def make_dataset(count: int, folder: Path) -> Any:
    """``count`` 256x256 JPEGs as a saved and reloaded ``datasets.Dataset``."""
    rng = np.random.default_rng(count)
    images = []
    for _ in range(count):
        out = io.BytesIO()
        photo(rng, 256, 256).save(out, "JPEG", quality=90)
        images.append({"bytes": out.getvalue(), "path": None})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    ds = datasets.Dataset.from_dict({"image": images, "label": rng.integers(0, len(CLASSES), count).tolist()},
                                    features=features)
    ds.save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


def loaders(ds: Any, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    common = {"batch_size": args.batch, "num_workers": args.workers, "persistent_workers": True}
    return {
        "torch with_format": lambda: torch.utils.data.DataLoader(ds.with_format("torch"), shuffle=True, **common),
        "naiad read_hf": lambda: naiad.DataLoader(naiad.read_hf(ds), shuffle=True, seed=0,
                                                  transform=naiad.decode_images("image"), **common),
        "naiad read_hf, shuffled view": lambda: naiad.DataLoader(
            naiad.read_hf(ds.shuffle(seed=0)), shuffle=True, seed=0, transform=naiad.decode_images("image"), **common),
    }


def run_size(count: int, args: argparse.Namespace, root: Path) -> list[list[Any]]:
    ds = make_dataset(count, root / f"saved-{count}")
    made = {name: make() for name, make in loaders(ds, args).items()}
    return [[count, *row] for row in compare_epochs(made, count, lambda batch: len(batch["image"]), args.rounds, "torch with_format")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    print(environment())
    print(f"datasets {datasets.__version__}, {args.workers} workers, batches of {args.batch}, {args.rounds} rounds")
    rows = []
    with tempfile.TemporaryDirectory(prefix="naiad-bench-hf-") as d:
        for count in args.sizes:
            rows += run_size(count, args, Path(d))
            print(f"  {count} images done", flush=True)
    print(markdown_table(["images", "loader", "images/s (wall)", "vs torch", "images/CPU s", "vs torch (CPU)",
                          "rounds vs torch's median"], rows))


if __name__ == "__main__":
    main()
