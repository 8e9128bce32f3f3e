"""A Hugging Face Accelerate job over a naiad.DataLoader, for tests/integration/test_trainers.py.

Run under ``torchrun --nproc_per_node N`` (or alone): ``accelerator.prepare(model, optimizer,
loader)`` must hand naiad's loader back as it is; the job trains two epochs and appends, per
rank and step, ``{"epoch", "step", "ids"}`` to ``OUT/accelerate-{rank}.jsonl``.
``--save-at K`` saves ``accelerator.save_state()`` (naiad's loader state included) after step K,
``--crash-at K`` kills the job after step K, ``--resume DIR`` starts from a saved state.
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
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--resume", default=None)
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
    step = 0
    if args.resume:
        accelerator.load_state(args.resume)  # naiad's loader state too (use_stateful_dataloader)
        with open(os.path.join(args.resume, "step.json")) as f:
            step = json.load(f)["step"]
    log = open(os.path.join(args.out, f"accelerate-{accelerator.process_index}.jsonl"), "a")
    for epoch in range(loader.epoch, 2):
        loader.set_epoch(epoch)
        for batch in prepared:
            x = batch[0] if isinstance(batch, (list, tuple)) else batch["id"]
            loss = model(x.float().unsqueeze(1)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            log.write(json.dumps({"epoch": epoch, "step": step, "ids": x.tolist(), "fetch": loader.fetch_strategy}) + "\n")
            log.flush()
            if step == args.save_at:
                accelerator.save_state(os.path.join(args.out, "state"))
                if accelerator.is_main_process:
                    with open(os.path.join(args.out, "state", "step.json"), "w") as f:
                        json.dump({"step": step}, f)
                accelerator.wait_for_everyone()
            if step == args.crash_at:
                os._exit(3)
    log.close()
    # The process group destroyed before the interpreter goes: gloo's threads alive at exit end
    # the process with "terminate called without an active exception" (SIGABRT) now and then.
    accelerator.end_training()


if __name__ == "__main__":
    main()
