"""A Hugging Face Accelerate job over a naiad.DataLoader, for tests/integration/test_trainers.py.

Run under ``torchrun --nproc_per_node N`` (or alone): ``accelerator.prepare(model, optimizer,
loader)`` must hand naiad's loader back as it is; the job trains two epochs and writes, per
rank, the ids of each batch to ``OUT/accelerate-{rank}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from accelerate import Accelerator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

import naiad  # noqa: E402
from tests.conftest_stream import open_numbered  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--source", choices=["map", "stream"], default="map")
    p.add_argument("--unsharded", action="store_true", help="a map-style loader without rank/world_size")
    args = p.parse_args()
    accelerator = Accelerator(cpu=True)
    if args.source == "map":
        shard = {} if args.unsharded else {"rank": accelerator.process_index, "world_size": accelerator.num_processes}
        loader = naiad.DataLoader(torch.utils.data.TensorDataset(torch.arange(100)), batch_size=8, shuffle=True,
                                  seed=1, **shard)
    else:
        paths = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
        loader = naiad.DataLoader(open_numbered(paths, "csv"), batch_size=8, shuffle=True, seed=1)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    if prepared is not loader:
        raise SystemExit(f"prepare() replaced naiad's loader with {type(prepared).__name__}")
    seen = []
    for epoch in range(2):
        for batch in prepared:
            x = batch[0] if isinstance(batch, (list, tuple)) else batch["id"]
            loss = model(x.float().unsqueeze(1)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.append([epoch, x.tolist()])
    with open(os.path.join(args.out, f"accelerate-{accelerator.process_index}.json"), "w") as f:
        json.dump({"batches": seen, "fetch": loader.fetch_strategy}, f)


if __name__ == "__main__":
    main()
