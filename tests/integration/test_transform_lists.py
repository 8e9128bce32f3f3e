"""Lists of transforms (NOTE [ Transform lists ] in naiad/transforms.py): the leading worker-side
members run together in the workers, ``naiad.to_tuple`` ends the list with the tuple a
torchvision-style loop unpacks, and a user's random augmentation keyed by ``naiad.batch_uniforms``
gives the same pixels for any worker count and after a resume."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

import naiad
from naiad.errors import ConfigError
from naiad.transforms import Compose, split

Image = pytest.importorskip("PIL.Image", reason="the image tests write images with Pillow (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(180)

N = 40


def _png(k: int) -> bytes:
    rng = np.random.default_rng(k)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (20 + k % 7, 24, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture()
def folder(tmp_path: Path) -> str:
    for k in range(N):
        path = tmp_path / "train" / f"class{k % 4}"
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{k:03d}.png").write_bytes(_png(k))
    return str(tmp_path / "train")


class Erase:
    """A user's random erasing, in the workers: each sample's rectangle from its own uniforms."""

    def placement(self) -> naiad.Placement:
        return naiad.Placement("workers", column="image", key="__index__")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        u = naiad.batch_uniforms(batch, 3)
        images = batch["image"].clone()
        _, _, h, w = images.shape
        for i, (erase, y, x) in enumerate(u.tolist()):  # per sample, as torchvision's RandomErasing
            if erase < 0.5:
                top, left = int(y * h / 2), int(x * w / 2)
                images[i, :, top:top + h // 2, left:left + w // 2] = 0
        return {**batch, "image": images, "pid": torch.full((len(images),), os.getpid())}


def _training(folder: str, **kw: Any) -> naiad.DataLoader:
    return naiad.DataLoader(
        naiad.read_images(folder), batch_size=8, shuffle=True, seed=3,
        transform=[naiad.decode_images("image", size=16, crop="random", flip=True), Erase(),
                   naiad.to_tuple("image", "label")], **kw)


def _pairs(loader: naiad.DataLoader, stop: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for image, target in loader:  # what torchvision's classification reference loop does
        out.append((image, target))
        if stop is not None and len(out) == stop:
            break
    return out


def test_a_torchvision_style_loop_unpacks_images_and_targets(folder: str) -> None:
    pairs = _pairs(_training(folder))
    assert sum(len(t) for _, t in pairs) == N
    image, target = pairs[0]
    assert image.dtype == torch.uint8 and image.shape == (8, 3, 16, 16) and target.dtype == torch.int64


@pytest.mark.parametrize("kw", [{"num_workers": 2}, {"num_workers": 2, "worker_mode": "thread"}])
def test_random_crops_flips_and_a_users_erasing_are_the_same_for_any_worker_count(folder: str, kw: dict[str, Any]) -> None:
    base = _pairs(_training(folder))
    other = _pairs(_training(folder, **kw))
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(base, other, strict=True))


def test_the_same_pixels_after_a_resume(folder: str) -> None:
    whole = _pairs(_training(folder))
    first = _training(folder)
    before = _pairs(first, stop=2)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _training(folder, num_workers=2)
    resumed.load_state_dict(state)
    after = _pairs(resumed)
    assert len(before + after) == len(whole)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(before + after, whole, strict=True))


def test_a_leading_worker_side_member_runs_in_map_style_worker_processes() -> None:
    images = torch.randint(0, 255, (32, 3, 8, 8), dtype=torch.uint8)
    data = naiad.ArrayDataset({"image": images, "label": torch.arange(32)})
    loader = naiad.DataLoader(data, batch_size=8, shuffle=True, seed=1, num_workers=2,
                              transform=[Erase(), lambda b: {**b, "loop_pid": os.getpid()}])
    batches = list(loader)
    assert all(int(b["pid"][0]) != os.getpid() and b["loop_pid"] == os.getpid() for b in batches)
    inline = list(naiad.DataLoader(data, batch_size=8, shuffle=True, seed=1,
                                   transform=[Erase(), lambda b: {**b, "loop_pid": os.getpid()}]))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(batches, inline, strict=True))


class Rows(IterableDataset):
    def __iter__(self):
        yield from ({"x": torch.tensor(i)} for i in range(6))


def test_an_iterable_dataset_runs_the_whole_list_in_the_loop() -> None:
    loader = naiad.DataLoader(Rows(), batch_size=3, transform=[lambda b: {**b, "pid": os.getpid()}, naiad.to_tuple("x", "pid")])
    assert [(x.tolist(), pid) for x, pid in loader] == [([0, 1, 2], os.getpid()), ([3, 4, 5], os.getpid())]


def test_split_puts_the_leading_worker_side_members_together() -> None:
    decode, erase, pick = naiad.decode_images("image"), Erase(), naiad.to_tuple("image")
    head, tail = split([decode, erase, pick, erase])
    assert isinstance(head, Compose) and head.transforms == (decode, erase)
    assert isinstance(tail, Compose) and tail.transforms == (pick, erase)  # after the loop: the loop
    assert head.placement().runs == "workers" and head.placement().key == "__index__"
    assert split(decode) == (decode, None) and split(pick) == (None, pick) and split(None) == (None, None)


def test_a_wrapper_member_must_come_first_and_to_tuple_names_what_is_missing() -> None:
    tokens = pytest.importorskip("tokenizers")
    tok = tokens.Tokenizer(tokens.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokens.pre_tokenizers.Whitespace()
    with pytest.raises(ConfigError, match=r"`transform\[1\]` \(Tokenize\) reads the source through a wrapper"):
        Compose([naiad.to_tuple("text"), naiad.tokenize(tok, seq_len=4, eos_id=0)])
    with pytest.raises(ConfigError, match=r"to_tuple\('image', 'label'\): the batch has no such columns \(it has \['x'\]\)"):
        naiad.to_tuple("image", "label")({"x": 1})
    with pytest.raises(ConfigError, match="`count` must be an int >= 1"):
        naiad.batch_uniforms({"__index__": np.arange(3)}, 0)
    with pytest.raises(ConfigError, match="has no column '__index__'"):
        naiad.batch_uniforms({"x": np.arange(3)}, 2)


def test_the_same_pixels_after_an_elastic_resume(folder: str) -> None:
    def make(**kw: Any) -> naiad.DataLoader:
        return naiad.DataLoader(
            naiad.read_images(folder), batch_size=4, shuffle=True, seed=3,
            transform=[naiad.decode_images("image", size=16, crop="random", flip=True), Erase(),
                       naiad.to_tuple("image", "__index__")], **kw)

    whole = {int(k): im for images, keys in make() for im, k in zip(images, keys, strict=True)}
    got: dict[int, torch.Tensor] = {}
    state = None
    for rank in range(2):  # two ranks, two batches each, then one rank for the rest
        loader = make(rank=rank, world_size=2)
        for n, (images, keys) in enumerate(loader):
            got.update({int(k): im for im, k in zip(images, keys, strict=True)})
            if n == 1:
                state = state or json.loads(json.dumps(loader.state_dict()))
                break
    one = make()
    one.load_state_dict(state)  # type: ignore[arg-type]
    for images, keys in one:
        for im, k in zip(images, keys, strict=True):
            assert int(k) not in got, "a sample delivered twice"
            got[int(k)] = im
    assert sorted(got) == sorted(whole) and all(torch.equal(got[k], whole[k]) for k in whole)
