"""A centre crop computes only (about) its window of the resized image (NOTE [ Resizing a window ]
in media/geometry.py): the same pixels as resizing the whole image and then cropping, exactly
where a cut keeps the output grid, within a pixel where none does; and a slightly enlarging
resize is still a resize."""

from __future__ import annotations

import numpy as np
import torch

from naiad.media import geometry, images
from naiad.media.image_options import INTERPOLATIONS


def test_resize_window_equals_resizing_the_whole_image_then_cropping() -> None:
    # The centre crop computes only the output up to the window's far edges (the input cut past
    # them): the pixels must be exactly those of resizing everything, for any shapes.
    rng = np.random.default_rng(0)
    for _ in range(40):
        w, h = (int(v) for v in rng.integers(40, 400, size=2))
        out_side = int(rng.integers(8, 200))
        shorter = int(rng.integers(out_side, out_side + 120))
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        image = torch.from_numpy(pixels).permute(2, 0, 1)
        resized = geometry.shorter_side_size(w, h, shorter)
        placement = geometry.centre_placement(w, h, resized, (out_side, out_side))
        for interpolation in INTERPOLATIONS:
            got = torch.from_numpy(np.ascontiguousarray(images._resize_window(pixels, placement, interpolation)))
            whole = torch.nn.functional.interpolate(
                image[None], size=(resized[1], resized[0]), mode=interpolation, antialias=True
            )[0]
            vx0, vy0, vx1, vy1 = placement.window  # type: ignore[misc]
            assert torch.equal(got, whole[:, vy0:vy1, vx0:vx1]), (w, h, shorter, out_side, interpolation)


def whole_then_window(pixels: np.ndarray, placement: geometry.Placement, interpolation: str) -> torch.Tensor:
    resized = torch.nn.functional.interpolate(
        torch.from_numpy(pixels).permute(2, 0, 1)[None],
        size=(placement.resized[1], placement.resized[0]),  # type: ignore[index]
        mode=interpolation,
        antialias=True,
    )[0]
    vx0, vy0, vx1, vy1 = placement.window  # type: ignore[misc]
    return resized[:, vy0:vy1, vx0:vx1]


def test_resize_window_cuts_the_near_side_of_elongated_images_within_one_level() -> None:
    # An elongated image's window is far along its long axis; the input is cut before it too
    # where the cut keeps the output grid (NOTE [ Resizing a window ]). The pixels may differ from
    # the whole resize by float rounding alone: at most one level (in practice, none).
    rng = np.random.default_rng(5)
    shapes = [(2001, 3), (3, 2001), (2000, 3), (600, 1), (1, 600), (1400, 5), (7, 1500), (2400, 16), (333, 2)]
    shapes += [(int(rng.integers(300, 2500)), int(rng.integers(1, 12))) for _ in range(12)]
    cut = inexact = 0
    for w, h in shapes:
        if rng.random() < 0.5 and (w, h) not in shapes[:9]:
            w, h = h, w
        side = int(rng.integers(8, 64))
        shorter = int(rng.integers(side, side + 40))
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        resized = geometry.shorter_side_size(w, h, shorter)
        placement = geometry.centre_placement(w, h, resized, (side, side))
        vx0, vy0, vx1, vy1 = placement.window  # type: ignore[misc]
        spans = geometry.resize_span(h, resized[1], vy0, vy1), geometry.resize_span(w, resized[0], vx0, vx1)
        cut += any(span.start > 0 for span in spans)
        exact = all(span.exact for span in spans)
        inexact += not exact
        if not exact:  # no cut keeps the grid: seen on a smooth image, the window lies within a
            # pixel of the whole resize's (a window elsewhere would differ by tens of levels)
            yy, xx = np.mgrid[0:h, 0:w]
            pixels = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), 127 + 120 * np.sin((xx + yy) / 40)], -1).astype(np.uint8)
        for interpolation in INTERPOLATIONS:
            got = torch.from_numpy(np.ascontiguousarray(images._resize_window(pixels, placement, interpolation)))
            diff = (got.int() - whole_then_window(pixels, placement, interpolation).int()).abs()
            if exact:
                assert int(diff.max()) <= 1, (w, h, shorter, side, interpolation, spans)
            else:
                assert float(diff.float().mean()) < 2.0, (w, h, shorter, side, spans, float(diff.float().mean()))
    assert cut >= 12 and inexact >= 1  # most of these shapes take an aligned near cut; 2000x3 cannot
    # 3x2000 resized to 224: 149,333 columns share no factor with 2000, so no cut keeps the grid
    assert not geometry.resize_span(2000, 149_333, 74_554, 74_778).exact
    assert geometry.resize_span(2000, 149_333, 74_554, 74_778).start > 0
    assert geometry.resize_span(2001, 149_408, 74_592, 74_816).start > 0
    assert geometry.resize_span(2001, 149_408, 74_592, 74_816).exact


def test_centre_crop_of_an_image_just_smaller_than_its_resize_is_resized() -> None:
    # 340x255 with resize=256 enlarges by 256/255: the rows kept for a 224 crop (245) came out
    # 245 long, which torch takes as no resize at all (the pixels were the unscaled rows).
    rng = np.random.default_rng(6)
    for w, h in ((340, 255), (255, 340), (545, 392), (464, 152)):
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        shorter = min(w, h) + 1
        resized = geometry.shorter_side_size(w, h, shorter)
        side = min(224, shorter - 20)
        placement = geometry.centre_placement(w, h, resized, (side, side))
        for interpolation in INTERPOLATIONS:
            got = torch.from_numpy(np.ascontiguousarray(images._resize_window(pixels, placement, interpolation)))
            assert torch.equal(got, whole_then_window(pixels, placement, interpolation)), (w, h, interpolation)
