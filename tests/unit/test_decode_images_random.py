"""naiad.decode_images' random options on real encoded images (written by Pillow here,
tests/image_data.py): torchvision's RandomResizedCrop algorithm (re-implemented below from its
published code, since torchvision does not load beside the CPU build of torch here), crops and
flips keyed by (seed, epoch, sample) whatever the batch or threads, the crop's pixels, and a
random crop after a resize as a keyed window of the resized image."""

from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import naiad  # noqa: E402
from naiad.errors import ConfigError  # noqa: E402
from naiad.media import geometry  # noqa: E402
from naiad.media.keys import sample_uniforms  # noqa: E402
from tests.image_data import encode, photo  # noqa: E402

# --- RandomResizedCrop ----------------------------------------------------------------------


def torchvision_rrc(width: int, height: int, generator: torch.Generator) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params (v0.28), drawing from torch."""
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item(), generator=generator).item())
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize("width,height", [(500, 375), (2000, 300), (64, 640)])
def test_random_resized_crop_parameters_follow_torchvision_distribution(width: int, height: int) -> None:
    # 4000 crops keyed by sample against 4000 from torchvision's algorithm on torch's generator:
    # area fraction, aspect ratio, relative offsets and the share of centre fallbacks agree
    # (two-sample Kolmogorov-Smirnov at alpha = 0.001; the seeds are fixed, so this is stable).
    n = 4000
    ours = np.array([geometry.random_resized_crop(width, height, sample_uniforms(7, 0, k, geometry.RRC_DRAWS)) for k in range(n)])
    gen = torch.Generator().manual_seed(7)
    theirs = np.array([torchvision_rrc(width, height, gen) for _ in range(n)])
    critical = 1.95 * math.sqrt(2 / n)

    def features(p: np.ndarray) -> dict[str, np.ndarray]:
        top, left, h, w = p.T.astype(float)
        return {
            "area": h * w / (height * width),
            "log_ratio": np.log(w / h),
            "top": top / np.maximum(height - h, 1),
            "left": left / np.maximum(width - w, 1),
        }

    fo, ft = features(ours), features(theirs)
    for name in fo:
        assert ks_statistic(fo[name], ft[name]) < critical, name
    assert (ours[:, 2] <= height).all() and (ours[:, 3] <= width).all() and (ours >= 0).all()
    assert ((ours[:, 0] + ours[:, 2]) <= height).all() and ((ours[:, 1] + ours[:, 3]) <= width).all()


def test_random_resized_crop_falls_back_to_the_centre_crop_with_clamped_ratio() -> None:
    # Draws that never fit (area fraction 1 at the extreme ratio on a very wide image) take
    # torchvision's fallback: full height, width = round(height * 4/3), centred.
    never = [1.0 - 1e-12, 1.0 - 1e-12] * 10 + [0.5, 0.5]
    assert geometry.random_resized_crop(1000, 100, never) == (0, (1000 - 133) // 2, 100, 133)
    assert geometry.random_resized_crop(100, 1000, [1.0 - 1e-12, 0.0] * 10 + [0.5, 0.5]) == ((1000 - 133) // 2, 0, 133, 100)


def test_random_crop_is_keyed_by_sample_not_batch_composition_or_threads(decoder: str) -> None:
    datas = [encode(photo(200 + 13 * i, 150 + 7 * i), quality=90) for i in range(8)]
    keys = np.arange(100, 108, dtype=np.int64)
    t = naiad.decode_images("image", crop="random", size=48, flip=True, seed=5)
    whole = t({"image": datas, "__index__": keys, "__epoch__": 2})["image"]
    order = [5, 1, 7]
    part = naiad.decode_images("image", crop="random", size=48, flip=True, seed=5, threads=1)(
        {"image": [datas[i] for i in order], "__index__": keys[order], "__epoch__": 2}
    )["image"]
    for row, i in enumerate(order):
        assert torch.equal(part[row], whole[i])
    again = pickle.loads(pickle.dumps(t))({"image": datas, "__index__": keys, "__epoch__": 2})["image"]
    assert torch.equal(again, whole)
    other_epoch = t({"image": datas, "__index__": keys, "__epoch__": 3})["image"]
    other_seed = naiad.decode_images("image", crop="random", size=48, flip=True, seed=6)(
        {"image": datas, "__index__": keys, "__epoch__": 2}
    )["image"]
    assert sum(not torch.equal(a, b) for a, b in zip(whole, other_epoch, strict=True)) >= 6
    assert sum(not torch.equal(a, b) for a, b in zip(whole, other_seed, strict=True)) >= 6


def test_epoch_from_the_batch_field_or_set_epoch_agree() -> None:
    datas = [encode(photo(120, 90), "PNG")] * 4
    keys = np.arange(4)
    t = naiad.decode_images("image", crop="random", size=32, seed=1)
    from_field = t({"image": datas, "__index__": keys, "__epoch__": np.full(4, 9)})["image"]
    t.set_epoch(9)
    from_attribute = t({"image": datas, "__index__": keys})["image"]
    assert torch.equal(from_field, from_attribute)
    with pytest.raises(ConfigError, match="epoch_key"):
        t({"image": datas, "__index__": keys, "__epoch__": np.array([1, 2, 1, 1])})


def test_random_crop_pixels_are_the_crop_box_resized(decoder: str) -> None:
    # Full-scale decode: the output is the keyed box of the source resized, as torchvision's
    # resized_crop does with PIL (to one level).
    data = encode(photo(300, 240), quality=95)
    t = naiad.decode_images("image", crop="random", size=(40, 50), seed=3)
    for key in range(6):
        out = t({"image": [data], "__index__": np.array([key])})["image"][0]
        top, left, h, w = geometry.random_resized_crop(300, 240, sample_uniforms(3, 0, key, geometry.RRC_DRAWS))
        if min(w / 50, h / 40) >= 2:
            continue  # decoded at a reduced DCT scale: covered by the large-photo bound
        im = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h)).resize((50, 40), Image.BILINEAR)
        ref = torch.from_numpy(np.array(im)).permute(2, 0, 1)
        assert int((out.int() - ref.int()).abs().max()) <= 1, key


def test_flip_mirrors_about_half_the_samples_keyed() -> None:
    data = encode(photo(90, 60), "PNG")
    n = 64
    batch = {"image": [data] * n, "__index__": np.arange(n)}
    plain = naiad.decode_images("image", resize=48, crop="center", size=48)(batch)["image"][0]
    flipped = naiad.decode_images("image", resize=48, crop="center", size=48, flip=True, seed=0)(batch)["image"]
    mirrored = [bool(torch.equal(x, plain.flip(-1))) for x in flipped]
    assert all(m or torch.equal(x, plain) for m, x in zip(mirrored, flipped, strict=True))
    assert 16 <= sum(mirrored) <= 48
    expected = [sample_uniforms(0, 0, k, geometry.RRC_DRAWS + 1)[geometry.RRC_DRAWS] < 0.5 for k in range(n)]
    assert mirrored == expected


def test_random_options_without_the_key_column_say_how_to_give_it() -> None:
    t = naiad.decode_images("image", crop="random", size=32)
    with pytest.raises(ConfigError, match=r"no column '__index__'.*Give `key=`"):
        t({"image": [encode(photo(40, 40), "PNG")]})
    with pytest.raises(ConfigError, match="one integer per sample"):
        t({"image": [encode(photo(40, 40), "PNG")], "__index__": np.array([0.5])})


# --- a random crop after a resize ----------------------------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_random_crop_after_a_resize_is_a_keyed_window_of_the_resized_image(fmt: str) -> None:
    # Resize(N) + RandomCrop(size): the keyed box of the image resized to shorter side N, the
    # pixels those of the resize without a crop (to one level: the window's span, NOTE [ Resizing
    # a window ]); a JPEG's DCT shrink included.
    data = encode(photo(300, 200), fmt)
    batch = {"image": [data] * 6, "__index__": np.arange(6, dtype=np.int64)}
    out = naiad.decode_images("image", resize=120, crop="random", size=(96, 80), seed=4)(batch)["image"]
    whole = naiad.decode_images("image", resize=120)({"image": [data]})["image"][0]
    assert out.shape == (6, 3, 96, 80) and tuple(whole.shape) == (3, 120, 180)
    boxes = set()
    for key in range(6):
        placement = geometry.random_crop_placement(300, 200, (180, 120), (96, 80), sample_uniforms(4, 0, key, geometry.RRC_DRAWS))
        x0, y0, x1, y1 = placement.window  # type: ignore[misc]
        assert placement.covers_canvas and (x1 - x0, y1 - y0) == (80, 96)
        boxes.add((x0, y0))
        assert (out[key].int() - whole[:, y0:y1, x0:x1].int()).abs().max() <= 1
    assert len(boxes) > 3  # the box moves with the sample
    padded = naiad.decode_images("image", resize=60, crop="random", size=80, seed=4)(batch)["image"]
    assert (padded[:, :, :10] == 0).all() and (padded[:, :, 70:] == 0).all()  # 60 rows centred in 80: zero padding
    assert (padded[:, :, 10:70].float().mean((1, 2, 3)) > 20).all()
