"""naiad: feed PyTorch training from data of any size, as fast as the hardware allows."""

from __future__ import annotations

from naiad.errors import ConfigError, NaiadError, SourceError, StateError, WorkerError
from naiad.fetch import ArrayDataset
from naiad.loader import DataLoader

__version__ = "0.1.0"

__all__ = [
    "ArrayDataset",
    "DataLoader",
    "ConfigError",
    "NaiadError",
    "SourceError",
    "StateError",
    "WorkerError",
    "__version__",
]
