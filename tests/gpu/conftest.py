"""Tests in this folder need a CUDA device: each is marked ``gpu`` and skipped without one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
