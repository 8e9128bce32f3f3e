"""Tar shards read before every shard is indexed (NOTE [ Early reads ] in naiad/stream/early.py):
a fresh pass on one rank plans its first reads from the shards' sizes, whatever their size, and
keys its samples by shard and sample, so a decode transform's batches need no count either. The
count is held here until the first batches have arrived; what arrives is what a counted source
gives (the same samples, order and pixels), and a state taken meanwhile resumes exactly."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import numpy as np
import pytest

import naiad
from naiad.sources.webdataset import WebDatasetSource
from naiad.stream.early import EarlyReads

wds = pytest.importorskip("webdataset", reason="the shard tests write shards with webdataset (pip install 'naiad[test]')")
Image = pytest.importorskip("PIL.Image", reason="the decode tests write images with Pillow (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(180)

SHARDS, PER_SHARD = 40, 12


def jpeg(k: int) -> bytes:
    pixels = np.random.default_rng(k).integers(0, 256, (16 + k % 5, 18 + k % 3, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def pattern(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("shards")
    with wds.ShardWriter(str(folder / "train-%04d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for k in range(SHARDS * PER_SHARD):
            sink.write({"__key__": f"s{k:05d}", "jpg": jpeg(k), "cls": k})
    return str(folder / f"train-{{0000..{SHARDS - 1:04d}}}.tar")


class CountGate:
    """Holds the count of every shard (``_cut_files``, on its thread beside the reads) until
    opened, counts the header walks, and remembers the early reads made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.walked: list[str] = []
        self.made: list[EarlyReads] = []
        cut = WebDatasetSource._cut_files
        walk = naiad.sources.webdataset.scan_shard
        start = EarlyReads.start.__func__  # type: ignore[attr-defined]

        def held(source: WebDatasetSource) -> Any:
            assert self.open.wait(60), "the count was never let go"
            return cut(source)

        def walked(path: str, store: Any = None) -> Any:
            index = walk(path, store)
            self.walked.append(path)
            return index

        def spied(cls: type, *args: Any, **kwargs: Any) -> EarlyReads | None:
            made = start(cls, *args, **kwargs)
            if made is not None:
                self.made.append(made)
            return made

        monkeypatch.setattr(WebDatasetSource, "_cut_files", held)
        monkeypatch.setattr(naiad.sources.webdataset, "scan_shard", walked)
        monkeypatch.setattr(EarlyReads, "start", classmethod(spied))


def source(pattern: str, index_dir: Any = False, block_bytes: int | None = None) -> naiad.sources.WebDatasetSource:
    # By default one block a shard (the grid's 1 MiB step is more than a shard): early reads
    # cover the first half of the blocks, and the first batch needs a few of them.
    return naiad.read_webdataset(pattern, index_dir=index_dir, block_bytes=block_bytes)


def loader_of(src: Any, **kw: Any) -> naiad.DataLoader:
    kw.setdefault("shuffle_buffer", 20)  # a few shards' samples: the first batch needs few shards
    transform = naiad.decode_images("jpg", crop="random", size=12, flip=True)
    return naiad.DataLoader(src, batch_size=8, shuffle=True, seed=4, transform=transform, **kw)


def delivered(batches: list[dict[str, Any]]) -> list[tuple[str, int, int, bytes]]:
    return [(k, int(i), int(c), img.numpy().tobytes())
            for b in batches for k, i, c, img in zip(b["__key__"], b["__index__"], b["cls"], b["jpg"], strict=True)]


def counted_run(pattern: str, block_bytes: int | None = None, **kw: Any) -> list[tuple[str, int, int, bytes]]:
    src = source(pattern, block_bytes=block_bytes)
    src.blocks()  # counted first: no early reads
    return delivered(list(loader_of(src, **kw)))


@pytest.mark.parametrize(("block_bytes", "options"), [
    (None, {}), (None, {"num_workers": 2, "worker_mode": "process"}), (None, {"shuffle_buffer": 2}),
    (2048, {"shuffle_buffer": 50}),  # several blocks a shard, the blocks read early spread over most shards
])
def test_the_first_batch_of_decoded_shards_comes_before_every_shard_is_indexed(pattern, monkeypatch, block_bytes, options):
    want = counted_run(pattern, block_bytes, **options)
    gate = CountGate(monkeypatch)
    src = source(pattern, block_bytes=block_bytes)
    loader = loader_of(src, **options)
    try:
        it = iter(loader)
        first = next(it)
        # The count has not run: the first batch came from the shards its reads needed (a
        # handful of the forty, with a shard a block; small blocks spread over most of them).
        assert not src.counted()
        if block_bytes is None:
            assert len(set(gate.walked)) <= SHARDS // 4 and len(src._indexes) <= SHARDS // 4, gate.walked
        assert gate.made and gate.made[0].early
        gate.open.set()
        got = delivered([first, *it])
    finally:
        gate.open.set()
        loader.close()
    assert got == want  # the same samples, in the same order, with the same crops
    assert sorted(c for _, _, c, _ in got) == list(range(SHARDS * PER_SHARD))
    assert [i for _, i, c, _ in got] == [(c // PER_SHARD << 32) + c % PER_SHARD for _, _, c, _ in got]
    assert len(loader) == gate.made[0].resolve().num_batches == -(-SHARDS * PER_SHARD // 8)


def test_a_state_taken_while_the_shards_are_indexed_resumes_exactly(pattern, monkeypatch):
    want = counted_run(pattern)
    gate = CountGate(monkeypatch)
    loader = loader_of(source(pattern))
    it = iter(loader)
    got = delivered([next(it) for _ in range(3)])
    assert gate.made and gate.made[0].early
    threading.Timer(0.3, gate.open.set).start()  # the state waits for the count
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = loader_of(source(pattern))
    resumed.load_state_dict(state)
    got += delivered(list(resumed))
    assert got == want


def test_kept_indexes_start_the_next_process_without_a_walk(pattern, tmp_path, monkeypatch):
    index = tmp_path / "index"
    first = delivered([b for b in loader_of(source(pattern, index))])  # not list(): len() counts first
    gate = CountGate(monkeypatch)
    batches = []
    for b in loader_of(source(pattern, index)):  # the count held until the first batch is out
        batches.append(b)
        gate.open.set()
    again = delivered(batches)
    assert again == first and not gate.walked
    assert gate.made and gate.made[0].early  # early reads, from the kept indexes


def test_two_ranks_count_first_and_split_the_epoch_exactly(pattern, monkeypatch):
    # Several ranks need every block's count to split the epoch: no early reads, every sample
    # once over the two, the same step count on each.
    gate = CountGate(monkeypatch)
    gate.open.set()
    keys, steps = [], []
    for rank in range(2):
        batches = list(loader_of(source(pattern), rank=rank, world_size=2))
        steps.append(len(batches))
        keys += [k for b in batches for k in b["__key__"]]
    assert not gate.made and steps[0] == steps[1]
    assert sorted(keys) == [f"s{k:05d}" for k in range(SHARDS * PER_SHARD)]


def test_the_crops_follow_the_sample_not_the_batch(pattern):
    # A sample's key is its shard and its place there: the same pixels whatever batch, buffer or
    # worker count it travels with.
    a = {k: img for k, _, _, img in counted_run(pattern)}
    b = {k: img for k, _, _, img in counted_run(pattern, shuffle_buffer=50, num_workers=2, worker_mode="thread")}
    assert a == b and len(a) == SHARDS * PER_SHARD
