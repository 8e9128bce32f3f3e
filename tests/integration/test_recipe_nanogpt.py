"""docs/TOKENS.md, "From nanoGPT's get_batch": nanoGPT's training loop as it is shaped (the first
batch fetched before the loop, the next one fetched right after the forward pass, evaluation on
batches of its own, a checkpoint every few iterations), with get_batch replaced by naiad loaders
and the checkpoint holding ``loader.state_dict(pending=1)``. An interrupted and resumed run gives
the uninterrupted run's batches bit for bit (and its losses, up to the order of a threaded
backward's sums), across epoch boundaries."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import naiad

pytestmark = pytest.mark.timeout(120)

VOCAB, BLOCK, BATCH = 64, 16, 4
MAX_ITERS, EVAL_INTERVAL, EVAL_ITERS = 40, 10, 3


class Bigram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.table(x)
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))


def _write(folder: Path) -> dict[str, str]:
    rng = np.random.default_rng(0)
    out = {}
    for split, n in (("train", 1_000), ("val", 600)):  # train: 15 batches an epoch
        path = folder / f"{split}.bin"
        rng.integers(0, VOCAB, n).astype(np.uint16).tofile(path)  # nanoGPT's prepare.py format
        out[split] = str(path)
    return out


def _train(data: dict[str, str], *, stop_at: int | None = None, checkpoint: dict[str, Any] | None = None,
           num_workers: int = 0) -> tuple[list[tuple[int, float]], list[float], dict[str, Any] | None]:
    """nanoGPT's train.py loop; returns each step's batch (a checksum of its tokens) and loss, the
    evaluation losses and, with ``stop_at``, the checkpoint saved at that iteration (the run stops
    there, as if killed)."""
    torch.manual_seed(1337)
    model = Bigram()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_loader = naiad.DataLoader(naiad.read_tokens(data["train"], seq_len=BLOCK), batch_size=BATCH,
                                    shuffle=True, seed=1337, num_workers=num_workers)
    # Evaluation reads loaders of its own: get_batch('train') in estimate_loss would otherwise
    # take windows from the training epoch.
    eval_loaders = {split: naiad.DataLoader(naiad.read_tokens(path, seq_len=BLOCK), batch_size=BATCH,
                                            shuffle=True, seed=7) for split, path in data.items()}
    iter_num = 0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        train_loader.load_state_dict(checkpoint["loader"])
        iter_num = checkpoint["iter_num"]
    batches = iter(train_loader)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal batches
        batch = next(batches, None)
        if batch is None:  # the epoch ended: the next one
            batches = iter(train_loader)
            batch = next(batches)
        return batch["input_ids"], batch["labels"]

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = [model(b["input_ids"], b["labels"]).item()
                  for _, b in zip(range(EVAL_ITERS), iter(eval_loaders["val"]), strict=False)]
        model.train()
        return float(np.mean(losses))

    train_losses: list[tuple[int, float]] = []
    eval_losses: list[float] = []
    X, Y = get_batch()  # fetch the very first batch
    while iter_num < MAX_ITERS:
        if iter_num % EVAL_INTERVAL == 0:
            eval_losses.append(estimate_loss())
        if iter_num == stop_at:
            saved = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
                     "iter_num": iter_num, "loader": train_loader.state_dict(pending=1)}  # X, Y: not trained on
            return train_losses, eval_losses, saved
        loss = model(X, Y)
        trained = int((X * torch.arange(1, X.numel() + 1).view_as(X)).sum())  # which windows, in order
        X, Y = get_batch()  # immediately async prefetch next batch while model is doing the backward pass
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_losses.append((trained, loss.item()))
        iter_num += 1
    return train_losses, eval_losses, None


@pytest.mark.parametrize("stop_at", [15, 22, 30], ids=["at-an-epoch-end", "mid-epoch", "at-an-eval"])
def test_a_resumed_nanogpt_loop_gives_the_uninterrupted_losses(tmp_path: Path, stop_at: int) -> None:
    data = _write(tmp_path)
    whole, whole_eval, _ = _train(data)
    before, eval_before, saved = _train(data, stop_at=stop_at)
    assert saved is not None
    after, eval_after, _ = _train(data, checkpoint=saved, num_workers=2)
    got = before + after
    assert [b for b, _ in got] == [b for b, _ in whole]  # bit for bit: the same windows in the same order
    # The losses too, up to the order in which a threaded backward sums the embedding's gradients.
    assert np.allclose([x for _, x in got], [x for _, x in whole], rtol=1e-5, atol=0)
    assert len(whole) == MAX_ITERS and np.allclose(eval_before, whole_eval[:len(eval_before)], rtol=1e-5)


def test_without_pending_the_resumed_loop_skips_a_batch(tmp_path: Path) -> None:
    data = _write(tmp_path)
    whole, _, _ = _train(data)
    before, _, saved = _train(data, stop_at=22)
    assert saved is not None
    lossy_loader = naiad.DataLoader(naiad.read_tokens(data["train"], seq_len=BLOCK), batch_size=BATCH,
                                    shuffle=True, seed=1337)
    lossy_loader.load_state_dict(saved["loader"])
    it = iter(lossy_loader)
    next(it)  # what state_dict() without pending would have counted: the batch held
    saved["loader"] = lossy_loader.state_dict()
    del it
    after, _, _ = _train(data, checkpoint=saved)
    assert [b for b, _ in before + after] != [b for b, _ in whole]
