"""The built-in image data of `naiad demo images`: the folder's layout, and classes a model can learn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from naiad.cli.demo_data import FASHION_CLASSES, fashion_folder, fashion_pixels


def test_fashion_pixels_are_28x28_uint8_and_the_same_for_the_same_seed() -> None:
    labels = np.arange(50) % 10
    a = fashion_pixels(labels, np.random.default_rng(3))
    b = fashion_pixels(labels, np.random.default_rng(3))
    assert a.shape == (50, 28, 28) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, fashion_pixels(labels, np.random.default_rng(4)))


def test_fashion_classes_are_learnable_by_a_nearest_centroid() -> None:
    rng = np.random.default_rng(0)
    train_labels, test_labels = np.arange(2000) % 10, np.arange(500) % 10
    train = fashion_pixels(train_labels, rng).reshape(2000, -1).astype(np.float32)
    test = fashion_pixels(test_labels, rng).reshape(500, -1).astype(np.float32)
    centroids = np.stack([train[train_labels == c].mean(0) for c in range(10)])
    predicted = ((test[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    accuracy = float((predicted == test_labels).mean())
    assert accuracy > 0.8  # the shapes differ: far above chance (0.1) with the simplest classifier (0.95)
    # ...but not one pixel's worth: the noise and the random place, size and brightness matter.
    assert float(test.std()) > 40


def test_fashion_folder_is_made_once_as_image_folder_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    import naiad

    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path))
    root = fashion_folder(images=30, test_images=20)
    assert root == tmp_path / "fashion-30-20-0"
    assert [p.name for p in tmp_path.iterdir()] == ["fashion-30-20-0"]  # no temporary folder left
    source = naiad.read_images(root / "train", index_dir=False)
    assert source.classes == list(FASHION_CLASSES)
    assert sum(len(list((root / "train" / c).iterdir())) for c in FASHION_CLASSES) == 30
    assert sum(len(list((root / "test" / c).iterdir())) for c in FASHION_CLASSES) == 20
    with Image.open(root / "train" / "disc" / "000003.png") as img:  # image 3 is class 3, the disc
        assert (img.size, img.mode) == ((28, 28), "L")
    mtime = (root / "train" / "disc" / "000003.png").stat().st_mtime_ns
    assert fashion_folder(images=30, test_images=20) == root
    assert (root / "train" / "disc" / "000003.png").stat().st_mtime_ns == mtime  # reused, not made again
