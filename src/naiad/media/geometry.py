"""Where each image's pixels go: the crop and resize of one image as a pure function of its size,
the options and (for random crops) its keyed uniform draws.

A :class:`Placement` says which box of the source image (in source pixels, floats) is drawn into
which box of the output canvas (in output pixels, ints). The decoder picks the DCT scale from it
(:func:`dct_reduction`), then does one of two things, each torchvision's order of operations:

* a random crop (``resized`` None): cut the box from the decoded pixels, then resize the cut
  (``RandomResizedCrop`` crops, then resizes);
* a resize (``resized`` = the whole image's resized size) with a centre or random crop: resize
  the image to ``resized`` and keep ``window`` of it (``Resize`` then ``CenterCrop`` or
  ``RandomCrop``). Only (about) the window
  is computed: the input is cut to the span of each axis that :func:`resize_span` gives (NOTE [
  Resizing a window ]), so the crop costs little however long the image, and the pixels are
  those of resizing the whole image.

The rules are torchvision's: ``Resize(N)`` keeps the aspect ratio with the shorter side N and the
longer side truncated (``int(N * long / short)``); ``CenterCrop`` offsets by
``int(round((size - crop) / 2))`` and pads with zeros where the image is smaller than the crop;
``RandomResizedCrop`` is :func:`random_resized_crop`. ``RandomCrop`` after ``Resize(N)``
(:func:`random_crop_placement`) places its offset uniformly over the positions that fit, as
``torch.randint`` would, and along a side shorter than the crop centres it with zero padding, as
``CenterCrop`` does (torchvision's ``RandomCrop`` would raise there without ``pad_if_needed``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "Placement",
    "RRC_DRAWS",
    "centre_placement",
    "cover_size",
    "dct_reduction",
    "random_crop_placement",
    "random_resized_crop",
    "resize_span",
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
    return _window_placement(width, height, resized, out, left, top)


def random_crop_placement(
    width: int, height: int, resized: tuple[int, int], out: tuple[int, int], draws: Sequence[float] | np.ndarray
) -> Placement:
    """The image resized to ``resized`` = (width, height), then a random ``out`` = (height,
    width) crop of it (torchvision's ``Resize(N)`` + ``RandomCrop``). The offsets come from the
    draws a random resized crop places its box with (``draws[20]`` down, ``draws[21]`` across,
    as :func:`random_resized_crop`), uniform over the ``resized - out + 1`` positions; a side
    shorter than the crop is centred with zero padding, as :func:`centre_placement`."""
    rw, rh = resized
    oh, ow = out
    top = min(int(draws[20] * (rh - oh + 1)), rh - oh) if rh >= oh else -((oh - rh) // 2)
    left = min(int(draws[21] * (rw - ow + 1)), rw - ow) if rw >= ow else -((ow - rw) // 2)
    return _window_placement(width, height, resized, out, left, top)


def _window_placement(width: int, height: int, resized: tuple[int, int], out: tuple[int, int], left: int,
                      top: int) -> Placement:
    """The image resized to ``resized``, and its ``out`` box at ``(left, top)`` of the resized
    image (negative: that much zero padding before the image)."""
    rw, rh = resized
    oh, ow = out
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


# NOTE [ Resizing a window ]
# torch's antialiased resize, given the scale s explicitly (``F.interpolate(scale_factor=s,
# recompute_scale_factor=False)``), maps output pixel i to input position (i + 0.5) / s - 0.5
# and weighs the input pixels within the filter's reach of it (1/s input pixels on each side for
# bilinear downscaling, 2/s for bicubic; 1 or 2 when enlarging). So a window of the resized image
# can be computed from a span of the input, with the same pixels as resizing it whole:
#
# * the far side: cut the input past the window's far edge plus the filter's reach (the output
#   there is never read);
# * the near side: cut k input pixels only where k * s is a whole number m, so output pixel i of
#   the span is output pixel i + m of the whole image exactly (k a multiple of
#   inside / gcd(inside, out)), and at least the filter's reach before the window, so no weight
#   of a window pixel is cut. Any other k would move the grid by a fraction of a pixel (0.56
#   levels of mean difference on ImageNet-shaped photos). Without it, a 1x8000 image bound for a
#   224 centre crop is resized to 224 x 896,112 to keep 224 x 224 of it: 1.2 GB. A near cut is
#   made only when it saves NEAR_CUT_MIN_SKIP output pixels or more along the axis, so ordinary
#   photos take the far cut alone.
#
# The arithmetic of the two is the same in exact numbers; in floats the positions differ by a
# few ulps, and the uint8 weights (rounded from them) came out bit for bit the same in every
# shape tried (24,000 elongated shapes with a near cut, bilinear and bicubic, enlarged and
# shrunk, when this was written; tests/unit/test_decode_images.py keeps a sample and allows one
# level, the most a weight rounding the other way could move a pixel of one pass).
#
# A shape whose resized length shares no useful factor with its own (3x20000 resized to 224 x
# 1,493,333) has no aligned cut near its window. Computed up to the far edge it would take a
# gigabyte for a 224x224 crop, so it is cut at the whole input pixel before the reach instead,
# and its window lands less than one output pixel from where the whole resize puts it: such
# shapes (long strips whose lengths share no factor) alone trade exactness for memory, and
# tests/unit/test_decode_bounds.py holds their pixels near the whole resize's.
#
# One torch rule shapes the span too: a resize whose output length equals its input's along an
# axis is skipped there as the identity, whatever the scale. Enlarging slightly (255 rows to
# 256) a span of n rows with floor(n * s) == n would come out unresized, so such a span is
# widened until it grows.

NEAR_CUT_MIN_SKIP = 1024
"""The fewest resized pixels along an axis a near cut must skip to be made (NOTE [ Resizing a
window ])."""


class Span(NamedTuple):
    """One axis of a resized window (NOTE [ Resizing a window ]): resize input pixels
    ``[start, stop)`` by ``scale``; the first output pixel is the whole resize's ``skip``
    (exactly, or, where no cut keeps the grid, less than one output pixel from it: ``exact``)."""

    start: int
    stop: int
    scale: float
    skip: int
    exact: bool = True


def resize_span(inside: int, out: int, near: int, far: int) -> Span:
    """The input span that pixels ``[near, far)`` of ``inside`` pixels resized to ``out`` need,
    and the scale to resize it by (NOTE [ Resizing a window ])."""
    if out == inside:  # no resize along this axis: torch copies it, any cut is exact
        return Span(near, far, 1.0, near)
    scale = out / inside
    while math.floor(inside * scale) < out:  # the float division may land just below
        scale = math.nextafter(scale, math.inf)
    reach = 2.0 * max(1.0, 1.0 / scale)  # bicubic's (bilinear's is half): +-2 output pixels
    stop = min(inside, math.ceil((far + 2) / scale + reach) + 1)
    start = skip = 0
    if near >= NEAR_CUT_MIN_SKIP:  # else no cut can skip enough (skip <= near): ordinary photos
        before = (near + 0.5) / scale - reach - 2
        start = _near_cut(inside, out, before)
        skip = start * out // inside  # exact: start * out is a multiple of inside
        if skip < NEAR_CUT_MIN_SKIP:  # no aligned cut near the window: the nearest whole pixel
            start = max(0, int(before))
            skip = start * out // inside  # the window moves by less than one output pixel
    if scale > 1.0 and math.floor((stop - start) * scale) <= stop - start:
        # torch would take this span as the identity: widen it until it grows (at most the whole)
        stop = min(inside, max(stop, start + math.ceil(1.0 / (scale - 1.0)) + 2))
        if math.floor((stop - start) * scale) <= stop - start:
            start = skip = 0
            stop = inside
    if start and math.floor((stop - start) * scale) < far - skip:  # a float lost the last pixel
        start = skip = 0
    return Span(start, stop, scale, skip, exact=start * out % inside == 0)


def _near_cut(inside: int, out: int, before: float) -> int:
    """The largest k <= ``before`` with ``k * out / inside`` whole (0 if none)."""
    if before < 1.0:
        return 0
    step = inside // math.gcd(inside, out)
    return int(before) // step * step
