"""The video loaders users run instead of naiad, for bench_video.py and bench_video_decoder.py, each
written as its own documentation writes it, and each optional: a peer that is not installed or does
not load is a reason (a str) instead of a loader, and the rest runs.

* torchcodec (``pip install torchcodec==0.13.0`` beside torch 2.13; its CPU build needs FFmpeg's
  shared libraries, on Debian 12 ``apt-get install libavutil57 libavcodec59 libavformat59
  libavdevice59 libavfilter8``): a map-style ``Dataset`` whose ``__getitem__`` makes a
  ``VideoDecoder`` with the decoder's own transforms (``Resize`` to the shorter side 128, then
  ``RandomCrop(112)``, FFmpeg's filter graph inside the decoder) and takes one random clip with
  ``torchcodec.samplers.clips_at_random_indices``, under torch's DataLoader.
* webdataset (a test dependency of naiad): ``WebDataset(urls).shuffle(...).map(clip).batched(...)``
  under ``WebLoader``, the ``.mp4`` member decoded per sample with PyAV in the map, as the
  per-sample PyAV dataset decodes it.
* SPDL (``pip install spdl==0.8.0``; it loads the FFmpeg libraries above): its pipeline,
  ``PipelineBuilder().add_source(paths).pipe(load, concurrency=2).aggregate(batch)``, the load
  ``spdl.io.load_video`` of the clip's time window with the filter graph
  ``get_video_filter_desc`` builds (the clip's frame rate, the scale and the crop in FFmpeg).
* DALI is not here: its video reader decodes on NVIDIA GPUs only.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

FRAMES, STRIDE, SHORTER, CROP, FPS = 16, 2, 128, 112, 30
SPAN = (FRAMES - 1) * STRIDE + 1


def shorter_side(width: int, height: int) -> tuple[int, int]:
    """(width, height) with the shorter side SHORTER, as torchvision's Resize(int)."""
    if width <= height:
        return SHORTER, int(SHORTER * height / width)
    return int(SHORTER * width / height), SHORTER


def label_of(path: str) -> int:
    return int(Path(path).parent.name.removeprefix("class"))


def why_not(error: BaseException) -> str:
    """One line for a peer that did not load."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}"


# --- torchcodec ----------------------------------------------------------------------------------------


def torchcodec_version() -> str:
    """torchcodec's version, or raises when it does not import (no FFmpeg libraries, a torch it was not built for)."""
    import torchcodec
    from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads the FFmpeg libraries)

    return str(torchcodec.__version__)


class TorchCodecClips(torch.utils.data.Dataset):
    """One random clip of each video per ``__getitem__``, as torchcodec's docs decode one: a
    ``VideoDecoder`` per video with its own transforms, ``clips_at_random_indices`` for the clip.

    The resize's (height, width) is read from each video's metadata once, here (torchcodec's
    ``Resize`` takes a size, not a shorter side). ``seek_mode="approximate"``: its docs' advice
    for speed (no scan of the file when it opens); the clip's frames are found by frame rate.
    """

    def __init__(self, paths: list[str]) -> None:
        from torchcodec.decoders import VideoDecoder

        self.paths = paths
        self.labels = [label_of(p) for p in paths]
        self.sizes = []
        for p in paths:
            meta = VideoDecoder(p, seek_mode="approximate").metadata
            width, height = shorter_side(meta.width, meta.height)
            self.sizes.append((height, width))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.samplers import clips_at_random_indices
        from torchcodec.transforms import RandomCrop, Resize

        decoder = VideoDecoder(self.paths[i], seek_mode="approximate",
                               transforms=[Resize(self.sizes[i]), RandomCrop((CROP, CROP))])
        clips = clips_at_random_indices(decoder, num_clips=1, num_frames_per_clip=FRAMES,
                                        num_indices_between_frames=STRIDE)
        return clips.data[0], self.labels[i]


def torchcodec_loader(paths: list[str], batch: int, workers: int) -> Callable[[], Any] | str:
    """A factory of torch's DataLoader over :class:`TorchCodecClips`, or why there is none."""
    try:
        torchcodec_version()
    except Exception as e:  # ImportError, OSError, RuntimeError from a library that does not load
        return why_not(e)
    return lambda: torch.utils.data.DataLoader(TorchCodecClips(paths), batch_size=batch, shuffle=True,
                                               num_workers=workers, persistent_workers=workers > 0)


# --- webdataset ----------------------------------------------------------------------------------------


def write_shards(paths: list[str], where: Path, shards: int) -> list[str]:
    """The videos as WebDataset tar shards (``<key>.mp4`` and ``<key>.cls``), by webdataset's ShardWriter."""
    import webdataset as wds

    where.mkdir(parents=True, exist_ok=True)
    per = -(-len(paths) // shards)
    with wds.ShardWriter(str(where / "part-%05d.tar"), maxcount=per, verbose=0) as sink:
        for p in paths:
            key = f"{Path(p).parent.name}/{Path(p).stem}"
            sink.write({"__key__": key, "mp4": Path(p).read_bytes(), "cls": label_of(p)})
    return sorted(str(q) for q in where.glob("part-*.tar"))


def webdataset_loader(urls: list[str], batch: int, workers: int,
                      clip: Callable[[Any, random.Random], torch.Tensor]) -> Callable[[], Any] | str:
    """A factory of WebDataset's loader decoding each ``.mp4`` with ``clip(file, rng)``, or why there is none."""
    try:
        import webdataset as wds
    except ImportError as e:
        return why_not(e)

    def sample(s: dict[str, Any]) -> tuple[torch.Tensor, int]:
        rng = random.Random(torch.randint(0, 2**31, ()).item())
        return clip(io.BytesIO(s["mp4"]), rng), int(s["cls"])

    def make() -> Any:
        dataset = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
                   .shuffle(64).map(sample).batched(batch))
        return wds.WebLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=workers > 0)

    return make


# --- SPDL ----------------------------------------------------------------------------------------------


def spdl_version() -> str:
    """SPDL's version, or raises when it does not load (its FFmpeg extension needs FFmpeg's libraries)."""
    from importlib.metadata import version

    import spdl.io

    spdl.io.demux_config()  # loads the extension and FFmpeg's libraries
    return version("spdl")


def spdl_clip(path: str | bytes, start: int, width: int, height: int) -> torch.Tensor:
    """One clip by SPDL: the clip's time window demuxed (from the keyframe before it) and decoded,
    FFmpeg's filter graph taking every STRIDE-th frame, scaling and cropping: uint8 [T, 3, CROP, CROP]."""
    import spdl.io

    # The fps filter's grid of 1 / (FPS / STRIDE) s starts at 0: a start off the grid would give
    # a frame fewer (its ``num_frames`` padding does not pad it), so the clip starts on it.
    start -= start % STRIDE
    window = (start / FPS, (start + SPAN) / FPS)
    desc = spdl.io.get_video_filter_desc(timestamp=window, frame_rate=(FPS, STRIDE), scale_width=width,
                                         scale_height=height, scale_algo="bilinear", scale_mode=None,
                                         crop_width=CROP, crop_height=CROP, num_frames=FRAMES)
    frames = spdl.io.to_torch(spdl.io.load_video(path, timestamp=window, filter_desc=desc))
    return frames.permute(0, 3, 1, 2)


class SpdlClips:
    """An iterable of batches, one SPDL pipeline per epoch (a pipeline runs once through its source):
    the videos shuffled, one random clip of each loaded on ``threads`` threads, batches of ``batch``."""

    def __init__(self, paths: list[str], counts: list[int], sizes: list[tuple[int, int]], batch: int,
                 threads: int) -> None:
        self.paths, self.counts, self.sizes = paths, counts, sizes
        self.batch, self.threads = batch, threads
        self.rng = random.Random(0)

    def load(self, i: int) -> tuple[torch.Tensor, int]:
        start = self.rng.randint(0, max(self.counts[i] - SPAN, 0))
        return spdl_clip(self.paths[i], start, *self.sizes[i]), label_of(self.paths[i])

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([c for c, _ in items]), torch.tensor([y for _, y in items])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from spdl.pipeline import PipelineBuilder

        order = list(range(len(self.paths)))
        self.rng.shuffle(order)
        pipeline = (PipelineBuilder().add_source(order)
                    .pipe(self.load, concurrency=self.threads)
                    .aggregate(self.batch)
                    .pipe(self.collate)
                    .add_sink(3)
                    .build(num_threads=self.threads))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=300)


def spdl_loader(paths: list[str], counts: list[int], sizes: list[tuple[int, int]], batch: int,
                threads: int) -> Callable[[], Any] | str:
    """A factory of :class:`SpdlClips`, or why there is none."""
    try:
        spdl_version()
    except Exception as e:  # ImportError, OSError, RuntimeError from a library that does not load
        return why_not(e)
    return lambda: SpdlClips(paths, counts, sizes, batch, threads)
