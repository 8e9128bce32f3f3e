"""A PyTorch Lightning job over a naiad.DataLoader, for tests/integration/test_trainers.py.

``python lightning_job.py --out DIR [--devices N] [--source map|stream] [--seed S]
[--ckpt-every K] [--crash-at STEP] [--resume CKPT] [--epochs E]``

The loader is made in ``train_dataloader()`` with the plain import swap (``shuffle=True``,
``seed`` only when given), as a Lightning user writes it; with ``--devices 2`` Lightning runs
DDP on CPU (gloo) and injects its DistributedSampler. Each rank appends, per training step, a
JSON line ``{"epoch", "step", "ids"}`` to ``DIR/log-rank{r}.jsonl``; ``--crash-at`` kills the
job (``os._exit``) after that many steps, once Lightning's checkpoint callback has run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

import naiad  # noqa: E402
from tests.conftest_stream import open_numbered  # noqa: E402

ROWS = 100


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=None, help="folder of numbered CSV files (--source stream)")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--source", choices=["map", "stream"], default="map")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch: object, index: int) -> torch.Tensor:
            ids = batch[0] if isinstance(batch, (list, tuple)) else batch["id"]  # type: ignore[index, call-overload]
            with open(os.path.join(args.out, f"log-rank{self.global_rank}.jsonl"), "a") as f:
                f.write(json.dumps({"epoch": self.current_epoch, "step": self.global_step, "ids": ids.tolist()}) + "\n")
            return self.lin(ids.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-6)

        def train_dataloader(self) -> naiad.DataLoader:
            seed = {} if args.seed is None else {"seed": args.seed}
            if args.source == "map":
                return naiad.DataLoader(torch.utils.data.TensorDataset(torch.arange(ROWS)), batch_size=8, shuffle=True, **seed)
            paths = sorted(os.path.join(args.data, f) for f in os.listdir(args.data))
            return naiad.DataLoader(open_numbered(paths, "csv"), batch_size=8, shuffle=True, **seed)

    class Crash(Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *rest: object) -> None:
            if args.crash_at and trainer.global_step == args.crash_at:
                os._exit(3)

    callbacks: list[Callback] = [Crash()]
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.ckpt_every,
                                         save_top_k=-1, filename="{step}"))
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
        default_root_dir=args.out,  # Lightning's own end-of-epoch checkpoints go here, not in the cwd
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(Model(), ckpt_path=args.resume)


if __name__ == "__main__":
    main()
