"""Batched image decoding: ``naiad.decode_images`` and ``naiad.images.normalize``.

``decode_images(column, ...)`` returns a picklable transform: given a batch (a dict whose
``batch[column]`` holds each sample's encoded bytes: JPEG, PNG, WebP, GIF, BMP, TIFF... anything
Pillow opens), it returns the batch with that column decoded and every other column kept. The
samples are decoded on a small thread pool (NOTE [ Decode threads ] in ``media/rows.py``), each
through the fastest path it allows:

1. JPEG with simplejpeg installed (libjpeg-turbo): the header gives the size, the crop and resize
   follow from it (``media/geometry.py``), and the image is decoded already shrunk in the DCT by
   the largest power of two (up to 8) that keeps the crop at least as large as its output, so a
   2000x1500 photo bound for 224x224 decodes at 500x375.
2. Anything else (or a JPEG that simplejpeg refuses, e.g. CMYK): Pillow, with ``Image.draft``
   doing the same DCT shrink for JPEG, then ``convert(mode)``.

Then the crop is cut from the decoded pixels (crop before resize: the pixels outside it are
never resized; a centre crop resizes only the input span its window needs, NOTE [ Resizing a
window ] in ``media/geometry.py``) and resized with torch's uint8 antialiased resampling
(bilinear by default), which measured 3-4x faster than Pillow's ``Image.resize`` on this machine (bench/RESULTS.md,
"Decoding"), straight into the batch's preallocated ``uint8 [B, C, H, W]`` tensor.

Random crops and flips are keyed per sample (NOTE [ Keyed sample randomness ] in
``media/keys.py``), so a sample gets the same pixels in the same epoch whatever batch or worker
it lands in, and a resumed epoch delivers the same pixels.

Every array a decode makes (the image at its header's size, each resize, the output) is checked
against a pixel budget before it is allocated (``max_pixels``, by default Pillow's own limit:
NOTE [ Decode bounds ] in ``trust/bounds.py``), so a few bytes claiming a huge or extremely
elongated image are refused, not decoded.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from naiad import transforms
from naiad.errors import ConfigError
from naiad.media import geometry
from naiad.media.geometry import Placement
from naiad.media.image_options import MODES, ImageOptions, image_options
from naiad.media.keys import KeyedBatchTransform, sample_uniforms
from naiad.media.rows import default_threads, encoded, raise_failures, run_rows
from naiad.trust import bounds
from naiad.trust.bounds import PixelBudget

__all__ = ["DecodeImages", "ImageOptions", "decode_images", "normalize"]

#: Output modes and their channel counts.
_SIMPLEJPEG_COLORSPACE = {"RGB": "RGB", "L": "GRAY", "RGBA": "RGBA"}
_DRAWS = geometry.RRC_DRAWS + 1  # the crop's draws, then the flip's
_INSTALL = "pip install 'naiad[images]'"


def pillow() -> Any:
    """``PIL.Image``, or a ConfigError saying how to install it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ConfigError(f"decode_images needs Pillow, which is not installed: {_INSTALL}.") from exc
    return Image


def simplejpeg() -> Any:
    """The ``simplejpeg`` module, or None when it is not installed (Pillow decodes JPEG then)."""
    try:
        import simplejpeg as module
    except ImportError:
        return None
    return module


class DecodeImages(KeyedBatchTransform):
    """The transform :func:`decode_images` returns: ``t(batch) -> batch``. Picklable (it holds
    only its options), so it can be sent to worker processes.

    Attributes:
        column: the column of encoded images.
        options: the :class:`ImageOptions`.
        seed, key, epoch_key: where random draws come from (NOTE [ Keyed sample randomness ]).
        epoch: the epoch used when neither the batch nor naiad's worker says (``set_epoch``).
        threads: threads per batch, or None for the default (``media/rows.default_threads``).
    """

    options: ImageOptions

    def placement(self) -> transforms.Placement:
        """In the workers (:meth:`KeyedBatchTransform.placement`), with its decoded size: ``C * H *
        W`` with a fixed ``size``, else None (each image keeps its own size). A stream decodes
        small fixed-size images in its reads (NOTE [ Small samples decode in the reads ])."""
        size = self.options.size
        decoded = None if size is None else MODES[self.options.mode] * size[0] * size[1]
        return dataclasses.replace(super().placement(), decoded_row_bytes=decoded)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` with ``batch[column]`` decoded: a uint8 ``[B, C, H, W]`` tensor with a fixed
        ``size``, else a list of uint8 ``[C, H, W]`` tensors.

        Raises:
            DecodeError: some images did not decode; its ``rows``, ``keys`` and ``reasons`` say
                which and why, and its ``kept`` is this batch without them.
            ConfigError: the batch lacks the column, or (random crops, flips) the key column.
        """
        if not isinstance(batch, Mapping):
            raise ConfigError(f"decode_images({self.column!r}) takes a dict batch; got {type(batch).__name__}.")
        if self.column not in batch:
            raise ConfigError(
                f"decode_images: the batch has no column {self.column!r} (columns: {sorted(map(str, batch))})."
            )
        values = batch[self.column]
        rows = len(values)
        opts = self.options
        channels = MODES[opts.mode]
        drawn = self.draw_keys(batch, rows, why=f"decode_images(crop={opts.crop!r}, flip={opts.flip})")
        keys, seed, epoch = drawn if drawn is not None else (None, None, None)
        # The rows are written through NumPy views: a NumPy slice costs a fraction of a torch
        # one, which counts for small images (a 28x28 PNG decodes in tens of microseconds).
        batch_out: torch.Tensor | None = None
        listed: list[torch.Tensor | None] = []
        if opts.size is not None:
            batch_out = torch.empty((rows, channels, *opts.size), dtype=torch.uint8)
            canvases = batch_out.numpy()
        else:
            listed = [None] * rows
        pil = pillow()
        sj = simplejpeg()
        # Read per batch, so a change of Pillow's limit counts from the next batch on.
        budget = bounds.pixel_budget(opts.max_pixels, pil.MAX_IMAGE_PIXELS, error=pil.DecompressionBombError)

        def work(i: int) -> None:
            draws = None
            if keys is not None:
                assert seed is not None and epoch is not None
                draws = sample_uniforms(seed, epoch, int(keys[i]), _DRAWS)
            pixels, placement, size = _decode(encoded(values[i]), opts, draws, pil, sj, budget)
            flip = draws is not None and opts.flip and draws[geometry.RRC_DRAWS] < 0.5
            if batch_out is not None:
                _place(canvases[i], pixels, placement, size, flip, opts.interpolation, budget)
            else:
                canvas = np.empty((channels, *placement.canvas), dtype=np.uint8)
                _place(canvas, pixels, placement, size, flip, opts.interpolation, budget)
                listed[i] = torch.from_numpy(canvas)

        failures = run_rows(work, rows, self.threads or default_threads())
        result = dict(batch)
        result[self.column] = batch_out if batch_out is not None else listed
        raise_failures(failures, what="images", column=self.column, batch=batch, decoded=result, rows=rows, key=self.key)
        return result


def _decode(
    data: bytes | memoryview, opts: ImageOptions, draws: np.ndarray | None, pil: Any, sj: Any, budget: PixelBudget
) -> tuple[np.ndarray, Placement, tuple[int, int]]:
    """Decode one image, shrunk in the DCT where its crop allows: ``(pixels HWC uint8, placement,
    (source width, source height))``. Its header's size and its output are checked against
    ``budget`` first."""
    if sj is not None and bytes(data[:3]) == b"\xff\xd8\xff":
        try:
            height, width, _, _ = sj.decode_jpeg_header(data)
        except ValueError:
            pass  # Pillow below reads it or says what is wrong with it
        else:
            placement = _checked_placement(opts, width, height, draws, budget)
            reduction = geometry.dct_reduction(placement)
            try:
                pixels = sj.decode_jpeg(
                    data,
                    _SIMPLEJPEG_COLORSPACE[opts.mode],
                    min_height=-(-height // reduction),
                    min_width=-(-width // reduction),
                )
            except ValueError:
                pass  # CMYK or another layout libjpeg-turbo will not convert: Pillow's turn
            else:
                return pixels, placement, (width, height)
    try:
        opened = pil.open(io.BytesIO(data))
    except pil.UnidentifiedImageError:
        raise ValueError(
            f"not an image Pillow can read ({len(data)} bytes beginning {bytes(data[:8])!r})"
        ) from None
    with opened as image:
        width, height = image.size
        placement = _checked_placement(opts, width, height, draws, budget)  # before any pixel loads
        reduction = geometry.dct_reduction(placement)
        if reduction > 1 and image.format == "JPEG":
            image.draft("L" if opts.mode == "L" else "RGB", (width // reduction, height // reduction))
        converted = image.convert(opts.mode) if image.mode != opts.mode else image
        pixels = np.array(converted)  # a writable copy: torch.from_numpy warns on read-only arrays
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return pixels, placement, (width, height)


def _checked_placement(opts: ImageOptions, width: int, height: int, draws: np.ndarray | None, budget: PixelBudget) -> Placement:
    """The placement of a ``width`` x ``height`` image, its full size (as the header says, not
    after a DCT shrink) and its output canvas checked against ``budget`` (NOTE [ Decode bounds ])."""
    budget.check("the image", width, height)
    placement = opts.placement(width, height, draws)
    budget.check("its output", placement.canvas[1], placement.canvas[0])
    return placement


def _place(
    canvas: np.ndarray,
    pixels: np.ndarray,
    placement: Placement,
    size: tuple[int, int],
    flip: bool,
    interpolation: str,
    budget: PixelBudget,
) -> None:
    """Crop and resize ``pixels`` (``[H, W, C]``, decoded, maybe DCT-shrunk, from a source of
    ``size``) as the placement says (``media/geometry.py``) and write them into ``canvas``
    (``[C, H, W]``); a resize over ``budget`` is refused before it runs."""
    if placement.resized is not None:
        part = _resize_window(pixels, placement, interpolation, budget)
    else:
        part = _crop_resize(pixels, placement, size, interpolation, budget)
    dx0, dy0, dx1, dy1 = placement.dst
    if flip:
        part = part[:, :, ::-1]
        dx0, dx1 = canvas.shape[-1] - dx1, canvas.shape[-1] - dx0
    if not placement.covers_canvas:
        canvas[...] = 0
    canvas[:, dy0:dy1, dx0:dx1] = part


def _resize(
    pixels: np.ndarray,
    size: tuple[int, int] | None,
    scales: tuple[float, float] | None,
    interpolation: str,
    budget: PixelBudget,
) -> np.ndarray:
    """``[H, W, C]`` pixels resized by torch's uint8 antialiased kernel to ``size`` (or by
    ``scales``, the output size then ``floor(input * scale)``): ``[C, h, w]``. Refused before
    it allocates when its output or its first pass's is over ``budget``."""
    in_h, in_w = pixels.shape[:2]
    if scales is not None:
        out_h, out_w = math.floor(in_h * scales[0]), math.floor(in_w * scales[1])
    else:
        assert size is not None
        out_h, out_w = size
    budget.check("its resize", out_w, out_h)
    # The resize is separable: its first pass makes in_h x out_w (rows first) or out_h x in_w.
    if in_h * out_w >= out_h * in_w:
        budget.check("its resize's first pass", out_w, in_h)
    else:
        budget.check("its resize's first pass", in_w, out_h)
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None]  # channels-last: the fast uint8 kernel
    if scales is not None:
        resized = F.interpolate(image, scale_factor=scales, mode=interpolation, antialias=True, recompute_scale_factor=False)
    else:
        resized = F.interpolate(image, size=size, mode=interpolation, antialias=True)
    return resized[0].numpy()


def _crop_resize(
    pixels: np.ndarray, placement: Placement, size: tuple[int, int], interpolation: str, budget: PixelBudget
) -> np.ndarray:
    """The placement's source box cut from ``pixels`` (rounded to whole decoded pixels), then
    resized to its output box: torchvision's order for ``RandomResizedCrop``. ``[C, h, w]``."""
    height, width = pixels.shape[:2]
    fx, fy = width / size[0], height / size[1]
    x0, y0, x1, y1 = placement.src
    cx0 = min(max(int(round(x0 * fx)), 0), width - 1)
    cy0 = min(max(int(round(y0 * fy)), 0), height - 1)
    cx1 = max(min(int(round(x1 * fx)), width), cx0 + 1)
    cy1 = max(min(int(round(y1 * fy)), height), cy0 + 1)
    dx0, dy0, dx1, dy1 = placement.dst
    crop = pixels[cy0:cy1, cx0:cx1]
    if crop.shape[:2] == (dy1 - dy0, dx1 - dx0):
        chw: np.ndarray = crop.transpose(2, 0, 1)
        return chw
    return _resize(crop, (dy1 - dy0, dx1 - dx0), None, interpolation, budget)


def _resize_window(
    pixels: np.ndarray, placement: Placement, interpolation: str, budget: PixelBudget = PixelBudget(None)
) -> np.ndarray:
    """``pixels`` resized to ``placement.resized``, and of that only ``placement.window``:
    torchvision's ``Resize`` then ``CenterCrop`` (or ``RandomCrop``), computing only (about) the window: the input is
    cut to the span each axis needs and resized by the whole image's scale, given explicitly
    (NOTE [ Resizing a window ] in ``media/geometry.py``). The pixels are those of resizing the
    whole image then cropping: bit for bit in every shape tested, and held by the tests to at
    most one level apart where a near cut's float positions could round otherwise. ``[C, h, w]``."""
    assert placement.resized is not None and placement.window is not None
    height, width = pixels.shape[:2]
    rw, rh = placement.resized
    vx0, vy0, vx1, vy1 = placement.window
    if (rh, rw) == (height, width):
        chw: np.ndarray = pixels[vy0:vy1, vx0:vx1].transpose(2, 0, 1)
        return chw
    rows = geometry.resize_span(height, rh, vy0, vy1)
    cols = geometry.resize_span(width, rw, vx0, vx1)
    part = pixels[rows.start : rows.stop, cols.start : cols.stop]
    resized = _resize(part, None, (rows.scale, cols.scale), interpolation, budget)
    return resized[:, vy0 - rows.skip : vy1 - rows.skip, vx0 - cols.skip : vx1 - cols.skip]


def decode_images(
    column: str,
    *,
    size: int | tuple[int, int] | None = None,
    resize: str | int = "shorter",
    crop: str | None = None,
    flip: bool = False,
    mode: str = "RGB",
    seed: int | None = None,
    key: str = "__index__",
    epoch_key: str | None = "__epoch__",
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    interpolation: str = "bilinear",
    threads: int | None = None,
    max_pixels: int | None = None,
) -> DecodeImages:
    """A transform that decodes a batch's images, in threads (needs ``naiad[images]``).

    Args:
        column: the batch column holding each sample's encoded bytes (a list or object array of
            ``bytes``; a uint8 array, an Arrow binary scalar or a ``{"bytes": ...}`` dict also).
        size: the output ``(height, width)`` (an int: square): every image comes out that size, in
            one ``uint8 [B, C, H, W]`` tensor. None: each image keeps its own size (after
            ``resize``), in a list of ``uint8 [C, H, W]`` tensors.
        resize: ``"shorter"``: the shorter side scaled to cover ``size`` (with ``crop="center"``;
            without ``size``, no resize). An int N: the shorter side scaled to N pixels, the
            aspect kept (torchvision's ``Resize(N)``). ``"stretch"``: the whole image resized to
            ``size``, aspect not kept (torchvision's ``Resize((H, W))``).
        crop: ``"center"``: the centre ``size`` of the resized image (torchvision's
            ``CenterCrop``, zero padding if the image is smaller). ``"random"``: with ``resize``
            ``"shorter"``, torchvision's ``RandomResizedCrop(size, scale, ratio)`` of the
            original image; with ``resize=N``, ``Resize(N)`` then a random ``size`` crop of the
            resized image (``RandomCrop(size)``; a side shorter than ``size`` is centred with
            zero padding, as ``CenterCrop``; ``scale`` and ``ratio`` do not apply).
            None: no crop (with a ``size``, give ``resize="stretch"``).
        flip: a random horizontal flip, half of the samples.
        mode: ``"RGB"`` (3 channels), ``"L"`` (grayscale, 1) or ``"RGBA"`` (4); palette,
            grayscale, alpha and 16-bit inputs are converted as Pillow's ``convert(mode)`` does.
        seed: the seed of random crops and flips (None: the loader's seed inside naiad's
            workers, else 0).
        key: the batch's int64 column of per-sample keys (the sample's position in the epoch)
            that random crops and flips are drawn from (NOTE [ Keyed sample randomness ]).
        epoch_key: the batch field holding the epoch, if the pipeline puts it there.
        scale, ratio: ``RandomResizedCrop``'s area fraction and aspect ratio ranges.
        interpolation: ``"bilinear"`` (torchvision's default) or ``"bicubic"``, both antialiased.
        threads: threads decoding one batch (None: the usable cores, divided among naiad's
            workers inside a worker).
        max_pixels: the most pixels any array of one image's decode may hold: the image at its
            header's size, each resize, the output (NOTE [ Decode bounds ] in
            ``trust/bounds.py``). An image over it is refused before it is decoded, as a failed
            sample. None: Pillow's own limit, twice ``PIL.Image.MAX_IMAGE_PIXELS`` as it is when
            the batch is decoded (no limit if that is None). Pillow still refuses to open images
            over its limit, so a larger ``max_pixels`` reaches those only if
            ``PIL.Image.MAX_IMAGE_PIXELS`` is raised too.

    Example::

        evaluate = naiad.decode_images("image", resize=256, crop="center", size=224)
        train = naiad.decode_images("image", crop="random", size=224, flip=True, seed=0)
        batch = train({"image": [jpeg_bytes, ...], "__index__": np.array([...]), "label": ...})
        batch["image"].shape  # torch.Size([B, 3, 224, 224]), uint8

    Raises:
        ConfigError: an argument out of range, or Pillow is not installed.
    """
    if not isinstance(column, str) or not column:
        raise ConfigError(f"`column` must be a column name (a non-empty str), got {column!r}.")
    options = image_options(size=size, resize=resize, crop=crop, flip=flip, mode=mode, scale=scale, ratio=ratio,
                            interpolation=interpolation, max_pixels=max_pixels)
    pillow()  # fail here, not in a worker, when the extra is missing
    return DecodeImages(column, options, seed=seed, key=key, epoch_key=epoch_key, threads=threads)


def normalize(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(images / 255 - mean) / std`` as ``dtype``, computed where ``images`` lives.

    Meant for the device: decode to uint8 in the workers, send the uint8 batch to the GPU (a
    quarter of float32's bytes over PCIe), and normalise there, e.g.
    ``normalize(batch["image"].cuda(non_blocking=True), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))``.

    Args:
        images: uint8 (or any numeric) ``[..., C, H, W]``.
        mean, std: per channel, in the 0-1 scale (torchvision's convention); one value for all.
        dtype: the floating dtype of the result (float16 and bfloat16 halve it again).
    """
    if images.ndim < 3:
        raise ConfigError(f"`images` must be [..., C, H, W], got shape {tuple(images.shape)}.")
    channels = images.shape[-3]
    means = torch.as_tensor(mean, dtype=torch.float64).reshape(-1)
    stds = torch.as_tensor(std, dtype=torch.float64).reshape(-1)
    for name, values in (("mean", means), ("std", stds)):
        if values.numel() not in (1, channels):
            raise ConfigError(f"`{name}` needs 1 or {channels} values (one per channel), got {values.numel()}.")
    if (stds == 0).any():
        raise ConfigError(f"`std` must not be 0, got {std!r}.")
    scale = (1.0 / (255.0 * stds)).to(dtype=dtype, device=images.device).reshape(-1, 1, 1)
    shift = (means / stds).to(dtype=dtype, device=images.device).reshape(-1, 1, 1)
    return images.to(dtype) * scale - shift
