"""Where each image's pixels go: the crop and resize of one image as a pure function of its size,
the options and (for random crops) its keyed uniform draws.

A :class:`Placement` says which box of the source image (in source pixels, floats) is drawn into
which box of the output canvas (in output pixels, ints). The decoder picks the DCT scale from it
(:func:`dct_reduction`), then does one of two things, each torchvision's order of operations:

* a random crop (``resized`` None): cut the box from the decoded pixels, then resize the cut
  (``RandomResizedCrop`` crops, then resizes);
* a resize (``resized`` = the whole image's resized size) with a centre crop: resize the image to
  ``resized`` and keep ``window`` of it (``Resize`` then ``CenterCrop``). Only the output up to the
  window's far edges is computed (the input is cut past them, the resize's scale given
  explicitly), so the crop costs little, and the pixels are the same as resizing the whole image:
  cutting the near side too would move the output grid by a fraction of a pixel.

The rules are torchvision's: ``Resize(N)`` keeps the aspect ratio with the shorter side N and the
longer side truncated (``int(N * long / short)``); ``CenterCrop`` offsets by
``int(round((size - crop) / 2))`` and pads with zeros where the image is smaller than the crop;
``RandomResizedCrop`` is :func:`random_resized_crop`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Placement",
    "RRC_DRAWS",
    "centre_placement",
    "cover_size",
    "dct_reduction",
    "random_resized_crop",
    "shorter_side_size",
    "whole",
]

#: Uniform draws one random resized crop uses: two per try (10 tries), then the two offsets.
RRC_DRAWS = 22


@dataclass(frozen=True)
class Placement:
    """One image's crop and resize.

    Attributes:
        src: the source box ``(x0, y0, x1, y1)`` in source pixels (floats, inside the image).
        dst: the output box ``(x0, y0, x1, y1)`` in output pixels that ``src`` is resized into;
            the rest of the canvas is zero (a centre crop larger than the resized image).
        canvas: the output's ``(height, width)``.
        resized: for a resize: the whole image's resized ``(width, height)``; None for a crop
            that is cut first.
        window: for a resize: the box ``(x0, y0, x1, y1)`` of the resized image that ``dst``
            shows.
    """

    src: tuple[float, float, float, float]
    dst: tuple[int, int, int, int]
    canvas: tuple[int, int]
    resized: tuple[int, int] | None = None
    window: tuple[int, int, int, int] | None = None

    @property
    def covers_canvas(self) -> bool:
        """Whether ``dst`` fills the whole canvas (nothing to zero)."""
        return self.dst == (0, 0, self.canvas[1], self.canvas[0])


def shorter_side_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """``(width, height)`` with the shorter side ``shorter`` and the aspect ratio kept, the longer
    side truncated as torchvision's ``Resize(shorter)`` does."""
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def random_resized_crop(
    width: int,
    height: int,
    draws: Sequence[float] | np.ndarray,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: ``(top, left, height, width)`` of the crop.

    Ten tries of an area fraction uniform in ``scale`` and a log-uniform aspect ratio in
    ``ratio``; the first crop that fits is placed uniformly; if none fits, the centre crop of the
    whole image with its ratio clamped into ``ratio``. The random numbers come from ``draws``
    (:data:`RRC_DRAWS` uniforms in [0, 1): ``draws[2k]``, ``draws[2k+1]`` for try k,
    ``draws[20]``, ``draws[21]`` for the offsets) instead of torch's generator, so the result is
    a pure function of the image size and the sample's key.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * draws[2 * attempt])
        aspect = math.exp(log_lo + (log_hi - log_lo) * draws[2 * attempt + 1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            # torch.randint(0, n) as floor(u * n): uniform over the same n offsets.
            top = min(int(draws[20] * (height - h + 1)), height - h)
            left = min(int(draws[21] * (width - w + 1)), width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def centre_placement(width: int, height: int, resized: tuple[int, int], out: tuple[int, int]) -> Placement:
    """The image resized to ``resized`` = (width, height), then centre-cropped to ``out`` =
    (height, width) as torchvision's ``CenterCrop`` (zero padding where it is smaller)."""
    rw, rh = resized
    oh, ow = out
    left = int(round((rw - ow) / 2.0)) if rw >= ow else -((ow - rw) // 2)
    top = int(round((rh - oh) / 2.0)) if rh >= oh else -((oh - rh) // 2)
    vx0, vx1 = max(0, left), min(rw, left + ow)
    vy0, vy1 = max(0, top), min(rh, top + oh)
    fx, fy = width / rw, height / rh
    return Placement(
        src=(vx0 * fx, vy0 * fy, vx1 * fx, vy1 * fy),
        dst=(vx0 - left, vy0 - top, vx1 - left, vy1 - top),
        canvas=(oh, ow),
        resized=resized,
        window=(vx0, vy0, vx1, vy1),
    )


def whole(width: int, height: int, out: tuple[int, int]) -> Placement:
    """The whole image resized to ``out`` = (height, width)."""
    return Placement(
        src=(0.0, 0.0, float(width), float(height)),
        dst=(0, 0, out[1], out[0]),
        canvas=out,
        resized=(out[1], out[0]),
        window=(0, 0, out[1], out[0]),
    )


def cover_size(width: int, height: int, out: tuple[int, int]) -> tuple[int, int]:
    """The smallest aspect-keeping ``(width, height)`` that covers ``out`` = (height, width): the
    shorter side (relative to the output's shape) scaled to the output's; for a square output,
    exactly torchvision's ``Resize(side)``."""
    oh, ow = out
    if oh * width >= ow * height:  # the height binds: oh / height >= ow / width
        return max(ow, int(width * oh / height)), oh
    return ow, max(oh, int(height * ow / width))


def dct_reduction(placement: Placement, *, limit: int = 8) -> int:
    """The largest power of two (up to ``limit``) by which the source can be shrunk while decoding
    (libjpeg's DCT scaling) with the crop still at least as large as its output box."""
    x0, y0, x1, y1 = placement.src
    dx0, dy0, dx1, dy1 = placement.dst
    if dx1 <= dx0 or dy1 <= dy0:
        return 1
    room = min((x1 - x0) / (dx1 - dx0), (y1 - y0) / (dy1 - dy0))
    reduction = 1
    while reduction * 2 <= min(room, limit):
        reduction *= 2
    return reduction
