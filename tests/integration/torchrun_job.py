"""A small DDP training job for ``torchrun``: streams uneven CSV files through naiad, checkpoints
mid-epoch, and logs every rank's batches so a test can account for every row.

Run by ``tests/integration/test_torchrun.py`` as
``python -m torch.distributed.run --nproc_per_node N ... torchrun_job.py --data D --out O ...``.
Rank and world size come from torch.distributed (the loader is never told them).

Each rank appends one JSON line per event to ``O/log-{tag}-rank{r}.jsonl``, flushed at once so a
SIGKILL loses nothing written before it:

- ``{"kind": "resume", "step", "epoch", "param_sum", "momentum_sum"}``: after loading a checkpoint.
- ``{"kind": "step", "step", "epoch", "batch", "ids", "loss"}``: after each optimizer step;
  ``step`` counts from 1 over the whole run (a resumed run continues the count).
- ``{"kind": "checkpoint", "step", "epoch", "batch", "param_sum", "momentum_sum"}`` (rank 0): the
  checkpoint file now covers steps 1..step.
- ``{"kind": "done", "step"}``: the last epoch ended and the process group was destroyed.

The checkpoint (``O/ckpt.pt``, written by rank 0 to a temporary file and renamed over the old
one) holds the model and optimizer state dicts, the step it covers, and the loader states as
JSON text: rank 0's ``loader.state_dict()`` under ``"loader"``. Ranks step in lockstep, so one
rank's state describes the job: every rank of the restarted job, on any world size, loads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import naiad

FEATURES = ("f0", "f1", "f2")
BLOCK_BYTES = 1024  # several blocks per file, some straddling two ranks' row ranges
SHUFFLE_BUFFER = 32  # smaller than a rank's rows, so a resume replays the buffer mid-stream


def write_data(directory: str, sizes: Sequence[int]) -> list[str]:
    """One CSV per entry of ``sizes`` with columns id, f0, f1, f2, label; ids run 0..sum-1."""
    paths = []
    start = 0
    for k, n in enumerate(sizes):
        ids = np.arange(start, start + n)
        start += n
        feats = np.stack([np.sin(ids * (j + 1) * 0.1) for j in range(len(FEATURES))], axis=1)
        label = feats @ np.array([0.5, -1.0, 2.0]) + 0.25
        path = os.path.join(directory, f"part-{k:02d}.csv")
        with open(path, "w") as f:
            f.write("id," + ",".join(FEATURES) + ",label\n")
            for i, x, y in zip(ids, feats, label, strict=True):
                f.write(f"{i}," + ",".join(f"{v:.6f}" for v in x) + f",{y:.6f}\n")
        paths.append(path)
    return paths


def make_loader(
    paths: Sequence[str], *, batch_size: int, seed: int, num_workers: int, **kw: object
) -> naiad.DataLoader:
    """The job's loader; the test builds the same one with explicit rank/world_size as reference."""
    source = naiad.read_csv(list(paths), block_bytes=BLOCK_BYTES)
    return naiad.DataLoader(
        source, batch_size=batch_size, shuffle=True, seed=seed, num_workers=num_workers,
        shuffle_buffer=SHUFFLE_BUFFER, **kw,  # type: ignore[arg-type]
    )


def _param_sum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


def _momentum_sum(optimizer: torch.optim.Optimizer) -> float:
    bufs = [s["momentum_buffer"] for s in optimizer.state.values() if s.get("momentum_buffer") is not None]
    return float(sum(b.double().abs().sum() for b in bufs))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder of part-*.csv")
    parser.add_argument("--out", required=True, help="folder for logs and the checkpoint")
    parser.add_argument("--tag", default="run", help="names this run's log files")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every K steps (0: never)")
    parser.add_argument("--stall-after-step", type=int, default=0, help="sleep after this step (0: never)")
    parser.add_argument("--resume", default=None, help="checkpoint to start from")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(len(FEATURES), 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    paths = sorted(os.path.join(args.data, p) for p in os.listdir(args.data) if p.endswith(".csv"))
    loader = make_loader(paths, batch_size=args.batch_size, seed=args.seed, num_workers=args.num_workers)
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    log = open(os.path.join(args.out, f"log-{args.tag}-rank{rank}.jsonl"), "a")

    def record(**fields: object) -> None:
        log.write(json.dumps(fields) + "\n")
        log.flush()

    step = 0
    if args.resume:
        ckpt = torch.load(args.resume, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        # The same world size continues exactly; another one delivers the rest of the epoch,
        # every row once across the new ranks (elastic resume).
        loader.load_state_dict(json.loads(ckpt["loader"]))
        step = int(ckpt["step"])
        record(kind="resume", step=step, epoch=loader.epoch,
               param_sum=_param_sum(model), momentum_sum=_momentum_sum(optimizer))
    ddp = DistributedDataParallel(model)

    for epoch in range(loader.epoch, args.epochs):  # load_state_dict set the epoch it stopped in
        loader.set_epoch(epoch)
        for batch_number, batch in enumerate(loader, 1):
            x = torch.stack([batch[f].float() for f in FEATURES], dim=1)
            y = batch["label"].float().unsqueeze(1)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # DDP's all-reduce: a collective every step
            optimizer.step()
            step += 1
            record(kind="step", step=step, epoch=epoch, batch=batch_number,
                   ids=batch["id"].tolist(), loss=loss.item())
            if args.ckpt_every and step % args.ckpt_every == 0:
                if rank == 0:
                    tmp = ckpt_path + ".tmp"
                    torch.save({
                        "step": step,
                        "epoch": epoch,
                        "world_size": world_size,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "loader": json.dumps(loader.state_dict()),
                    }, tmp)
                    os.replace(tmp, ckpt_path)
                    record(kind="checkpoint", step=step, epoch=epoch, batch=batch_number,
                           param_sum=_param_sum(model), momentum_sum=_momentum_sum(optimizer))
                dist.barrier()  # no rank goes on before the checkpoint covering this step exists
            if step == args.stall_after_step:
                time.sleep(3600)  # the test kills the job here
    dist.barrier()
    dist.destroy_process_group()
    record(kind="done", step=step)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
