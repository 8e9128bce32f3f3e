"""``naiad demo images``: the FashionMNIST tutorial's network trained from an image folder, with
torch's DataLoader and with naiad's.

It makes (once, in the cache) a FashionMNIST-shaped folder of 28x28 grayscale PNGs in 10 class
folders (``cli/demo_data.fashion_folder``), converts it (once) to WebDataset tar shards and to a
Parquet file of decoded pixels with ``naiad convert``, and trains the tutorial's network
(Flatten, Linear 784->512, ReLU, Linear 512->512, ReLU, Linear 512->10; cross-entropy, SGD) with
each loader from the same seed and initialisation:

1. ``torch.utils.data.DataLoader`` over a folder dataset that opens each image with PIL, as the
   tutorial's users write it (torchvision's ``ImageFolder`` + ``ToTensor``, without torchvision);
2. ``naiad.DataLoader`` over the same dataset (the drop-in: the same batches, the same loss);
3. naiad from the folder: ``naiad.read_images`` + ``naiad.decode_images(mode="L")``;
4. naiad from the tar shards: ``naiad.read_webdataset`` + ``naiad.decode_images``;
5. naiad from the Parquet of pixels (``naiad convert --decode``): no decode at all.

Each run's delivered samples are checked: every image exactly once per epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from naiad.cli.steps import RunResult, speed_ups
from naiad.parallel.threads import usable_cores

__all__ = ["FashionModel", "ImageFolderDataset", "ImageRunResult", "format_image_table", "run_images"]

# What the image mode's options default to: the tutorial's batch size; not its lr of 1e-3, which
# needs its five epochs of 60,000 images (4,690 steps) where this demo takes a few hundred steps
# (at 1e-3 the loss falls from 2.30 to about 2.27 in two epochs of 6,000; `--lr 1e-3` shows it).
DEFAULTS = {"images": 6000, "epochs": 2, "batch_size": 64, "num_workers": 0, "lr": 0.05}


def test_images(images: int) -> int:
    """The test split's size: a sixth of the training images (FashionMNIST's 10,000 to 60,000),
    between 100 and 10,000."""
    return max(100, min(10_000, images // 6))


class ImageFolderDataset(tud.Dataset[tuple[torch.Tensor, int]]):
    """torchvision's ``ImageFolder(root, transform=ToTensor())``, written with PIL.

    What the tutorial's users write: classes are ``root``'s sub-folders in sorted order, the
    samples each class's image files in sorted order, and ``__getitem__`` opens one file with PIL
    and makes it a float tensor in [0, 1], ``[C, H, W]``.
    """

    def __init__(self, root: str | os.PathLike[str], mode: str = "L") -> None:
        self.root = Path(root)
        self.mode = mode
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [
            (str(path), label)
            for label, name in enumerate(self.classes)
            for path in sorted((self.root / name).rglob("*"))
            if path.suffix.lower() in (".png", ".jpg", ".jpeg")
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as img:
            pixels = np.array(img.convert(self.mode), dtype=np.uint8)
        x = torch.from_numpy(pixels).float().div_(255)  # ToTensor: [0, 1], channels first
        return (x.unsqueeze(0) if x.ndim == 2 else x.permute(2, 0, 1)), label

    def key(self, index: int) -> str:
        """The sample's key as ``naiad convert`` writes it: its path under the root, no suffix."""
        return key_of(self.samples[index][0], self.root)


class FashionModel(torch.nn.Module):
    """The FashionMNIST tutorial's network: Flatten, 784->512, ReLU, 512->512, ReLU, 512->10."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = torch.nn.Flatten()
        self.linear_relu_stack = torch.nn.Sequential(
            torch.nn.Linear(28 * 28, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of the 10 classes, ``[B, 10]``."""
        logits: torch.Tensor = self.linear_relu_stack(self.flatten(x))
        return logits


class RecordingSampler(tud.Sampler[int]):
    """torch's shuffle (``RandomSampler``), with the indices it hands out kept per epoch.

    Only so the demo can check what torch's loader delivered; the order is ``shuffle=True``'s.
    """

    def __init__(self, dataset: Sequence[Any]) -> None:
        self.inner = tud.RandomSampler(dataset)
        self.epochs: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        drawn: list[int] = []
        self.epochs.append(drawn)
        for index in self.inner:
            drawn.append(index)
            yield index


@dataclass
class ImageRunResult(RunResult):
    """What one training run measured (``naiad demo``'s ``RunResult``), with the model's test
    loss and accuracy and what the loader delivered."""

    test_loss: float = float("nan")
    accuracy: float = float("nan")
    coverage: str = ""  # empty: every image exactly once per epoch; else what went wrong
    epoch_losses: list[float] = field(default_factory=list)


@dataclass
class ImageRun:
    """One loader of the comparison: how to make it and how to read its batches.

    ``unpack(batch)`` gives the float images ``[B, 1, 28, 28]``, the labels and the batch's keys
    (None where the keys come from elsewhere: ``keys_after``, called once the run is over, gives
    each epoch's keys then); ``key_of`` turns a batch's keys (an image's path) into the samples'.
    """

    name: str
    make_loader: Callable[[], Iterable[Any]]
    unpack: Callable[[Any], tuple[torch.Tensor, torch.Tensor, Sequence[str] | None]]
    keys_after: Callable[[], list[list[str]]] | None = None
    key_of: Callable[[str], str] | None = None  # a batch's key (a path) to the sample's key


def key_of(path: str, root: Path) -> str:
    """``root/disc/000003.png`` -> ``disc/000003``: the key ``naiad convert`` gives the file."""
    return Path(os.path.relpath(path, root)).with_suffix("").as_posix()


def unpack_torch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, None]:
    """torch's ``(inputs, labels)`` batch as a run unpacks it: no keys."""
    return batch[0], batch[1], None


def _unpacker(image: str, label: str, key: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, torch.Tensor, list[str]]]:
    """Read naiad's batch dicts: uint8 pixels made floats in [0, 1] (ToTensor's scale)."""

    def unpack(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        return batch[image].float().div_(255), batch[label], batch[key]

    return unpack


def load_split(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split in memory (the test set the runs are scored on): floats and labels."""
    dataset = ImageFolderDataset(root)
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(xs), torch.tensor(ys)


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """The tutorial's test loop at once: mean cross-entropy and accuracy on ``(x, y)``."""
    with torch.no_grad():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        return float(loss), float((logits.argmax(1) == y).float().mean())


def warm_up(model: torch.nn.Module, test: tuple[torch.Tensor, torch.Tensor], batch_size: int, steps: int = 5) -> None:
    """A few training steps of a throwaway ``model``, untimed: torch's first steps (its thread
    pool, its kernels' first calls, a 3D convolution's buffers) are slower, and the first loader
    timed would pay for them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = test[0][:batch_size], test[1][:batch_size]
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated in torch
        optimizer.step()


def check_coverage(epochs: list[list[str]], expected: Sequence[str]) -> str:
    """Empty when each epoch holds every key of ``expected`` exactly once; else what differs."""
    want = np.sort(np.asarray(expected, dtype=object).astype(str))
    problems = []
    for number, keys in enumerate(epochs):
        got, counts = np.unique(np.asarray(keys, dtype=str), return_counts=True)
        missing = np.setdiff1d(want, got).size
        extra = np.setdiff1d(got, want).size
        repeated = int((counts > 1).sum())
        if missing or extra or repeated:
            problems.append(f"epoch {number}: {missing} missing, {repeated} repeated, {extra} unknown")
    return "; ".join(problems)


def train_images(run: ImageRun, args: argparse.Namespace, test: tuple[torch.Tensor, torch.Tensor],
                 expected_keys: Sequence[str]) -> ImageRunResult:
    """Train a fresh tutorial model for ``args.epochs`` over ``run``'s loader; time the loop and
    its waits, score the model on the test split, check the samples each epoch delivered.

    The loader is made inside the timed region: a streaming loader's set-up is part of its cost.
    """
    torch.manual_seed(args.seed)
    model = FashionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    return train_run(run, model, optimizer, args.epochs, test, expected_keys)


def train_run(run: ImageRun, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epochs: int,
              test: tuple[torch.Tensor, torch.Tensor], expected_keys: Sequence[str]) -> ImageRunResult:
    """``epochs`` of cross-entropy training of ``model`` over ``run``'s loader (made in the timed
    region), timed with its waits; then the test scores and the check of the keys each epoch
    delivered (``naiad demo images`` and ``naiad demo video``)."""
    rows = steps = 0
    wait_s = 0.0
    loss = torch.tensor(float("nan"))
    epoch_keys: list[list[str]] = []
    epoch_losses: list[float] = []
    start = time.perf_counter()
    loader = run.make_loader()
    for _ in range(epochs):
        keys: list[str] = []
        epoch_keys.append(keys)
        total_loss, epoch_rows = 0.0, 0
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait_s += time.perf_counter() - t0
            x, y, batch_keys = run.unpack(batch)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated in torch
            optimizer.step()
            if batch_keys is not None:
                keys.extend(batch_keys)
            total_loss += float(loss.detach()) * len(x)
            epoch_rows += len(x)
            rows += len(x)
            steps += 1
        epoch_losses.append(total_loss / max(1, epoch_rows))
    total = time.perf_counter() - start
    # The keys are looked at once the clock has stopped: the check costs the loop nothing.
    seen = run.keys_after() if run.keys_after else epoch_keys
    if run.key_of is not None:
        seen = [[run.key_of(k) for k in keys] for keys in seen]
    test_loss, accuracy = evaluate(model, *test)
    return ImageRunResult(run.name, rows, steps, total, wait_s, float(loss.detach()), test_loss=test_loss,
                          accuracy=accuracy, coverage=check_coverage(seen, expected_keys), epoch_losses=epoch_losses)


def train_and_report(runs: list[ImageRun], train: Callable[[ImageRun], ImageRunResult],
                     table: Callable[[list[ImageRunResult]], str], keys: Sequence[str], noun: str) -> bool:
    """Train with each run, its epoch losses printed as it ends, then the table and whether each
    run delivered every ``noun`` once per epoch; whether any did not."""
    results = []
    for run in runs:
        results.append(train(run))
        r = results[-1]
        print(f"  {run.name}: {r.total_s:.2f}s, epoch losses "
              + " -> ".join(f"{loss:.4f}" for loss in r.epoch_losses), flush=True)
    print()
    print(table(results))
    bad = [r for r in results if r.coverage]
    for r in bad:
        print(f"error: {r.name} did not deliver each {noun} once per epoch: {r.coverage}")
    if not bad:
        print(f"\nEvery loader delivered each of the {len(keys):,} {noun}s exactly once per epoch.")
    return bool(bad)


def format_image_table(results: list[ImageRunResult]) -> str:
    """The comparison table ``naiad demo images`` prints: the CSV demo's, with the test scores."""
    header = (f"{'loader':<34} {'images/s':>10} {'wait/step':>12} {'total':>9} {'final loss':>11} "
              f"{'test loss':>10} {'accuracy':>9}")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<34} {r.rows_per_s:>10,.0f} {r.wait_per_step_us:>9,.1f} us {r.total_s:>8.2f}s "
            f"{r.final_loss:>11.4f} {r.test_loss:>10.4f} {100 * r.accuracy:>8.1f}%"
        )
    return "\n".join(lines + speed_ups(results))


def converted(root: Path, seed: int) -> tuple[Path, Path, float]:
    """The folder converted (once, beside it in the cache) to tar shards and to decoded Parquet."""
    from naiad.tools.convert import ConvertOptions, convert

    t0 = time.perf_counter()
    tar = root / "shards" / "train.tar"
    parquet = root / "pixels" / "train.parquet"
    per_shard = 1000
    for dst, options in (
        (tar, ConvertOptions(rows_per_shard=per_shard, shuffle=True, seed=seed, overwrite=True)),
        (parquet, ConvertOptions(decode=True, mode="L", shuffle=True, seed=seed, overwrite=True)),
    ):
        # The manifest is written last: without it, an earlier convert did not finish (overwrite).
        if not (dst.parent / "train.manifest.json").exists():
            convert(str(root / "train"), str(dst), options)
    return tar, parquet, time.perf_counter() - t0


def make_runs(args: argparse.Namespace, root: Path, tar: Path, parquet: Path) -> tuple[list[ImageRun], list[str]]:
    """The five loaders, and every training image's key."""
    import naiad

    train_dir = root / "train"
    dataset = ImageFolderDataset(train_dir)
    keys = [dataset.key(i) for i in range(len(dataset))]
    common = dict(batch_size=args.batch_size, num_workers=args.num_workers)
    torch_sampler = RecordingSampler(dataset)  # type: ignore[arg-type]
    naiad_sampler = RecordingSampler(dataset)  # type: ignore[arg-type]

    def recorded(sampler: RecordingSampler) -> Callable[[], list[list[str]]]:
        return lambda: [[keys[i] for i in drawn] for drawn in sampler.epochs]

    def decode(column: str) -> naiad.media.images.DecodeImages:
        # A 28x28 image centre-cropped to 28x28 is itself: one uint8 [B, 1, 28, 28] per batch.
        return naiad.decode_images(column, mode="L", size=28, crop="center")

    runs = [
        ImageRun("torch.utils.data.DataLoader", lambda: tud.DataLoader(dataset, sampler=torch_sampler, **common),
                 unpack_torch, recorded(torch_sampler)),
        ImageRun("naiad.DataLoader", lambda: naiad.DataLoader(dataset, sampler=naiad_sampler, **common),
                 unpack_torch, recorded(naiad_sampler)),
        ImageRun("naiad from the folder", lambda: naiad.DataLoader(
            naiad.read_images(train_dir), shuffle=True, seed=args.seed, **common,
            transform=decode("image")), _unpacker("image", "label", "path"),
            key_of=lambda path: key_of(path, train_dir)),
        ImageRun("naiad from tar shards", lambda: naiad.DataLoader(
            naiad.read_webdataset(str(tar.parent / "train-*.tar")), shuffle=True, seed=args.seed, **common,
            transform=decode("png")), _unpacker("png", "cls", "__key__")),
        ImageRun("naiad from decoded Parquet", lambda: naiad.DataLoader(
            naiad.read_parquet(str(parquet)), shuffle=True, seed=args.seed, **common),
            _unpacker("image", "label", "__key__")),
    ]
    return runs, keys


def run_images(args: argparse.Namespace) -> int:
    """Run ``naiad demo images``; returns the exit status (1 when a loader missed or repeated)."""
    from naiad.cli.demo_data import fashion_folder

    t0 = time.perf_counter()
    root = fashion_folder(images=args.images, test_images=test_images(args.images), seed=args.seed)
    made_s = time.perf_counter() - t0
    tar, parquet, convert_s = converted(root, args.seed)
    test = load_split(root / "test")
    # The model's threads leave a core to the loaders: torch's intra-op pool spins at its
    # barriers, and on a machine with no core to spare each step waits for the busiest thread
    # (measured here, 2 cores: 8 ms a step on one thread, 100 ms on two while a loader decoded).
    with model_threads_leave_a_core():
        return _compare(args, root, tar, parquet, test, made_s, convert_s)


@contextlib.contextmanager
def model_threads_leave_a_core() -> Iterator[None]:
    """torch's intra-op threads one fewer than the usable cores, for as long as it lasts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, usable_cores() - 1)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _compare(args: argparse.Namespace, root: Path, tar: Path, parquet: Path, test: tuple[torch.Tensor, torch.Tensor],
             made_s: float, convert_s: float) -> int:
    """Train with each loader, print the table; 1 when a loader missed or repeated an image."""
    runs, keys = make_runs(args, root, tar, parquet)
    print(f"naiad demo images: built-in FashionMNIST-shaped data at {root} "
          f"(made in {made_s:.1f}s or cached; converted in {convert_s:.1f}s or cached)")
    print(f"  naiad convert {root / 'train'} {tar} --samples-per-shard 1000 --shuffle --seed {args.seed}")
    print(f"  naiad convert {root / 'train'} {parquet} --decode --mode L --shuffle --seed {args.seed}")
    print(f"{len(keys):,} training and {len(test[1]):,} test images, 28x28 grayscale PNG, 10 classes; "
          f"batch {args.batch_size}, shuffle, {args.epochs} epoch(s), num_workers={args.num_workers}, "
          f"SGD lr {args.lr}, {usable_cores()} CPU cores, the model on {torch.get_num_threads()} thread(s)")
    warm_up(FashionModel(), test, args.batch_size)
    torch.manual_seed(args.seed)
    before_loss, before_accuracy = evaluate(FashionModel(), *test)
    print(f"before training: test loss {before_loss:.4f}, accuracy {100 * before_accuracy:.1f}%\n")
    bad = train_and_report(runs, lambda run: train_images(run, args, test, keys), format_image_table, keys, "image")
    print(
        "The first two run the same dataset, sampler draws and model, so they reach the same loss; the"
        "\nothers read the folder, the tar shards and the decoded pixels in batches, shuffled by blocks"
        "\nand a shuffle buffer (another order, so another loss). Accuracy is on the test images."
    )
    return 1 if bad else 0
