"""docs/RECIPES.md, "A Lightning LightningDataModule": the recipe's data module as written there,
trained by a real Trainer on CPU, for tests/integration/test_recipes.py.

``python datamodule_job.py --data FOLDER --out FILE``: an image folder decoded in the workers,
random crops and flips, ``(image, target)`` batches; each training step appends the batch's
targets and the sum of its pixels to FILE as one JSON line per epoch step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

import naiad  # noqa: E402


class Images(L.LightningDataModule):
    """The recipe: train and validation loaders made in the hooks Lightning calls."""

    def __init__(self, root: str, batch_size: int = 8, num_workers: int = 2) -> None:
        super().__init__()
        self.root, self.batch_size, self.num_workers = root, batch_size, num_workers

    def train_dataloader(self) -> naiad.DataLoader:
        return naiad.DataLoader(
            naiad.read_images(self.root), batch_size=self.batch_size, shuffle=True, seed=0,
            num_workers=self.num_workers,
            transform=[naiad.decode_images("image", size=16, crop="random", flip=True),
                       naiad.to_tuple("image", "label")])

    def val_dataloader(self) -> naiad.DataLoader:
        return naiad.DataLoader(
            naiad.read_images(self.root), batch_size=self.batch_size, num_workers=self.num_workers,
            transform=[naiad.decode_images("image", size=16, resize=16, crop="center"),
                       naiad.to_tuple("image", "label")])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(3 * 16 * 16, 4)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
            image, target = batch
            with open(args.out, "a") as f:
                f.write(json.dumps({"epoch": self.current_epoch, "targets": target.tolist(),
                                    "pixels": int(image.long().sum())}) + "\n")
            return torch.nn.functional.cross_entropy(self.head(image.flatten(1).float() / 255), target)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
            image, target = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.head(image.flatten(1).float() / 255), target))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=os.path.dirname(args.out))
    trainer.fit(Model(), datamodule=Images(args.data))


if __name__ == "__main__":
    main()
