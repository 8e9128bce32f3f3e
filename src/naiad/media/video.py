"""Video clips decoded in the workers: ``naiad.decode_video``.

``decode_video(column, ...)`` returns a picklable transform: given a batch whose ``batch[column]``
holds each sample's encoded video (an ``.mp4``, ``.webm``, ``.avi``... anything FFmpeg demuxes,
as ``naiad.read_videos`` or a bytes column gives it), it returns the batch with that column
decoded to clips and a ``column + "_frames"`` column saying which frames each clip holds.

NOTE [ Clip decoding ]
A clip is ``frames`` frames taken every ``stride`` frames from a start frame; frames are
numbered 0, 1, ... in presentation order, so a B-frame's number is where it is shown, not where
it is stored: a constant-rate stream's frame by its timestamp times the average frame rate
(rounded), a variable-rate stream's by its timestamp's position among its packets' (NOTE [
Variable frame rate ] in ``media/video_stream.py``, which says when the demux that takes is
paid). Only what a clip needs is decoded: the container seeks to the keyframe at or before the
clip's first frame and decodes forward to its last; frames before the first are decoded (a
keyframe interval's worth at most) and dropped, and nothing past the last is read. A frame that
is not wanted and that no other frame refers to (a B-frame not used as a reference, most of them)
is not decoded at all: its packet goes to the decoder with ``skip_frame="NONREF"``, which drops it
whole (measured on bench_video's H.264 videos, 2 B-frames: 11% more clips per CPU second). Where a seek
lands past the wanted frame (a container whose index lies), the video is opened again and
decoded from its start, so the frames are right, only slower.

The frame count is the packets' where they were demuxed, else the stream's (the container's
index: an ``.mp4``'s sample table), else its duration times its frame rate. The clip plan
(``media/clips.py``, NOTE [ Clip timelines ]) is made from it before any frame is decoded: with
``fps=`` the frames are those of a timeline resampled by timestamps, and a video shorter than a
clip is padded with its last frame (``short="pad"``, as torchcodec's ``repeat_last``), looped
from frame 0 (``"loop"``) or refused (``"skip"``); ``_frames`` always gives the source frame
delivered (a padded frame's number repeated, a looped one's wrapped). A count that overstated
the frames (a truncated file) is seen only while decoding: each frame it lacks is the last frame
that decoded, except with "skip", which makes the video a failed sample.

Where a clip starts (``clip=``), ``span = (frames - 1) * stride + 1`` frames long (timeline
frames: the video's own, or the ``fps`` timeline's):

* ``"random"``: uniform over the ``count - span + 1`` starts that fit (0 when none does), drawn
  from (seed, epoch, the sample's key) as ``decode_images`` draws its crops (NOTE [ Keyed
  sample randomness ] in ``media/keys.py``): the same clip for any worker count, batch or rank,
  and after a resume, exact or elastic;
* ``"center"``: the middle start, ``(count - span) // 2``;
* ``"uniform"``: ``clips_per_video`` starts spaced evenly from the first frame to the last
  clip that fits (the multi-clip evaluation of SlowFast and VideoMAE); one clip: the middle.

Each frame is placed as ``decode_images`` places an image (``media/geometry.py``, the same
options and rules: ``crop="random"`` is a RandomResizedCrop of the frame, or with ``resize=N``
a random crop of the frame resized to shorter side N), with one crop and one flip drawn per
video, so every frame of its clips gets the same. The resize is FFmpeg's scaler through PyAV (a ``VideoReformatter`` reused for a video's frames), which the
issue that asked for this measured faster for clips than torch's resize after the decode: the
frame goes straight from the decoder's YUV to the resized RGB in one pass. So the pixels are
bilinear like decode_images' default but not bit for bit the same as its torch resize.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from naiad import transforms
from naiad.errors import ConfigError
from naiad.media import geometry
from naiad.media.clips import (
    CLIPS,
    FLIP_DRAW,
    SHORTS,
    VideoOptions,
    clip_draws,
    clip_starts,
    decode_runs,
    wanted_frames,
)
from naiad.media.geometry import Placement
from naiad.media.image_options import image_options
from naiad.media.keys import KeyedBatchTransform, sample_uniforms
from naiad.media.rows import default_threads, encoded, raise_failures, run_rows
from naiad.media.video_stream import FrameTimes, frame_times, opened_video
from naiad.trust.bounds import PixelBudget, video_budget

# CLIPS, SHORTS, VideoOptions and clip_starts live in media/clips.py (the clip plan) and are kept here too.
__all__ = ["CLIPS", "SHORTS", "DecodeVideo", "VideoOptions", "clip_starts", "decode_video"]

_INSTALL = "pip install 'naiad[video]'"


def pyav() -> Any:
    """The ``av`` module (PyAV, whose wheel bundles FFmpeg), or a ConfigError saying how to install it."""
    try:
        import av
    except ImportError as exc:
        raise ConfigError(f"decode_video needs PyAV, which is not installed: {_INSTALL}.") from exc
    return av


class DecodeVideo(KeyedBatchTransform):
    """The transform :func:`decode_video` returns: ``t(batch) -> batch``. Picklable (it holds only
    its options), so it can be sent to worker processes.

    Attributes:
        column: the column of encoded videos.
        options: the :class:`VideoOptions`.
        seed, key, epoch_key: where random draws come from (NOTE [ Keyed sample randomness ]).
        threads: threads per batch, or None for the default (``media/rows.default_threads``).
    """

    options: VideoOptions

    def placement(self) -> transforms.Placement:
        """In the workers (:meth:`KeyedBatchTransform.placement`), with its decoded size with a
        fixed ``size`` (clips are large: a stream decodes them on its decode stage, after the
        shuffle buffer), holding the GIL: PyAV's per-frame Python (the frame loop, ``reformat``,
        ``to_ndarray``, the paste) keeps threads of one process to about 1.35 of 2 cores, so a
        stream's decode stage runs it in the loader's worker processes (NOTE [ Decode stage in
        the worker processes ] in stream/decode_workers.py)."""
        o = self.options
        size = o.image.size
        decoded = None if size is None else o.clips_per_video * o.frames * 3 * size[0] * size[1]
        return dataclasses.replace(super().placement(), decoded_row_bytes=decoded, holds_gil=True)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with ``batch[column]`` decoded: a uint8 ``[B, T, C, H, W]`` tensor (``[B, K,
        T, C, H, W]`` with ``clips_per_video=K > 1``) with a fixed ``size``, else a list of uint8
        ``[T, C, H, W]`` (``[K, T, C, H, W]``) tensors; and ``batch[column + "_frames"]``, int64
        ``[B, T]`` (``[B, K, T]``): the number of each delivered frame in its video.

        Raises:
            DecodeError: some videos did not decode; its ``rows``, ``keys`` and ``reasons`` say
                which and why, and its ``kept`` is this batch without them.
            ConfigError: the batch lacks the column, or (random clips, crops, flips) the key column.
        """
        if not isinstance(batch, Mapping):
            raise ConfigError(f"decode_video({self.column!r}) takes a dict batch; got {type(batch).__name__}.")
        if self.column not in batch:
            raise ConfigError(f"decode_video: the batch has no column {self.column!r} (columns: {sorted(map(str, batch))}).")
        values = batch[self.column]
        rows = len(values)
        o = self.options
        k = o.clips_per_video
        drawn = self.draw_keys(batch, rows, why=f"decode_video(clip={o.clip!r}, crop={o.image.crop!r}, flip={o.image.flip})")
        av = pyav()
        budget = video_budget(o.image.max_pixels)
        numbers = np.zeros((rows, k, o.frames), np.int64)
        out: torch.Tensor | None = None
        listed: list[torch.Tensor | None] = [None] * rows
        if o.image.size is not None:
            out = torch.empty((rows, k, o.frames, 3, *o.image.size), dtype=torch.uint8)
            canvases = out.numpy()

        def work(i: int) -> None:
            draws = None
            if drawn is not None:
                keys, seed, epoch = drawn
                draws = sample_uniforms(seed, epoch, int(keys[i]), clip_draws(o))
            canvas = canvases[i] if out is not None else None
            clips, numbers[i] = _decode(av, encoded(values[i]), o, draws, budget, canvas)
            if out is None:
                listed[i] = torch.from_numpy(clips if k > 1 else clips[0])

        failures = run_rows(work, rows, self.threads or default_threads(holds_gil=True))
        result = dict(batch)
        frames = torch.from_numpy(numbers)
        if out is not None:
            result[self.column] = out if k > 1 else out[:, 0]
        else:
            result[self.column] = listed
        result[self.column + "_frames"] = frames if k > 1 else frames[:, 0]
        raise_failures(failures, what="videos", column=self.column, batch=batch, decoded=result, rows=rows, key=self.key)
        return result


def _decode(av: Any, data: bytes | memoryview, o: VideoOptions, draws: np.ndarray | None, budget: PixelBudget,
            canvas: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Decode one video's clips: ``(pixels uint8 [K, T, 3, H, W], frame numbers int64 [K, T])``,
    written into ``canvas`` when given (a fixed size), else into a new array (NOTE [ Clip decoding ])."""
    raw = bytes(data)
    with opened_video(av, raw) as (container, stream):
        width, height = stream.codec_context.width, stream.codec_context.height
        placement = _placement(width, height, o, draws, budget)
        out_h, out_w = placement.canvas
        times = frame_times(container, stream)  # the demux of NOTE [ Variable frame rate ], where needed
        count = times.count
        if count <= 0:
            raise ValueError("the video stream has no frames")
        # Before any frame is decoded: a short video that short="skip" refuses costs its header
        # (and a variable-rate video's demux) only.
        wanted = wanted_frames(count, times.rate, o, draws, times.timestamps)
        frames = _frames_at(av, container, stream, raw, decode_runs(wanted), times)
    if not frames:
        raise ValueError(f"no frame decoded (the container says {count} frames)")
    flip = draws is not None and o.image.flip and bool(draws[FLIP_DRAW] < 0.5)
    if canvas is None:
        canvas = np.empty((o.clips_per_video, o.frames, 3, out_h, out_w), np.uint8)
    have = np.array(sorted(frames))
    # Each wanted frame, or the last before it that decoded: past the end of an overstated count
    # (a truncated file) that is the video's last frame, whatever `short` says, but "skip".
    delivered = have[np.maximum(np.searchsorted(have, wanted, side="right") - 1, 0)]
    if o.short == "skip" and not np.array_equal(delivered, wanted):
        missing = sorted(set(wanted.ravel().tolist()) - set(frames))
        raise ValueError(f"the container says {count} frames, but frames {missing[:5]} did not decode (a truncated "
                         "file?); short='skip' skips it")
    placed: dict[int, np.ndarray] = {}
    # One scaler for the video's frames: a frame's own reformat() builds FFmpeg's scaler afresh
    # every call (measured: 0.95 ms a 640x360 frame to 227x128, against 0.28 ms reused).
    scaler = av.video.reformatter.VideoReformatter()
    for (c, t), number in np.ndenumerate(delivered):
        if number not in placed:
            placed[number] = _place(av, scaler, frames[number], placement, (width, height), flip, budget)
        _paste(canvas[c, t], placed[number], placement, flip)
    return canvas, delivered.astype(np.int64)


def _placement(width: int, height: int, o: VideoOptions, draws: np.ndarray | None, budget: PixelBudget) -> Placement:
    """Where a video's frames go in its clips' canvas, every bound checked before decoding
    (NOTE [ Decode bounds ] in trust/bounds.py)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"the video stream has no frame size ({width}x{height})")
    budget.check("a frame", width, height)
    placement = o.image.placement(width, height, None if draws is None else draws[: geometry.RRC_DRAWS])
    out_h, out_w = placement.canvas
    budget.check(f"its {o.clips_per_video * o.frames} frames' output ({out_w}x{out_h} each)", out_w * out_h,
                 o.clips_per_video * o.frames)
    if placement.resized is not None:
        budget.check("its resize", *placement.resized)
    return placement


def _frames_at(av: Any, container: Any, stream: Any, raw: bytes, runs: list[list[int]],
               times: FrameTimes) -> dict[int, Any]:
    """The decoded frames numbered in ``runs`` that the video has: for each run, seek to the
    keyframe at or before its first frame and decode to its last (NOTE [ Clip decoding ]),
    frames numbered as ``times`` says (NOTE [ Variable frame rate ])."""
    got: dict[int, Any] = {}
    for run in runs:
        first, last = run[0], run[-1]
        target = times.seek_pts(first)  # raises for a stream with nothing to number its frames by
        part = None
        try:
            container.seek(target, stream=stream, backward=True, any_frame=False)
            part = _decode_range(container, stream, set(run), first, last, times)
        except av.FFmpegError:
            pass  # a container that cannot seek: decode from the start below
        if part is None:  # the seek failed or landed past the run's first frame
            with opened_video(av, raw) as (again, s):
                part = _decode_range(again, s, set(run), -1, last, times) or {}
        got.update(part)
    return got


def _decode_range(container: Any, stream: Any, wanted: set[int], first: int, last: int,
                  times: FrameTimes) -> dict[int, Any] | None:
    """Decode from where the container stands to frame ``last``, keeping the frames in ``wanted``;
    None when the first frame decoded is already past ``first`` (a seek too far; -1: no check)."""
    got: dict[int, Any] = {}
    number = -1
    n = 0
    codec = stream.codec_context
    skipping: bool | None = None  # what the decoder was last told (None: not yet, this range)
    for packet in container.demux(stream):
        # A frame no later frame refers to (a B-frame, mostly) and not wanted is not decoded at
        # all: the decoder drops it whole (NOTE [ Clip decoding ]).
        skip = packet.pts is not None and not packet.is_keyframe and times.number(packet.pts, number) not in wanted
        if skip != skipping:
            codec.skip_frame = "NONREF" if skip else "DEFAULT"
            skipping = skip
        for frame in packet.decode():
            number = times.number(frame.pts, number)
            if n == 0 and first >= 0 and number > first:
                return None
            n += 1
            if number in wanted:
                got[number] = frame
            if number >= last:
                return got
    return got


def _place(av: Any, scaler: Any, frame: Any, placement: Placement, size: tuple[int, int], flip: bool,
           budget: PixelBudget) -> np.ndarray:
    """One frame cropped and resized as ``placement`` says (``media/geometry.py``): ``[h, w, 3]``
    RGB, FFmpeg's scaler resizing (NOTE [ Clip decoding ])."""
    dx0, dy0, dx1, dy1 = placement.dst
    if placement.resized is not None:
        rw, rh = placement.resized
        vx0, vy0, vx1, vy1 = placement.window  # type: ignore[misc]
        part = scaler.reformat(frame, width=rw, height=rh, format="rgb24").to_ndarray()[vy0:vy1, vx0:vx1]
    else:  # a random crop: cut from the frame, then resized (RandomResizedCrop's order)
        width, height = size
        x0, y0, x1, y1 = placement.src
        cx0, cy0 = min(max(int(round(x0)), 0), width - 1), min(max(int(round(y0)), 0), height - 1)
        cx1, cy1 = max(min(int(round(x1)), width), cx0 + 1), max(min(int(round(y1)), height), cy0 + 1)
        part = frame.to_ndarray(format="rgb24")[cy0:cy1, cx0:cx1]
        if part.shape[:2] != (dy1 - dy0, dx1 - dx0):
            budget.check("its resize", dx1 - dx0, dy1 - dy0)
            cut = av.VideoFrame.from_ndarray(np.ascontiguousarray(part), format="rgb24")
            part = scaler.reformat(cut, width=dx1 - dx0, height=dy1 - dy0).to_ndarray()
    out: np.ndarray = part[:, ::-1] if flip else part
    return out


def _paste(canvas: np.ndarray, part: np.ndarray, placement: Placement, flip: bool) -> None:
    """``part`` (``[h, w, 3]``) into its box of ``canvas`` (``[3, H, W]``), zeros around it. A
    flipped part's box is mirrored too (a centre crop larger than the frame), as decode_images'."""
    dx0, dy0, dx1, dy1 = placement.dst
    if flip:
        dx0, dx1 = canvas.shape[-1] - dx1, canvas.shape[-1] - dx0
    if not placement.covers_canvas:
        canvas[...] = 0
    canvas[:, dy0:dy1, dx0:dx1] = part.transpose(2, 0, 1)


def decode_video(
    column: str = "video",
    *,
    frames: int = 16,
    stride: int = 2,
    size: int | tuple[int, int] | None = None,
    resize: str | int = "shorter",
    crop: str | None = None,
    flip: bool = False,
    clip: str = "random",
    clips_per_video: int = 1,
    short: str = "pad",
    fps: float | None = None,
    seed: int | None = None,
    key: str = "__index__",
    epoch_key: str | None = "__epoch__",
    threads: int | None = None,
    max_pixels: int | None = None,
) -> DecodeVideo:
    """A transform that decodes a clip of each of a batch's videos, in threads (needs ``naiad[video]``).

    Args:
        column: the batch column holding each sample's encoded video (bytes, as
            ``naiad.read_videos`` gives them; a uint8 array or a ``{"bytes": ...}`` dict also).
        frames: frames per clip (T).
        stride: a clip takes every ``stride``-th frame (of the ``fps`` timeline when given).
        size, resize, crop: each frame's geometry, as :func:`naiad.decode_images`'s (the same
            crop for every frame of a video's clips). With a ``size`` the clips come out in one
            uint8 tensor; None: each video's own size (after ``resize=N``), in a list.
            ``crop="center"``: the centre ``size`` of the frame resized (``resize=N``: shorter
            side N; ``"shorter"``: the smallest size covering ``size``), zero padding where it
            is smaller. ``crop="random"`` with ``resize="shorter"``: ``RandomResizedCrop(size)``
            of the whole frame (scale 0.08-1, ratio 3/4-4/3); with ``resize=N``: the shorter
            side resized to N, then a random ``size`` crop of it (``Resize(N)`` +
            ``RandomCrop(size)``, VideoMAE's and SlowFast's training crop; centred with zero
            padding along a side shorter than ``size``). One draw per video: every frame of
            its clips gets the same crop.
        flip: a random horizontal flip of half the videos (the whole clip).
        clip: where a clip starts: ``"random"`` (keyed per sample), ``"center"`` or
            ``"uniform"`` (NOTE [ Clip decoding ]).
        clips_per_video: clips per video (K); more than one adds a K axis after the batch's.
        short: a video shorter than a clip: ``"pad"`` repeats its last frame, ``"loop"`` wraps
            to frame 0 and keeps the stride going (a 5-frame video, 4 frames every 2: frames
            0, 2, 4, 1), ``"skip"`` makes it a failed sample (a ``DecodeError`` naming it, or
            ledgered with the reader's ``on_bad_rows="skip"``), refused before it is decoded.
        fps: None: a clip takes the video's own frames. A frame rate: the clip's frames are
            taken from the video resampled to ``fps`` by timestamps (timeline frame ``i`` is the
            source frame nearest ``i / fps`` seconds, or on a variable-rate video the frame
            presented then; NOTE [ Clip timelines ] in ``media/clips.py``), so a clip lasts
            ``(frames - 1) * stride / fps`` seconds whatever the video's rate; ``_frames``
            still gives source frame numbers.
        seed: the seed of random clips, crops and flips (None: the loader's seed inside naiad's
            workers, else 0).
        key: the batch's int64 column of per-sample keys the draws are keyed by (NOTE [ Keyed
            sample randomness ]).
        epoch_key: the batch field holding the epoch, if the pipeline puts it there.
        threads: threads decoding one batch (None: the usable cores, divided among naiad's workers).
        max_pixels: the most pixels of a decoded frame, of one resize, and of a video's clips
            together (frames times output pixels), checked before decoding (NOTE [ Decode bounds ]
            in ``trust/bounds.py``; None: ``DEFAULT_MAX_VIDEO_PIXELS``).

    Example::

        train = naiad.decode_video("video", frames=16, stride=2, size=112, resize=128, crop="random", flip=True)
        loader = naiad.DataLoader(naiad.read_videos("ucf101/train"), batch_size=8, transform=train)
        batch["video"].shape         # torch.Size([8, 16, 3, 112, 112]), uint8
        batch["video_frames"][0]     # tensor([10, 12, ..., 40]): the frames delivered

    Raises:
        ConfigError: an argument out of range, or PyAV is not installed.
    """
    if not isinstance(column, str) or not column:
        raise ConfigError(f"`column` must be a column name (a non-empty str), got {column!r}.")
    for name, value in (("frames", frames), ("stride", stride), ("clips_per_video", clips_per_video)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"`{name}` must be an int >= 1, got {value!r}.")
    if clip not in CLIPS:
        raise ConfigError(f"`clip` must be one of {list(CLIPS)}, got {clip!r}.")
    if short not in SHORTS:
        raise ConfigError(f"`short` must be one of {list(SHORTS)}, got {short!r}.")
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 1e-6 <= fps < float("inf")):
        raise ConfigError(f"`fps` must be None (the video's own frames) or a frame rate >= 1e-6, got {fps!r}.")
    geometry_options = image_options(size=size, resize=resize, crop=crop, flip=flip, mode="RGB", scale=(0.08, 1.0),
                                     ratio=(3 / 4, 4 / 3), interpolation="bilinear", max_pixels=max_pixels)
    options = VideoOptions(frames=frames, stride=stride, clip=clip, clips_per_video=clips_per_video, short=short,
                           fps=None if fps is None else float(fps), image=geometry_options)
    pyav()  # fail here, not in a worker, when the extra is missing
    return DecodeVideo(column, options, seed=seed, key=key, epoch_key=epoch_key, threads=threads)
