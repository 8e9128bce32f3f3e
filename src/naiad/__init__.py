"""naiad: feed PyTorch training from data of any size, as fast as the hardware allows."""

from __future__ import annotations

from naiad import testing  # check_resume: the conformance check for your own loaders
from naiad.batching import pack_xy
from naiad.device import DevicePrefetcher
from naiad.errors import ConfigError, NaiadError, SourceError, StateError, WorkerError
from naiad.fetch import ArrayDataset
from naiad.loader import DataLoader
from naiad.parallel import AutoTuner, worker_rng
from naiad.sources import (
    Source,
    read,
    read_arrow,
    read_csv,
    read_jsonl,
    read_npy,
    read_parquet,
    read_text,
)
from naiad.telemetry import LoaderStats, Telemetry
from naiad.worker import WorkerLocal, columnar

__version__ = "0.1.0"

__all__ = [
    "ArrayDataset",
    "AutoTuner",
    "DataLoader",
    "DevicePrefetcher",
    "LoaderStats",
    "Source",
    "Telemetry",
    "WorkerLocal",
    "columnar",
    "pack_xy",
    "read",
    "read_arrow",
    "read_csv",
    "read_jsonl",
    "read_npy",
    "read_parquet",
    "read_text",
    "testing",
    "worker_rng",
    "ConfigError",
    "NaiadError",
    "SourceError",
    "StateError",
    "WorkerError",
    "__version__",
]
