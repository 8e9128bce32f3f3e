"""Built-in data: a diabetes-shaped CSV and a FashionMNIST-shaped image folder, made on first use
and cached.

The CSV's columns follow the Pima diabetes table of the classic PyTorch tutorial (8 numeric
features and a 0/1 ``Outcome``); the values are synthetic, drawn with plausible ranges, and the
label depends on the features through a logistic model, so a small network can learn it.

The image folder has FashionMNIST's shape (28x28 grayscale PNGs, 10 classes, one sub-folder per
class as torchvision's ``ImageFolder`` reads them); nothing can be downloaded, so each class is a
simple shape (a disc, a ring, a cross...) drawn at a random place, size and brightness, with
noise: a small network learns them in a few hundred steps.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from naiad.sources.cache import user_cache_dir

__all__ = ["DIABETES_COLUMNS", "FASHION_CLASSES", "diabetes_csv", "fashion_folder", "fashion_pixels", "make_diabetes_table"]

DIABETES_COLUMNS = (
    "Pregnancies",
    "Glucose",
    "BloodPressure",
    "SkinThickness",
    "Insulin",
    "BMI",
    "DiabetesPedigreeFunction",
    "Age",
    "Outcome",
)


def make_diabetes_table(rows: int, seed: int = 0) -> pa.Table:
    """A diabetes-shaped table of ``rows`` rows: 8 float32 features and an int ``Outcome``."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    features = {
        "Pregnancies": rng.poisson(3.8, rows).astype(f32),
        "Glucose": np.clip(rng.normal(121, 32, rows), 40, 200).round().astype(f32),
        "BloodPressure": np.clip(rng.normal(69, 19, rows), 20, 122).round().astype(f32),
        "SkinThickness": np.clip(rng.normal(21, 16, rows), 0, 99).round().astype(f32),
        "Insulin": np.clip(rng.exponential(80, rows), 0, 846).round().astype(f32),
        "BMI": np.clip(rng.normal(32, 7.9, rows), 15, 67).round(1).astype(f32),
        "DiabetesPedigreeFunction": np.clip(rng.gamma(2.0, 0.24, rows), 0.08, 2.42).round(3).astype(f32),
        "Age": np.clip(rng.gamma(3.0, 11.0, rows) + 21, 21, 81).round().astype(f32),
    }
    logit = (
        0.035 * (features["Glucose"] - 121)
        + 0.09 * (features["BMI"] - 32)
        + 0.12 * (features["Pregnancies"] - 3.8)
        + 0.9 * (features["DiabetesPedigreeFunction"] - 0.47)
        + 0.015 * (features["Age"] - 33)
        - 0.65
    )
    outcome = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({**features, "Outcome": outcome})


def diabetes_csv(rows: int = 1_000_000, path: str | os.PathLike[str] | None = None, seed: int = 0) -> Path:
    """Path of a diabetes-shaped CSV of ``rows`` rows, written once into the cache and reused.

    Args:
        rows: number of data rows (a header line comes first).
        path: where to write it; by default ``user_cache_dir()/diabetes-{rows}-{seed}.csv``.
        seed: the data's random seed.

    Example:
        >>> p = diabetes_csv(rows=1000)  # doctest: +SKIP
        >>> p.read_text().splitlines()[0]  # doctest: +SKIP
        'Pregnancies,Glucose,BloodPressure,SkinThickness,Insulin,BMI,DiabetesPedigreeFunction,Age,Outcome'
    """
    target = Path(path) if path is not None else user_cache_dir() / f"diabetes-{rows}-{seed}.csv"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name (O_EXCL, mode 0600): a predictable one could be a link planted in a shared folder.
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        options = pacsv.WriteOptions(include_header=True, quoting_style="none")
        # Write in slices so making a large file stays in bounded memory.
        chunk = 1_000_000
        with os.fdopen(fd, "wb") as f, pacsv.CSVWriter(f, make_diabetes_table(1, seed).schema, write_options=options) as writer:
            for start in range(0, rows, chunk):
                writer.write_table(make_diabetes_table(min(chunk, rows - start), seed + start))
        os.chmod(tmp, 0o644)  # synthetic data: readable like any file once in place
        os.replace(tmp, target)  # atomic: a reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)
    return target


FASHION_CLASSES = ("checker", "cross", "diagonal", "disc", "hbar", "ring", "square", "stripes", "triangle", "vbar")
"""The shapes of the built-in image classes, in label order (sorted, as ``ImageFolder`` numbers them)."""


def fashion_pixels(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """28x28 grayscale images, ``uint8 [N, 28, 28]``, of the shapes ``labels`` name (0-9).

    Each image is its class's shape (``FASHION_CLASSES``) centred within 2 pixels of the middle,
    of radius 8-11 pixels and brightness 0.7-1, plus Gaussian noise of 0.15: learnable, but not
    at a glance by one pixel.
    """
    n = len(labels)
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float32)
    cx = (13.5 + rng.uniform(-2, 2, n)).astype(np.float32)[:, None, None]
    cy = (13.5 + rng.uniform(-2, 2, n)).astype(np.float32)[:, None, None]
    r = rng.uniform(8, 11, n).astype(np.float32)[:, None, None]
    dx, dy = xx - cx, yy - cy
    d = np.sqrt(dx * dx + dy * dy)
    inside = d < r
    shapes = np.stack([  # the classes of FASHION_CLASSES, [10, N, 28, 28]
        (np.abs(dx) < r) & (np.abs(dy) < r) & ((np.floor(xx / 5) + np.floor(yy / 5)) % 2 == 0),  # checker
        ((np.abs(dx) < 3) | (np.abs(dy) < 3)) & inside,  # cross
        (np.abs(dx - dy) < 4) & inside,  # diagonal
        inside,  # disc
        (np.abs(dy) < 4) & (np.abs(dx) < r),  # hbar
        inside & (d > r - 4),  # ring
        (np.abs(dx) < 0.8 * r) & (np.abs(dy) < 0.8 * r),  # square
        inside & (np.floor(yy / 4) % 2 == 0),  # stripes
        (dy > -0.6 * r) & (dy < 0.8 * r) & (np.abs(dx) < 0.7 * (dy + 0.6 * r)),  # triangle
        (np.abs(dx) < 4) & (np.abs(dy) < r),  # vbar
    ])
    shape = shapes[labels, np.arange(n)].astype(np.float32)
    brightness = rng.uniform(0.7, 1.0, n).astype(np.float32)[:, None, None]
    img = shape * brightness + rng.normal(0, 0.15, (n, 28, 28)).astype(np.float32)
    pixels: np.ndarray = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
    return pixels


def _write_split(root: Path, images: int, rng: np.random.Generator) -> None:
    """``images`` PNGs under ``root/<class>/<number>.png``, the classes in turn."""
    from PIL import Image

    for name in FASHION_CLASSES:
        (root / name).mkdir(parents=True)
    chunk = 4096  # bounded memory: the shape masks are [10, chunk, 28, 28]
    for start in range(0, images, chunk):
        labels = np.arange(start, min(images, start + chunk)) % len(FASHION_CLASSES)
        for i, (label, pixels) in enumerate(zip(labels, fashion_pixels(labels, rng), strict=True)):
            Image.fromarray(pixels, "L").save(root / FASHION_CLASSES[label] / f"{start + i:06d}.png")


def fashion_folder(images: int = 6000, test_images: int = 1000, seed: int = 0) -> Path:
    """A FashionMNIST-shaped image folder, made once in the cache and reused: its path.

    ``<path>/train`` holds ``images`` 28x28 grayscale PNGs and ``<path>/test`` ``test_images``,
    each in one sub-folder per class (``FASHION_CLASSES``), as ``naiad.read_images`` and
    torchvision's ``ImageFolder`` read them. Needs Pillow (``naiad[images]``).

    Example:
        >>> root = fashion_folder(images=2000)  # doctest: +SKIP
        >>> sorted(p.name for p in (root / "train").iterdir())[:3]  # doctest: +SKIP
        ['checker', 'cross', 'diagonal']
    """
    def write(tmp: Path) -> None:
        rng = np.random.default_rng(seed)
        _write_split(tmp / "train", images, rng)
        _write_split(tmp / "test", test_images, rng)

    return cached_folder(f"fashion-{images}-{test_images}-{seed}", write)


def cached_folder(name: str, write: Callable[[Path], None]) -> Path:
    """The cache's folder ``name``, made by ``write(folder)`` the first time and reused after."""
    target = user_cache_dir() / name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Made under a fresh private name and renamed into place: a reader never sees half a folder.
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        write(tmp)
        os.chmod(tmp, 0o755)  # synthetic data: readable like any folder once in place
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():  # not a concurrent maker that got there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
