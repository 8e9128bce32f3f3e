"""Small real images for the image tests, written with Pillow: a photo-like picture for the
decoding tests (tests/unit/test_decode_images*.py) and a flat PNG for the sample readers'
(tests/integration/test_samples_*.py). A test module imports it after
``pytest.importorskip("PIL")``, so that it is skipped without Pillow."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

RNG = np.random.default_rng(31)


def photo(width: int, height: int, noise: float = 3.0) -> Image.Image:
    """A photo-like RGB image: smooth colour waves, a hard-edged disc, a little sensor noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([128 + 90 * np.sin(x / (23 + 7 * c) + c) * np.cos(y / (31 + 5 * c) + 2 * c) for c in range(3)], -1)
    base[(x - width / 2) ** 2 + (y - height / 3) ** 2 < (min(width, height) / 5) ** 2] = (250, 30, 60)
    base += RNG.normal(0, noise, base.shape)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str = "JPEG", **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def png(value: int, size: int = 6) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()
