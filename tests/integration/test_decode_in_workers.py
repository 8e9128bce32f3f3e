"""decode_images inside naiad's worker processes, as a map-style dataset's ``__getitems__`` uses it
today: keyed by the dataset index, the epoch and the loader's seed taken from the worker, so the
pixels of a sample in an epoch do not depend on the worker count, and a resumed epoch delivers
the same pixels."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import naiad  # noqa: E402
from naiad.parallel.context import current_epoch  # noqa: E402


def identity(batch: Any) -> Any:
    return batch


class EncodedImages:
    """Encoded PNGs of varying sizes; ``__getitems__`` returns the decoded batch dict."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.data = []
        for i in range(n):
            out = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (40 + i % 7, 50 + i % 5, 3), dtype=np.uint8)).save(out, "PNG")
            self.data.append(out.getvalue())
        self.decode = naiad.decode_images("image", crop="random", size=16, flip=True)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        batch = {"image": [self.data[i] for i in indices], "__index__": np.asarray(indices, dtype=np.int64)}
        out = self.decode(batch)
        out["epoch"] = current_epoch()
        return out


def by_sample(batches: list[dict[str, Any]]) -> dict[int, torch.Tensor]:
    return {int(k): image for b in batches for k, image in zip(b["__index__"], b["image"], strict=True)}


def assert_resumed_alike(first: list[dict[str, Any]], rest: list[dict[str, Any]], again: list[dict[str, Any]]) -> None:
    """The resumed pass delivered what the interrupted one did after its ``first`` batches."""
    assert len(first) + len(rest) == 8
    assert [b["__index__"].tolist() for b in again] == [b["__index__"].tolist() for b in rest]
    for a, b in zip(again, rest, strict=True):
        assert torch.equal(a["image"], b["image"])


def run(loader: naiad.DataLoader, epoch: int) -> list[dict[str, Any]]:
    loader.set_epoch(epoch)
    return list(loader)


@pytest.mark.timeout(120)
def test_random_crops_in_workers_are_the_same_for_any_worker_count_and_differ_by_epoch() -> None:
    dataset = EncodedImages(30)
    results = {}
    for workers in (0, 2):
        loader = naiad.DataLoader(dataset, batch_size=4, shuffle=True, seed=3, num_workers=workers, collate_fn=identity)
        try:
            results[workers] = [by_sample(run(loader, epoch)) for epoch in (0, 1)]
            assert [b["epoch"] for b in run(loader, 1)] == [1] * 8
        finally:
            loader.close()
    for epoch in (0, 1):
        assert sorted(results[0][epoch]) == list(range(30))
        assert all(torch.equal(results[0][epoch][k], results[2][epoch][k]) for k in range(30))
    changed = sum(not torch.equal(results[0][0][k], results[0][1][k]) for k in range(30))
    assert changed >= 25


@pytest.mark.timeout(120)
def test_a_resumed_epoch_delivers_the_same_pixels() -> None:
    dataset = EncodedImages(30)
    loader = naiad.DataLoader(dataset, batch_size=4, shuffle=True, seed=11, num_workers=2, collate_fn=identity)
    resumed = naiad.DataLoader(dataset, batch_size=4, shuffle=True, seed=11, num_workers=2, collate_fn=identity)
    try:
        loader.set_epoch(2)
        iterator = iter(loader)
        first = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
        rest = list(iterator)
        resumed.load_state_dict(state)
        again = list(resumed)
    finally:
        loader.close()
        resumed.close()
    assert_resumed_alike(first, rest, again)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_resumed_epoch_without_a_seed_delivers_the_same_pixels(workers: int, persistent: bool) -> None:
    # Without seed=, each run draws its base seed; the state keeps the interrupted pass's, and
    # the resumed pass's workers draw the crops with it (kept workers of another seed restart).
    dataset = EncodedImages(30)

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=workers, collate_fn=identity,
                                persistent_workers=persistent)

    torch.manual_seed(1)
    loader = make()
    resumed = make()
    try:
        iterator = iter(loader)
        first = [next(iterator) for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
        rest = list(iterator)
        torch.manual_seed(2)
        if persistent:
            list(resumed)  # its workers start with this run's own base seed
        resumed.load_state_dict(state)
        again = list(resumed)
    finally:
        loader.close()
        resumed.close()
    assert_resumed_alike(first, rest, again)
