"""A user's worker-side transform against the same work built into naiad (issue 38, item 2;
target >= 0.95x the images/s).

The data is made here: ``--sizes`` counts of 256x256 photo-like JPEGs (quality 90) in an image
folder of four classes. Each loader reads it with ``naiad.read_images``, batches of ``--batch``,
``--workers`` workers, a shuffled epoch, ``for image, target in loader`` (side by side in one
run, alternating, images per wall second over an epoch, median of ``--rounds`` after a warm-up):

* ``built in``: ``transform=[naiad.decode_images("image", size=224, crop="random", flip=True),
  naiad.to_tuple("image", "label")]``: naiad decodes, crops and flips.
* ``user's class, the same work``: a class of the user's declaring ``Placement("workers")`` whose
  ``__call__`` runs that same decode (crop and flip included), then the tuple: the same work,
  placed through the protocol as a user's transform. The target: >= 0.95x the built in.
* ``user's own flip``: the decode crops, and the user's ``RandomFlip`` (``Placement("workers")``,
  each sample's coin from ``naiad.batch_uniforms``) flips after it: the user's own code in the
  workers. Not the same work: naiad flips while it places the resized pixels, at no cost, where
  a flip after the decode copies the flipped half of the batch again.

(Either class without ``placement()`` would run on the loop's thread, where a batch has no
per-sample key: its random crop is refused with a ConfigError asking for one. That is what a
user met before transforms declared their place, and why there is no row for it.)

Run: ``python bench/bench_user_transform.py [--sizes 1000 3000 --rounds 3 --workers 2]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import photo  # noqa: E402
from harness import environment, markdown_table  # noqa: E402
from harness import epoch_rate as harness_epoch_rate  # noqa: E402

import naiad  # noqa: E402


class RandomFlip:
    """A user's horizontal flip, in the workers, each sample's coin its own (keyed draws)."""

    def placement(self) -> naiad.Placement:
        return naiad.Placement("workers", column="image", key="__index__")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        flip = torch.from_numpy(naiad.batch_uniforms(batch, 1)[:, 0] < 0.5)
        images = batch["image"]
        images[flip] = images[flip].flip(-1)
        return batch


class UserDecode:
    """A user's class that runs naiad's decode (crop and flip included), declared for the workers."""

    def __init__(self) -> None:
        self.decode = naiad.decode_images("image", size=224, crop="random", flip=True)

    def placement(self) -> naiad.Placement:
        return naiad.Placement("workers", column="image", key="__index__")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return self.decode(batch)


def make_folder(count: int, root: Path) -> str:
    rng = np.random.default_rng(count)
    for k in range(count):
        folder = root / f"class{k % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        photo(rng, 256, 256).save(folder / f"{k:05d}.jpg", format="JPEG", quality=90)
    return str(root)


def loaders(folder: str, args: argparse.Namespace) -> dict[str, Any]:
    common = {"batch_size": args.batch, "shuffle": True, "seed": 0, "num_workers": args.workers}
    decode = naiad.decode_images("image", size=224, crop="random", flip=True)
    return {
        "built in": lambda: naiad.DataLoader(naiad.read_images(folder), **common,
                                             transform=[decode, naiad.to_tuple("image", "label")]),
        "user's class, the same work": lambda: naiad.DataLoader(
            naiad.read_images(folder), **common, transform=[UserDecode(), naiad.to_tuple("image", "label")]),
        "user's own flip": lambda: naiad.DataLoader(
            naiad.read_images(folder), **common,
            transform=[naiad.decode_images("image", size=224, crop="random"), RandomFlip(),
                       naiad.to_tuple("image", "label")]),
    }


def epoch_rate(make: Any, images: int) -> float:
    """Images per wall second over one epoch of a new loader (``for image, target in loader``)."""
    loader = make()
    try:
        return harness_epoch_rate(loader, images, lambda batch: len(batch[0]))[0]
    finally:
        loader.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    print(environment())
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = make_folder(size, Path(tmp) / "train")
            makers = loaders(folder, args)
            for make in makers.values():
                epoch_rate(make, size)  # warm-up: the listing made and kept, the page cache
            rates: dict[str, list[float]] = {name: [] for name in makers}
            for _ in range(args.rounds):
                for name, make in makers.items():
                    rates[name].append(epoch_rate(make, size))
            base = statistics.median(rates["built in"])
            for name, got in rates.items():
                rows.append([size, name, f"{statistics.median(got):,.0f}", f"{statistics.median(got) / base:.2f}x",
                             ", ".join(f"{r / base:.2f}" for r in got)])
    print(markdown_table(["images", "loader", "images/s", "vs built in", "rounds vs built in's median"], rows))


if __name__ == "__main__":
    main()
