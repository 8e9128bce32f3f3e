"""``naiad demo``: train the diabetes tutorial's model with torch's DataLoader, then with naiad's.

With no arguments it makes (once, in the cache) a diabetes-shaped CSV of 1M rows, loads it into
memory, and trains the tutorial's network (Linear 8->6->4->1 with sigmoids, BCE loss, SGD) for a
few epochs with each loader over the same ``TensorDataset``, the same seed and the same model
initialisation. The only difference between the two runs is the loader class.

``naiad demo images`` trains the FashionMNIST tutorial's network from an image folder instead
(``cli/demo_images.py``), and ``naiad demo video`` a small action recogniser from a folder of
videos (``cli/demo_video.py``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from naiad.cli.argtypes import at_least
from naiad.cli.steps import RunResult, speed_ups

NAME = "demo"
HELP = ("Train the diabetes tutorial's model (or, with `images`, the FashionMNIST tutorial's; with `video`, a "
        "small action recogniser) with torch's DataLoader and with naiad's; compare.")

# The CSV mode's defaults; `naiad demo images` and `naiad demo video` have their own (DEFAULTS in
# cli/demo_images.py and cli/demo_video.py).
_CSV_DEFAULTS = {"rows": 1_000_000, "epochs": 2, "batch_size": 128, "num_workers": 0, "lr": 0.1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``naiad demo [images|video]`` options to ``parser``."""
    parser.add_argument("mode", nargs="?", choices=("images", "video"), default=None,
                        help="images: the FashionMNIST tutorial from an image folder, tar shards and decoded "
                        "Parquet; video: an action recogniser from a folder of videos and tar shards (needs "
                        "naiad[video]) (default: the diabetes tutorial from a CSV)")
    parser.add_argument("--csv", help="your own CSV file (default: the built-in diabetes-shaped data)")
    parser.add_argument(
        "--features",
        help="comma-separated feature columns of --csv (default: every column but the label)",
    )
    parser.add_argument("--label", help="the 0/1 label column of --csv (default: the last column)")
    parser.add_argument("--rows", type=int, default=None, help="rows of built-in data (default 1M)")
    parser.add_argument("--images", type=at_least(10), default=None,
                        help="images: training images of the built-in data (default 6,000)")
    parser.add_argument("--videos", type=at_least(8), default=None,
                        help="video: training videos of the built-in data (default 96)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs per loader (default 2; video: 3)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch size (default 128; images: 64; video: 8)")
    parser.add_argument("--num-workers", "--workers", type=int, default=None, help="loader workers (default 0)")
    parser.add_argument("--lr", type=float, default=None, help="SGD learning rate (default 0.1; images: 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="model and shuffle seed (default 0)")




def load_csv(
    path: str, features: list[str] | None, label: str | None
) -> tuple[np.ndarray, np.ndarray, list[str], str, np.ndarray, np.ndarray]:
    """Read a numeric CSV into float32 features ``x`` (standardized) and a label column ``y``.

    Also returns the features' mean and standard deviation, for standardizing streamed batches.
    """
    import pyarrow.csv as pacsv

    from naiad.errors import SourceError

    if not os.path.exists(path):
        raise SourceError("no such file", path=path)
    try:
        table = pacsv.read_csv(path)
    except Exception as exc:  # pyarrow's ArrowInvalid names the row; keep its words
        raise SourceError(f"cannot parse as CSV: {exc}", path=path) from exc
    names = table.column_names
    label = label or names[-1]
    features = features or [n for n in names if n != label]
    for col in [*features, label]:
        if col not in names:
            raise SourceError(f"no column {col!r}; the file has {names}", path=path, column=col)
    try:
        x = np.column_stack([table[c].to_numpy().astype(np.float32) for c in features])
        y = table[label].to_numpy().astype(np.float32).reshape(-1, 1)
    except (ValueError, TypeError) as exc:
        raise SourceError(f"columns must be numeric: {exc}", path=path) from exc
    mean, std = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)
    return (x - mean) / std, y, features, label, mean, std


class Standardize:
    """Per-batch transform for streamed rows: pack features into ``x`` (standardized) and ``y``."""

    def __init__(self, features: list[str], label: str, mean: np.ndarray, std: np.ndarray) -> None:
        import naiad

        self.pack = naiad.pack_xy(label=label, features=features, label_dtype=torch.float32)
        self.mean = torch.from_numpy(mean.astype(np.float32))
        self.std = torch.from_numpy(std.astype(np.float32))

    def __call__(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.pack(batch)
        return (out["x"] - self.mean) / self.std, out["y"].reshape(-1, 1)


class TutorialModel(torch.nn.Module):
    """The diabetes tutorial's network: Linear n->6->4->1 with sigmoids."""

    def __init__(self, n_features: int = 8) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(n_features, 6)
        self.linear2 = torch.nn.Linear(6, 4)
        self.linear3 = torch.nn.Linear(4, 1)
        self.sigmoid = torch.nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities of the positive class, shape (batch, 1)."""
        x = self.sigmoid(self.linear1(x))
        x = self.sigmoid(self.linear2(x))
        out: torch.Tensor = self.sigmoid(self.linear3(x))
        return out


def train(name: str, make_loader: Any, n_features: int, epochs: int, lr: float, seed: int) -> RunResult:
    """Train a fresh tutorial model for ``epochs`` over ``make_loader()``; time the loop and its waits.

    The loader is made inside the timed region: a streaming loader's set-up (scanning the file
    for its row count) is part of its cost.
    """
    torch.manual_seed(seed)
    model = TutorialModel(n_features)
    criterion = torch.nn.BCELoss(reduction="mean")
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    rows = steps = 0
    wait_s = 0.0
    loss = torch.tensor(float("nan"))
    start = time.perf_counter()
    loader = make_loader()
    for _ in range(epochs):
        it: Iterable[Any] = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)  # type: ignore[call-overload]
            except StopIteration:
                break
            wait_s += time.perf_counter() - t0
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated in torch
            optimizer.step()
            rows += len(x)
            steps += 1
    total = time.perf_counter() - start
    return RunResult(name, rows, steps, total, wait_s, float(loss.detach()))


def format_table(results: list[RunResult]) -> str:
    """The comparison table ``naiad demo`` prints."""
    header = f"{'loader':<30} {'rows/s':>12} {'wait/step':>12} {'total':>9} {'final loss':>11}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<30} {r.rows_per_s:>12,.0f} {r.wait_per_step_us:>9,.1f} us {r.total_s:>8.2f}s {r.final_loss:>11.4f}"
        )
    return "\n".join(lines + speed_ups(results))


def resolve_mode(args: argparse.Namespace) -> None:
    """Fill the options left unset with the mode's defaults; refuse options of the other mode."""
    from naiad.errors import ConfigError

    if args.mode in ("images", "video"):
        if args.mode == "images":
            from naiad.cli.demo_images import DEFAULTS as defaults
        else:
            from naiad.cli.demo_video import DEFAULTS as defaults

        for option in ("csv", "features", "label", "rows"):
            if getattr(args, option) is not None:
                raise ConfigError(f"`--{option}` is an option of the CSV demo, not of `naiad demo {args.mode}`; "
                                  f"drop it, or run `naiad demo` without `{args.mode}`.")
    else:
        defaults = _CSV_DEFAULTS
    _refuse_other_sizes(args)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def _refuse_other_sizes(args: argparse.Namespace) -> None:
    """A size option of another mode than ``args.mode`` (``--images``, ``--videos``) is a ConfigError."""
    from naiad.errors import ConfigError

    own = {"images": "images", "video": "videos"}.get(args.mode)
    for option, value in {"images": args.images, "videos": args.videos}.items():
        if option == own or value is None:
            continue
        mode = "images" if option == "images" else "video"
        if own is None:
            raise ConfigError(f"`--{option}` sets the {option} of `naiad demo {mode}`, got {value} without "
                              f"`{mode}`; run `naiad demo {mode} --{option} N`, or give `--rows` for the CSV demo.")
        raise ConfigError(f"`--{option}` sets the {option} of `naiad demo {mode}`, not of `naiad demo "
                          f"{args.mode}`; drop it, or run `naiad demo {mode} --{option} {value}`.")


def run(args: argparse.Namespace) -> int:
    """Run the demo (``images``: the image demo; ``video``: the video demo); returns the exit status."""
    import torch.utils.data as tud

    resolve_mode(args)
    if args.mode == "images":
        from naiad.cli.demo_images import run_images

        return run_images(args)
    if args.mode == "video":
        from naiad.cli.demo_video import run_video

        return run_video(args)

    import naiad
    from naiad.cli.demo_data import diabetes_csv

    if args.csv:
        path = args.csv
        source = path
    else:
        t0 = time.perf_counter()
        path = str(diabetes_csv(rows=args.rows))
        source = f"built-in diabetes-shaped data ({args.rows:,} rows, made in {time.perf_counter() - t0:.1f}s or cached) at {path}"
    features = args.features.split(",") if args.features else None
    x, y, features, label, mean, std = load_csv(path, features, args.label)
    dataset = tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    print(f"naiad demo: {source}")
    print(
        f"{len(dataset):,} rows x {len(features)} features -> {label!r}; batch {args.batch_size}, "
        f"shuffle, {args.epochs} epoch(s), num_workers={args.num_workers}, {os.cpu_count()} CPU cores\n"
    )
    common = dict(batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    runs = [
        ("torch.utils.data.DataLoader", lambda: tud.DataLoader(dataset, **common)),
        ("naiad.DataLoader", lambda: naiad.DataLoader(dataset, **common)),
        (
            "naiad streaming the CSV",
            lambda: naiad.DataLoader(
                naiad.read_csv(path, columns=[*features, label]),
                **common,
                seed=args.seed,
                transform=Standardize(features, label, mean, std),
            ),
        ),
    ]
    results = []
    for name, make in runs:
        results.append(train(name, make, len(features), args.epochs, args.lr, args.seed))
        print(f"  {name}: {results[-1].total_s:.2f}s", flush=True)
    print()
    print(format_table(results))
    print(
        "\nThe first two train on the same in-memory tensors, so they see the same batches and reach"
        "\nthe same loss; the third reads the file as it trains, in bounded memory, shuffled by"
        "\nblocks and a shuffle buffer (a different order, so a slightly different loss)."
    )
    return 0
