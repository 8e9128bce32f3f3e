"""docs/RECIPES.md, each recipe on a copy of its loop's shape: Hugging Face ``datasets`` with
``with_format("torch")`` replaced by ``naiad.read_hf``, and a Lightning ``LightningDataModule``
trained by a real Trainer. (torchvision's classification loop: tests/integration/
test_transform_lists.py; nanoGPT's: tests/integration/test_recipe_nanogpt.py.)"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import naiad
from tests.helpers import run_to_end

Image = pytest.importorskip("PIL.Image", reason="the recipes write images with Pillow (pip install 'naiad[test]')")

N = 24
JOBS = Path(__file__).resolve().parent / "jobs"


def _png(k: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(k).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.timeout(120)
def test_a_datasets_loop_with_read_hf_sees_what_with_format_torch_gives(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": _png(k), "path": None} for k in range(N)],
                                     "label": [k % 3 for k in range(N)]}, features=features)
    ds.save_to_disk(str(tmp_path / "pets"))
    ds = datasets.load_from_disk(str(tmp_path / "pets"))
    # The loop as Hugging Face's docs write it, over with_format("torch"): uint8 [C, H, W].
    reference = {}
    for batch in torch.utils.data.DataLoader(ds.with_format("torch"), batch_size=8):
        for image, label in zip(batch["image"], batch["label"], strict=True):
            reference[int(image.long().sum()) * 7 + int(label)] = image
    # The same loop body over naiad: the decode in the workers, the batch a dict as before.
    got = {}
    loader = naiad.DataLoader(naiad.read_hf(ds), batch_size=8, shuffle=True, seed=0, num_workers=2,
                              transform=naiad.decode_images("image"))
    for batch in loader:
        for image, label in zip(batch["image"], batch["label"], strict=True):
            got[int(image.long().sum()) * 7 + int(label)] = image
    assert sorted(got) == sorted(reference)
    assert all(torch.equal(got[k], reference[k]) for k in reference)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_lightning_datamodule_trains_on_every_image_once_an_epoch(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    for k in range(N):
        folder = tmp_path / "train" / f"class{k % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:03d}.png").write_bytes(_png(k))
    out = tmp_path / "steps.jsonl"
    done = run_to_end([sys.executable, str(JOBS / "datamodule_job.py"), "--data", str(tmp_path / "train"),
                       "--out", str(out)], timeout_s=200)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    for epoch in (0, 1):
        targets = [t for s in steps if s["epoch"] == epoch for t in s["targets"]]
        assert Counter(targets) == Counter(k % 4 for k in range(N))  # each image once an epoch
    pixels = [[s["pixels"] for s in steps if s["epoch"] == e] for e in (0, 1)]
    assert pixels[0] != pixels[1]  # another order and other crops each epoch
