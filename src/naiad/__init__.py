"""naiad: feed PyTorch training from data of any size, as fast as the hardware allows."""

from __future__ import annotations

import gc as _gc
from typing import Any

# The collections this import's allocations would trigger each walk every object torch made
# (about half of `import naiad`, measured): none while the package loads. Whatever cycles it
# leaves are collected by the first collection after.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from naiad._version import __version__
    from naiad.dataset.fetch import ArrayDataset
    from naiad.dataset.worker import WorkerLocal, columnar
    from naiad.device.prefetch import DevicePrefetcher
    from naiad.errors import ConfigError, NaiadError, SourceError, StateError, WorkerError
    from naiad.loader import DataLoader
    from naiad.media import decode_audio, decode_images, decode_video, images  # images.normalize
    from naiad.media.keys import batch_uniforms
    from naiad.parallel import AutoTuner, worker_rng
    from naiad.sources import (
        CsvFormat,
        MediaAccess,
        SkipBadRows,
        Source,
        Storage,
        read,
        read_arrow,
        read_csv,
        read_hf,
        read_images,
        read_jsonl,
        read_npy,
        read_parquet,
        read_text,
        read_videos,
        read_webdataset,
    )
    from naiad.stream.batching import pack_xy
    from naiad.telemetry import LoaderStats, Telemetry
    from naiad.tokens import mix, read_tokens, tokenize
    from naiad.transforms import Placement, Transform, to_tuple
finally:
    if _collecting:
        _gc.enable()

__all__ = [
    "ArrayDataset",
    "AutoTuner",
    "CsvFormat",
    "DataLoader",
    "DevicePrefetcher",
    "LoaderStats",
    "MediaAccess",
    "Placement",
    "SkipBadRows",
    "Source",
    "Storage",
    "Telemetry",
    "Transform",
    "WorkerLocal",
    "batch_uniforms",
    "columnar",
    "decode_audio",
    "decode_images",
    "decode_video",
    "images",
    "mix",
    "pack_xy",
    "read",
    "read_arrow",
    "read_csv",
    "read_hf",
    "read_images",
    "read_jsonl",
    "read_npy",
    "read_parquet",
    "read_text",
    "read_videos",
    "read_tokens",
    "read_webdataset",
    "testing",
    "to_tuple",
    "tokenize",
    "worker_rng",
    "ConfigError",
    "NaiadError",
    "SourceError",
    "StateError",
    "WorkerError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """``naiad.testing`` (``check_resume``, the conformance check for your own loaders), imported
    when first asked for: it brings the offline coverage check, a quarter of a second that a
    training script need not pay."""
    if name == "testing":
        import naiad.testing as testing

        return testing
    raise AttributeError(f"module 'naiad' has no attribute {name!r}")
