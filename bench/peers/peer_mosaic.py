"""MosaicML Streaming: ``MDSWriter`` once, then ``StreamingDataset`` under torch's ``DataLoader``.

The shuffle is the library's default (``py1e`` over blocks of ``shuffle_block_size`` samples).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

import numpy as np
import torch
from common import SEED, read_columns


def _import_streaming() -> Any:
    # `import streaming` imports streaming.vision, which needs torchvision; PyPI's torchvision does not
    # load beside the CPU build of torch this benchmark pins, and the MDS path never uses it. Stand-ins
    # for the two names streaming.vision imports let the package load.
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[name]
        names = ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")
        stub = {n: types.ModuleType(n) for n in names}
        for name, module in stub.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers calls find_spec
        stub["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        stub["torchvision.datasets"].CIFAR10 = object  # type: ignore[attr-defined]
        stub["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
        sys.modules.update(stub)
    import streaming

    return streaming


streaming = _import_streaming()


def versions() -> str:
    """mosaicml-streaming's version."""
    return f"mosaicml-streaming {streaming.__version__}, torch {torch.__version__}"


def convert(paths: dict[str, Any], opts: dict[str, Any]) -> None:
    """One ``write`` per row, uncompressed, shards of the default size limit."""
    x, ids = read_columns(paths["parquet"])
    columns = {"x": f"ndarray:float32:{x.shape[1]}", "id": "int64"}
    with streaming.MDSWriter(out=paths["out"], columns=columns) as writer:
        for i in range(len(ids)):
            writer.write({"x": x[i], "id": np.int64(ids[i])})


def open_loader(paths: dict[str, Any], batch_size: int, opts: dict[str, Any]) -> Any:
    """``StreamingDataset(shuffle=True)`` under ``DataLoader`` with ``opts["num_workers"]`` workers."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(local=paths["out"], shuffle=True, shuffle_seed=SEED, batch_size=batch_size)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=opts["num_workers"])


def batch_ids(batch: Any) -> Any:
    """The id column of a dict batch."""
    return batch["id"].numpy()
