"""What :func:`naiad.decode_images` does to each image: its options, checked once when the transform
is made, and each image's crop and resize (its :class:`~naiad.media.geometry.Placement`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.media import geometry
from naiad.media.geometry import Placement

__all__ = ["INTERPOLATIONS", "MODES", "ImageOptions", "image_options"]

MODES = {"RGB": 3, "L": 1, "RGBA": 4}
"""Output modes and their channel counts."""

INTERPOLATIONS = ("bilinear", "bicubic")


@dataclass(frozen=True)
class ImageOptions:
    """What :func:`decode_images` does to each image (see its arguments)."""

    size: tuple[int, int] | None = None
    resize: str | int = "shorter"
    crop: str | None = None
    flip: bool = False
    mode: str = "RGB"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: str = "bilinear"
    max_pixels: int | None = None

    @property
    def random(self) -> bool:
        """Whether samples draw random numbers (a random crop or a flip)."""
        return self.crop == "random" or self.flip

    def placement(self, width: int, height: int, draws: np.ndarray | None) -> Placement:
        """The crop and resize of a ``width`` x ``height`` image (``media/geometry.py``)."""
        if self.size is None:
            if isinstance(self.resize, int):
                rw, rh = geometry.shorter_side_size(width, height, self.resize)
                return geometry.whole(width, height, (rh, rw))
            return geometry.whole(width, height, (height, width))
        out_h, out_w = self.size
        if self.crop == "random":
            assert draws is not None  # drawn whenever the options are random
            if isinstance(self.resize, int):  # Resize(N) + RandomCrop(size)
                resized = geometry.shorter_side_size(width, height, self.resize)
                return geometry.random_crop_placement(width, height, resized, self.size, draws)
            top, left, h, w = geometry.random_resized_crop(width, height, draws, self.scale, self.ratio)
            return Placement(src=(left, top, left + w, top + h), dst=(0, 0, out_w, out_h), canvas=self.size)
        if self.crop == "center":
            if isinstance(self.resize, int):
                resized = geometry.shorter_side_size(width, height, self.resize)
            else:
                resized = geometry.cover_size(width, height, self.size)
            return geometry.centre_placement(width, height, resized, self.size)
        return geometry.whole(width, height, self.size)


def image_options(
    *,
    size: int | tuple[int, int] | None,
    resize: str | int,
    crop: str | None,
    flip: bool,
    mode: str,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    interpolation: str,
    max_pixels: int | None,
) -> ImageOptions:
    """:func:`naiad.decode_images`'s arguments as :class:`ImageOptions`, checked.

    Raises:
        ConfigError: an option out of its choices, or options that make no one output.
    """
    options = ImageOptions(size=_size(size), resize=resize, crop=crop, flip=bool(flip), mode=mode,
                           scale=_range("scale", scale), ratio=_range("ratio", ratio),
                           interpolation=interpolation, max_pixels=max_pixels)
    _check_choices(options)
    _check_geometry(options, size)
    return options


def _range(name: str, pair: tuple[float, float]) -> tuple[float, float]:
    if len(pair) != 2 or not 0 < pair[0] <= pair[1]:
        raise ConfigError(f"`{name}` must be (low, high) with 0 < low <= high, got {pair!r}.")
    return (float(pair[0]), float(pair[1]))


def _check_choices(o: ImageOptions) -> None:
    """Each option one of its choices (ConfigError naming it)."""
    if not (o.resize in ("shorter", "stretch") or (isinstance(o.resize, int) and not isinstance(o.resize, bool) and o.resize > 0)):
        raise ConfigError(f"`resize` must be 'shorter', 'stretch' or a positive int, got {o.resize!r}.")
    if o.crop not in (None, "center", "random"):
        raise ConfigError(f"`crop` must be None, 'center' or 'random', got {o.crop!r}.")
    if o.mode not in MODES:
        raise ConfigError(f"`mode` must be one of {sorted(MODES)}, got {o.mode!r}.")
    if o.interpolation not in INTERPOLATIONS:
        raise ConfigError(f"`interpolation` must be one of {list(INTERPOLATIONS)}, got {o.interpolation!r}.")
    if o.max_pixels is not None and (isinstance(o.max_pixels, bool) or not isinstance(o.max_pixels, int) or o.max_pixels < 1):
        raise ConfigError(f"`max_pixels` must be None (Pillow's limit) or a positive int, got {o.max_pixels!r}.")


def _check_geometry(o: ImageOptions, size: Any) -> None:
    """The size, resize and crop together make one output (ConfigError saying what to give)."""
    crop, resize = o.crop, o.resize
    if o.size is None:
        if crop is not None:
            raise ConfigError(f"`crop={crop!r}` needs an output `size`, e.g. size=224.")
        if resize == "stretch":
            raise ConfigError("`resize='stretch'` needs an output `size`, e.g. size=(224, 224).")
    elif crop is None and resize != "stretch":
        raise ConfigError(
            f"`size={size!r}` with `crop=None` and `resize={resize!r}` leaves the longer side too "
            "long: give crop='center' (or 'random'), or resize='stretch' to ignore the aspect ratio."
        )
    elif crop == "center" and resize == "stretch":
        raise ConfigError("`resize='stretch'` fills the output: there is nothing for `crop='center'` to cut.")
    elif crop == "random" and resize == "stretch":
        raise ConfigError(
            "`crop='random'` with `resize='stretch'` has nothing to crop: give resize='shorter' (the "
            "default: RandomResizedCrop of the original image) or resize=N (shorter side to N, then a "
            "random crop of `size`)."
        )


def _size(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in pair):
        raise ConfigError(f"`size` must be None, a positive int or (height, width), got {size!r}.")
    return (int(pair[0]), int(pair[1]))
