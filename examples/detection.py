"""Detection: variable-size images with boxes, streamed from WebDataset shards by naiad.

What the Mask R-CNN tutorial's loader does with ``collate_fn=lambda x: tuple(zip(*x))``, done a
batch at a time: each sample is a ``.jpg`` and a ``.json`` (its boxes and labels) in a tar shard;
``naiad.decode_images("jpg")`` without ``size=`` decodes a batch's JPEGs into a list of uint8
``[3, H, W]`` tensors of their own sizes; the transform below pairs them with their targets as
the ``(images, targets)`` tuple a torchvision detection model takes; ``device="cuda"`` copies
each batch to the GPU ahead of the loop, on a side stream.

It runs on the CPU too, on data it makes (variable-size JPEGs of coloured rectangles), with a
tiny stand-in for the detection model (no torchvision): it classifies each box by the mean
colour inside it and returns a dict of losses, as ``model(images, targets)`` does in training.
docs/SAMPLES.md, "Detection: variable-size images with boxes".

    python examples/detection.py                       # 256 images, 2 epochs, on cuda if there is one
    python examples/detection.py --device cpu --workers 2 --images 64
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

import naiad

CLASSES = ("background", "red", "green", "blue")  # label 0 is the background, as in torchvision
COLOURS = {1: (220, 40, 40), 2: (40, 200, 60), 3: (50, 70, 230)}


def make_shards(folder: Path, images: int, per_shard: int = 64, seed: int = 0) -> list[str]:
    """Tar shards of ``images`` samples: ``<key>.jpg`` (160-480 x 120-360 pixels, 1-4 rectangles
    of the classes' colours on a noisy grey) and ``<key>.json`` (``{"boxes": [[x0, y0, x1, y1],
    ...], "labels": [...]}`` in pixels), as WebDataset's writers lay them out."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for first in range(0, images, per_shard):
        path = folder / f"detect-{first // per_shard:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(first, min(images, first + per_shard)):
                width, height = int(rng.integers(160, 481)), int(rng.integers(120, 361))
                pixels = rng.normal(128, 20, (height, width, 3)).clip(0, 255).astype(np.uint8)
                boxes, labels = [], []
                for _ in range(int(rng.integers(1, 5))):
                    w, h = int(rng.integers(24, width // 2)), int(rng.integers(24, height // 2))
                    x0, y0 = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
                    label = int(rng.integers(1, len(CLASSES)))
                    pixels[y0:y0 + h, x0:x0 + w] = COLOURS[label] + rng.normal(0, 25, (h, w, 3))
                    boxes.append([x0, y0, x0 + w, y0 + h])
                    labels.append(label)
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
                target = json.dumps({"boxes": boxes, "labels": labels}).encode()
                for name, data in ((f"{i:06d}.jpg", jpeg.getvalue()), (f"{i:06d}.json", target)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


class ToDetection:
    """The end of the loader's transforms: a batch of decoded samples to the ``(images, targets)``
    tuple.

    naiad's batch is a dict of columns, ``{"__key__": [...], "jpg": [tensor, ...], "json":
    [{"boxes": ..., "labels": ...}, ...]}`` once ``naiad.decode_images("jpg")`` (in the workers,
    before it in the list) has decoded it; the Mask R-CNN tutorial's ``collate_fn=lambda x:
    tuple(zip(*x))`` gives ``(images, targets)``, a tuple of image tensors and a tuple of target
    dicts. This makes the second from the first, once per batch, in the loop: a few small
    tensors, while the decode stays in the workers.
    """

    def __call__(self, batch: dict[str, Any]) -> tuple[tuple[torch.Tensor, ...], tuple[dict[str, torch.Tensor], ...]]:
        targets = tuple(
            {
                "boxes": torch.tensor(sample["boxes"], dtype=torch.float32).reshape(-1, 4),
                "labels": torch.tensor(sample["labels"], dtype=torch.int64),
                "image_id": torch.tensor(int(key)),
            }
            for sample, key in zip(batch["json"], batch["__key__"], strict=True)
        )
        return tuple(batch["jpg"]), targets


class BoxColourModel(torch.nn.Module):
    """A stand-in for a detection model's training call: ``model(images, targets)`` with float
    images in [0, 1] returns a dict of losses. Like torchvision's detection models it normalises
    the images itself (ImageNet's mean and std); it classifies each target box by the mean
    colour inside it."""

    mean: torch.Tensor  # buffers: they go to the device with the model
    std: torch.Tensor

    def __init__(self, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.classifier = torch.nn.Linear(3, classes)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).reshape(3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).reshape(3, 1, 1))

    def forward(self, images: list[torch.Tensor], targets: tuple[dict[str, torch.Tensor], ...]) -> dict[str, torch.Tensor]:
        """``{"loss_classifier": cross-entropy of the boxes' classes}``."""
        features, labels = [], []
        for image, target in zip(images, targets, strict=True):
            x = (image - self.mean) / self.std
            for x0, y0, x1, y1 in target["boxes"].round().long().tolist():
                features.append(x[:, y0:y1, x0:x1].mean(dim=(1, 2)))
            labels.append(target["labels"])
        logits = self.classifier(torch.stack(features))
        return {"loss_classifier": torch.nn.functional.cross_entropy(logits, torch.cat(labels))}


def describe(images: tuple[torch.Tensor, ...], targets: tuple[dict[str, torch.Tensor], ...]) -> str:
    """One batch in words: each image's shape, dtype and device with its boxes and labels."""
    lines = [f"a batch: {len(images)} images, {len(targets)} targets"]
    for image, target in zip(images, targets, strict=True):
        lines.append(f"  image {int(target['image_id'])}: {image.dtype} {list(image.shape)} on {image.device}; "
                     f"boxes {list(target['boxes'].shape)}, labels {target['labels'].tolist()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Make the shards, stream them for ``--epochs``, train the stand-in; returns 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=256, help="samples to make (default 256)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    parser.add_argument("--batch-size", type=int, default=4, help="images per batch (default 4)")
    parser.add_argument("--workers", type=int, default=0, help="naiad workers (default 0)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where batches go, prefetched (default: cuda if there is one, else cpu)")
    parser.add_argument("--data", default=None, help="folder for the shards (default: a temporary one)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="naiad-detection-") as tmp:
        shards = make_shards(Path(args.data or tmp), args.images)
        loader: naiad.DataLoader[Any] = naiad.DataLoader(
            naiad.read_webdataset(shards),
            batch_size=args.batch_size,
            shuffle=True,
            seed=0,
            num_workers=args.workers,
            # No size=: each image keeps its own size (boxes stay in its pixels), uint8 [3, H, W].
            transform=[naiad.decode_images("jpg"), ToDetection()],
            device=args.device,  # each batch copied ahead of the loop (cuda: on a side stream)
        )
        torch.manual_seed(0)
        model = BoxColourModel().to(args.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        print(f"{args.images} images in {len(shards)} shard(s), batch {args.batch_size}, "
              f"{args.workers} worker(s), device {args.device}")
        for epoch in range(args.epochs):
            seen: Counter[int] = Counter()
            total, batches, start = 0.0, 0, time.perf_counter()
            for images, targets in loader:
                if epoch == 0 and batches == 0:
                    print(describe(images, targets))
                # uint8 crossed to the device (a quarter of float32's bytes); floats in [0, 1] made there.
                floats = [image.float().div_(255) for image in images]
                loss_dict = model(floats, targets)  # as torchvision's detection models train
                losses = sum(loss_dict.values())
                optimizer.zero_grad()
                losses.backward()
                optimizer.step()
                seen.update(int(t["image_id"]) for t in targets)
                total += float(losses.detach())
                batches += 1
            once = sorted(seen) == list(range(args.images)) and set(seen.values()) == {1}
            print(f"epoch {epoch}: {batches} batches in {time.perf_counter() - start:.2f}s, "
                  f"mean loss {total / max(1, batches):.4f}, each image once: {once}")
            if not once:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
