"""slot_collate builds exactly torch's default_collate batches, its stacks in a batch slot."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from naiad.dataset.slot_collate import slot_collate
from naiad.parallel import slots
from tests.helpers import assert_same_batch

Point = collections.namedtuple("Point", "x y")


@pytest.fixture
def in_a_worker() -> Iterator[slots.WorkerSlots]:
    held = slots.WorkerSlots(lambda *args: None)  # slots made here, announced to nobody
    slots.use(held)
    try:
        yield held
    finally:
        slots.use(None)


def samples(kind: str, n: int = 5) -> list[Any]:
    out: list[Any] = []
    for i in range(n):
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4) + i
        a = np.arange(6, dtype=np.uint16) * i
        out.append({
            "tensor": t,
            "dict": {"image": t, "array": a, "label": i, "score": i / 2, "name": f"s{i}", "flag": i % 2 == 0},
            "tuple": (t.to(torch.uint8), i, a),
            "namedtuple": Point(t, a),
            "list": [t, i],
            "bf16": {"x": t.to(torch.bfloat16), "y": i},
            "scalar": (torch.tensor(i), np.array(i, dtype=np.int32)),
            "strided": {"x": t.t(), "a": a[::2]},
        }[kind])
    return out


KINDS = ["tensor", "dict", "tuple", "namedtuple", "list", "bf16", "scalar", "strided"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_batch_is_torchs(in_a_worker: slots.WorkerSlots, kind: str) -> None:
    want = default_collate(samples(kind))
    got = slot_collate(samples(kind))
    assert type(got) is type(want)
    assert_same_batch(want, got)


def test_stacks_are_built_in_the_slot(in_a_worker: slots.WorkerSlots) -> None:
    batch = slot_collate(samples("tuple"))  # [uint8 images, labels, uint16 arrays]
    views = _views(in_a_worker.pack(batch))
    assert [v.copy for v in views] == [False, True, False]  # the labels: default_collate's own


def _views(tree: Any) -> list[Any]:
    if isinstance(tree, list):
        return [v for t in tree for v in _views(t)]
    return [tree] if type(tree).__name__ == "_SlotView" else []


def test_mismatched_samples_raise_as_torch_does(in_a_worker: slots.WorkerSlots) -> None:
    bad = [torch.zeros(3), torch.zeros(4)]
    with pytest.raises(RuntimeError) as want:
        default_collate(bad)
    with pytest.raises(RuntimeError) as got:
        slot_collate(bad)
    assert str(got.value) == str(want.value)


def test_outside_a_worker_it_is_default_collate() -> None:
    assert_same_batch(default_collate(samples("dict")), slot_collate(samples("dict")))
