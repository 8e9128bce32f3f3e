"""``naiad.images.normalize``: uint8 images to normalised floats where they live (the device)."""

from __future__ import annotations

import pytest
import torch

import naiad
from naiad.errors import ConfigError


def test_normalize_matches_the_float_formula() -> None:
    x = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = naiad.images.normalize(x, mean, std)
    expected = (x.double() / 255 - torch.tensor(mean, dtype=torch.float64).view(3, 1, 1)) / torch.tensor(std, dtype=torch.float64).view(3, 1, 1)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, atol=1e-5)
    half = naiad.images.normalize(x[0], 0.5, 0.5, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.shape == (3, 5, 4)
    assert torch.allclose(half.float(), x[0].float() / 127.5 - 1, atol=0.02)
    with pytest.raises(ConfigError, match="needs 1 or 3 values"):
        naiad.images.normalize(x, (0.5, 0.5), (0.5, 0.5, 0.5))
