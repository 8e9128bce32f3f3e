"""``naiad demo video``: a small action recogniser trained from a folder of videos, with torch's
DataLoader over a per-sample PyAV dataset and with naiad's.

It makes (once, in the cache) an action-recognition-shaped folder of short videos with PyAV
(``cli/demo_video_data.action_folder``: a square moving left, right, up or down, one class folder
per motion, nothing downloaded), converts it (once) to WebDataset tar shards with ``naiad convert
--keyframe-interval``, and trains a small 3D CNN on clips of 8 frames every 2 (64x64, the
shorter side resized to 64 and centre-cropped; a random clip per video per epoch) with each
loader from the same seed and initialisation:

1. ``torch.utils.data.DataLoader`` over :class:`PyAVClipDataset`, a dataset that decodes one
   video per ``__getitem__`` as PyAV's documentation decodes (``container.decode(video=0)``
   from the start to the clip's last frame) and resizes with torch;
2. ``naiad.DataLoader`` over the same dataset (the drop-in: the same batches, the same loss);
3. naiad from the folder: ``naiad.read_videos`` + ``naiad.decode_video`` (a seek to the
   keyframe before the clip, FFmpeg's scaler, a batch's videos decoded on threads);
4. naiad from the tar shards: ``naiad.read_webdataset`` + ``naiad.decode_video("mp4")``.

Each run's delivered videos are checked: every video exactly once per epoch. Needs PyAV
(``pip install 'naiad[video]'``); without it the demo says so and exits 1.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from naiad.cli.demo_images import (
    ImageRun,
    ImageRunResult,
    RecordingSampler,
    evaluate,
    key_of,
    model_threads_leave_a_core,
    train_and_report,
    train_run,
    unpack_torch,
    warm_up,
)
from naiad.cli.steps import speed_ups
from naiad.parallel.threads import usable_cores
from naiad.tools.video_files import pyav_for

__all__ = ["ActionModel", "PyAVClipDataset", "format_video_table", "run_video"]

DEFAULTS = {"videos": 96, "epochs": 3, "batch_size": 8, "num_workers": 0, "lr": 0.1}
"""What ``naiad demo video``'s options default to."""

FRAMES, STRIDE, SIZE = 8, 2, 64
"""The clip: 8 frames every 2, 64x64 (the shorter side resized to 64, the centre cut)."""

KEYFRAME_INTERVAL = 16
"""The shards' keyframe interval (``naiad convert --keyframe-interval``): about a clip's span."""


def test_videos(videos: int) -> int:
    """The test split's size: a third of the training videos, between 8 and 200."""
    return max(8, min(200, videos // 3))


class PyAVClipDataset(tud.Dataset[tuple[torch.Tensor, int]]):
    """One random clip of one video per ``__getitem__``, as a user writes it with PyAV's docs.

    Classes are ``root``'s sub-folders in sorted order, the samples each class's ``.mp4`` files
    in sorted order (``read_videos``' listing). ``__getitem__`` opens the file, draws a clip start
    with Python's ``random`` (torch seeds it in each worker), decodes from the first frame
    (``container.decode(video=0)``) up to the clip's last, keeps every ``stride``-th frame
    (repeating the last of a video too short), resizes the shorter side to ``size`` with torch
    and cuts the centre: a float ``[3, T, size, size]`` in [0, 1] and the label.
    """

    def __init__(self, root: str | os.PathLike[str], frames: int = FRAMES, stride: int = STRIDE, size: int = SIZE) -> None:
        self.root = Path(root)
        self.frames, self.stride, self.size = frames, stride, size
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.samples = [(str(path), label) for label, name in enumerate(self.classes)
                        for path in sorted((self.root / name).rglob("*.mp4"))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        import av

        path, label = self.samples[index]
        span = (self.frames - 1) * self.stride + 1
        with av.open(path) as container:
            count = container.streams.video[0].frames
            start = random.randint(0, max(count - span, 0))
            wanted = range(start, start + span, self.stride)
            kept = []
            for i, frame in enumerate(container.decode(video=0)):
                if i in wanted:
                    kept.append(frame.to_ndarray(format="rgb24"))
                if i >= wanted[-1]:
                    break
        kept += [kept[-1]] * (self.frames - len(kept))
        clip = torch.from_numpy(np.stack(kept)).permute(0, 3, 1, 2).float().div_(255)  # [T, 3, H, W]
        h, w = clip.shape[-2:]
        scale = self.size / min(h, w)
        clip = torch.nn.functional.interpolate(clip, size=(max(self.size, round(h * scale)), max(self.size, round(w * scale))),
                                               mode="bilinear", align_corners=False)
        top, left = (clip.shape[-2] - self.size) // 2, (clip.shape[-1] - self.size) // 2
        return clip[..., top:top + self.size, left:left + self.size].transpose(0, 1).contiguous(), label

    def key(self, index: int) -> str:
        """The sample's key as ``naiad convert`` writes it: its path under the root, no suffix."""
        return key_of(self.samples[index][0], self.root)


class ActionModel(torch.nn.Module):
    """A small 3D CNN for clips ``[B, 3, T, H, W]`` in [0, 1]: two 3D convolutions, an average
    over each half of the clip and each quarter of the frame, a linear layer to the classes:
    where a feature is early and where it is late is the motion, which one frame does not show."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv3d(3, 16, kernel_size=(3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2)),
            torch.nn.ReLU(),
            torch.nn.MaxPool3d((1, 2, 2)),
            torch.nn.Conv3d(16, 32, kernel_size=3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool3d(2),
            torch.nn.Flatten(),
        )
        self.classify = torch.nn.Linear(32 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of the classes, ``[B, classes]``."""
        logits: torch.Tensor = self.classify(self.features((x - 0.5) / 0.25))
        return logits


def _unpacker(video: str, label: str, key: str) -> Any:
    """Read naiad's batch dicts: uint8 ``[B, T, 3, H, W]`` made float ``[B, 3, T, H, W]`` in [0, 1]."""

    def unpack(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        return batch[video].permute(0, 2, 1, 3, 4).float().div_(255), batch[label], batch[key]

    return unpack


def load_test(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split's centre clips in memory, ``[N, 3, T, H, W]`` floats and the labels."""
    import naiad

    source = naiad.read_videos(root)
    decode = naiad.decode_video("video", frames=FRAMES, stride=STRIDE, size=SIZE, crop="center", clip="center")
    xs, ys = [], []
    for batch in naiad.DataLoader(source, batch_size=64, transform=decode):
        xs.append(batch["video"].permute(0, 2, 1, 3, 4).float().div_(255))
        ys.append(batch["label"])
    return torch.cat(xs), torch.cat(ys)


def train_clips(run: ImageRun, args: argparse.Namespace, test: tuple[torch.Tensor, torch.Tensor],
                expected_keys: Sequence[str]) -> ImageRunResult:
    """Train a fresh :class:`ActionModel` for ``args.epochs`` over ``run``'s loader; time the loop
    and its waits, score the model on the test clips, check the videos each epoch delivered.
    The loader is made inside the timed region: a streaming loader's set-up is part of its cost."""
    torch.manual_seed(args.seed)
    random.seed(args.seed)  # the per-sample dataset's clip starts without workers
    model = ActionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return train_run(run, model, optimizer, args.epochs, test, expected_keys)


def format_video_table(results: list[ImageRunResult]) -> str:
    """The comparison table ``naiad demo video`` prints: ``naiad demo images``' in clips."""
    header = (f"{'loader':<34} {'clips/s':>10} {'wait/step':>12} {'total':>9} {'final loss':>11} "
              f"{'test loss':>10} {'accuracy':>9}")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.name:<34} {r.rows_per_s:>10,.1f} {r.wait_per_step_us / 1e3:>9,.1f} ms {r.total_s:>8.2f}s "
                     f"{r.final_loss:>11.4f} {r.test_loss:>10.4f} {100 * r.accuracy:>8.1f}%")
    return "\n".join(lines + speed_ups(results))


def converted(root: Path, seed: int) -> tuple[Path, float]:
    """The training folder converted (once, beside it in the cache) to tar shards, re-encoded
    with a keyframe every ``KEYFRAME_INTERVAL`` frames, shuffled."""
    from naiad.tools.convert_video import VideoConvertOptions, convert_videos

    t0 = time.perf_counter()
    tar = root / "shards" / "train.tar"
    if not (tar.parent / "train.manifest.json").exists():  # written last: without it, no finished convert
        convert_videos(str(root / "train"), str(tar), VideoConvertOptions(
            keyframe_interval=KEYFRAME_INTERVAL, shuffle=True, seed=seed, shard_bytes=1 << 20, overwrite=True))
    return tar, time.perf_counter() - t0


def make_runs(args: argparse.Namespace, root: Path, tar: Path) -> tuple[list[ImageRun], list[str]]:
    """The four loaders, and every training video's key."""
    import naiad

    train_dir = root / "train"
    dataset = PyAVClipDataset(train_dir)
    keys = [dataset.key(i) for i in range(len(dataset))]
    common = dict(batch_size=args.batch_size, num_workers=args.num_workers)
    torch_sampler = RecordingSampler(dataset)  # type: ignore[arg-type]
    naiad_sampler = RecordingSampler(dataset)  # type: ignore[arg-type]

    def recorded(sampler: RecordingSampler) -> Any:
        return lambda: [[keys[i] for i in drawn] for drawn in sampler.epochs]

    def decode(column: str) -> naiad.Transform:
        return naiad.decode_video(column, frames=FRAMES, stride=STRIDE, size=SIZE, crop="center")

    runs = [
        ImageRun("torch.utils.data.DataLoader", lambda: tud.DataLoader(dataset, sampler=torch_sampler, **common),
                 unpack_torch, recorded(torch_sampler)),
        ImageRun("naiad.DataLoader", lambda: naiad.DataLoader(dataset, sampler=naiad_sampler, **common),
                 unpack_torch, recorded(naiad_sampler)),
        ImageRun("naiad from the folder", lambda: naiad.DataLoader(
            naiad.read_videos(train_dir), shuffle=True, seed=args.seed, **common, transform=decode("video")),
            _unpacker("video", "label", "path"), key_of=lambda path: key_of(path, train_dir)),
        ImageRun("naiad from tar shards", lambda: naiad.DataLoader(
            naiad.read_webdataset(str(tar.parent / "train-*.tar")), shuffle=True, seed=args.seed, **common,
            transform=decode("mp4")), _unpacker("mp4", "cls", "__key__")),
    ]
    return runs, keys


def run_video(args: argparse.Namespace) -> int:
    """Run ``naiad demo video``; returns the exit status (1 when a loader missed or repeated a video).

    Raises:
        ConfigError: PyAV is not installed (``pip install 'naiad[video]'``).
    """
    from naiad.cli.demo_video_data import action_folder

    pyav_for("`naiad demo video`")
    t0 = time.perf_counter()
    root = action_folder(videos=args.videos, test_videos=test_videos(args.videos), seed=args.seed)
    made_s = time.perf_counter() - t0
    tar, convert_s = converted(root, args.seed)
    test = load_test(root / "test")
    # The model's threads leave a core to the loaders, as in `naiad demo images` (demo_images.py).
    with model_threads_leave_a_core():
        return _compare(args, root, tar, test, made_s, convert_s)


def _compare(args: argparse.Namespace, root: Path, tar: Path, test: tuple[torch.Tensor, torch.Tensor],
             made_s: float, convert_s: float) -> int:
    """Train with each loader, print the table; 1 when a loader missed or repeated a video."""
    runs, keys = make_runs(args, root, tar)
    print(f"naiad demo video: built-in action videos at {root} "
          f"(made in {made_s:.1f}s or cached; converted in {convert_s:.1f}s or cached)")
    print(f"  naiad convert {root / 'train'} {tar} --keyframe-interval {KEYFRAME_INTERVAL} --shuffle --seed {args.seed}")
    print(f"{len(keys):,} training and {len(test[1]):,} test videos, 96x72 H.264 at 25 fps, 40-64 frames, 4 motions; "
          f"clips of {FRAMES} frames every {STRIDE} at {SIZE}x{SIZE}; batch {args.batch_size}, shuffle, "
          f"{args.epochs} epoch(s), num_workers={args.num_workers}, SGD lr {args.lr}, {usable_cores()} CPU cores, "
          f"the model on {torch.get_num_threads()} thread(s)")
    warm_up(ActionModel(), test, args.batch_size, steps=3)
    torch.manual_seed(args.seed)
    before_loss, before_accuracy = evaluate(ActionModel(), *test)
    print(f"before training: test loss {before_loss:.4f}, accuracy {100 * before_accuracy:.1f}%\n")
    bad = train_and_report(runs, lambda run: train_clips(run, args, test, keys), format_video_table, keys, "video")
    print(
        "The first two run the same per-sample dataset and sampler draws (without workers the same clip"
        "\ndraws too, from Python's random, so the same loss); it decodes each video from its first frame"
        "\nand resizes with torch. naiad's readers seek to the keyframe before each clip, resize with"
        "\nFFmpeg's scaler and decode a batch's videos on threads, with clips keyed by (seed, epoch,"
        "\nvideo): other clips in another order, so another loss. Accuracy is on the test videos' centre clips."
    )
    return 1 if bad else 0
