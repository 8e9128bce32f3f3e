"""The declared transform protocol (NOTE [ Transform placement ] in transforms.py): where
:func:`naiad.transforms.place` puts a transform in each pipeline, and what it says it needs."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import naiad
from naiad.transforms import READ_DECODE_MAX_BYTES, Placement, Transform, place


class Declared:
    """A user's transform that declares its placement."""

    def __init__(self, placement: Placement) -> None:
        self._placement = placement

    def placement(self) -> Placement:
        return self._placement

    def __call__(self, batch: Any) -> Any:
        return batch


def plain(batch: Any) -> Any:
    return batch


def test_no_transform_and_a_plain_callable_run_in_the_loop() -> None:
    for transform in (None, plain, lambda b: b):
        for pipeline in ("map", "stream", "iterable"):
            placed = place(transform, pipeline)  # type: ignore[arg-type]
            assert placed.runs == "loop" and not placed.by_pipeline
            assert placed.key is None and placed.wrap is None


def test_workers_placement_runs_in_map_workers_and_on_the_stream_stage() -> None:
    t = Declared(Placement("workers"))
    assert isinstance(t, Transform)
    assert place(t, "map").runs == "workers"
    assert place(t, "map").key is None  # nothing per sample asked for: no key column added
    stream = place(t, "stream")
    assert stream.runs == "stage" and stream.key == "__index__"  # a stream names failed samples by it
    assert place(t, "iterable").runs == "loop"  # no position to key a sample by


def test_small_decoded_samples_and_reads_placement_run_in_the_stream_reads() -> None:
    small = Declared(Placement("workers", column="png", key="__key__", decoded_row_bytes=READ_DECODE_MAX_BYTES))
    big = Declared(Placement("workers", decoded_row_bytes=READ_DECODE_MAX_BYTES + 1))
    reads = Declared(Placement("reads"))
    assert place(small, "stream").runs == "reads"
    assert place(small, "stream").key == "__key__" and place(small, "stream").column == "png"
    assert place(big, "stream").runs == "stage"
    assert place(reads, "stream").runs == "reads"
    assert place(reads, "map").runs == "workers"  # the fetch is a map-style dataset's read


def test_wrap_applies_to_a_stream_only() -> None:
    def wrap(source: Any) -> Any:
        return source

    t = Declared(Placement("loop", column="text", wrap=wrap))
    assert place(t, "stream").runs == "loop" and place(t, "stream").wrap is wrap
    assert place(t, "map").wrap is None


def test_naiad_decoders_declare_through_the_protocol() -> None:
    pytest.importorskip("PIL")
    images = naiad.decode_images("jpg", size=16, crop="center", mode="L")
    assert isinstance(images, Transform)
    assert images.placement() == Placement("workers", column="jpg", key="__index__", decoded_row_bytes=256)
    assert place(images, "stream").runs == "reads"
    assert place(naiad.decode_images("jpg"), "stream").runs == "stage"  # each image its own size
    for name in ("runs_in_workers", "decoded_row_bytes"):
        assert not hasattr(images, name)


def test_tokenize_declares_the_loop_and_wraps_the_source() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<|endoftext|>": 0, "a": 1, "[UNK]": 2}
    tokenize = naiad.tokenize(tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]")), seq_len=8)
    placed = place(tokenize, "stream")
    assert placed.runs == "loop" and placed.wrap == tokenize.read_tokenized
    assert not hasattr(tokenize, "wrap_source")


def test_placement_checks_its_values() -> None:
    with pytest.raises(naiad.ConfigError, match="`runs` must be one of"):
        Placement("gpu")  # type: ignore[arg-type]
    with pytest.raises(naiad.ConfigError, match="`decoded_row_bytes` must be an int >= 1"):
        Placement("workers", decoded_row_bytes=0)
    with pytest.raises(naiad.ConfigError, match="`column` must be a column name"):
        Placement("workers", column=3)  # type: ignore[arg-type]
    with pytest.raises(naiad.ConfigError, match="must return a naiad.Placement"):
        place(Declared("workers"), "map")  # type: ignore[arg-type]


def test_the_old_attributes_still_place_with_a_deprecation_warning() -> None:
    class Legacy:
        runs_in_workers = True
        key = "__index__"
        decoded_row_bytes = 16

        def __call__(self, batch: Any) -> Any:
            return batch

    with pytest.warns(DeprecationWarning, match="placement"):
        placed = place(Legacy(), "stream")
    assert placed.runs == "reads" and placed.key == "__index__" and placed.decoded_row_bytes == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        place(plain, "map")  # a plain callable warns nothing


def test_batch_uniforms_are_each_samples_own_whatever_batch_it_is_in() -> None:
    import numpy as np

    from naiad.media.keys import batch_uniforms

    together = batch_uniforms({"__index__": np.array([5, 9, 2]), "__epoch__": 1}, 4, seed=7)
    alone = batch_uniforms({"__index__": np.array([9]), "__epoch__": 1}, 4, seed=7)
    assert together.shape == (3, 4) and ((0 <= together) & (together < 1)).all()
    assert np.array_equal(together[1], alone[0])  # the sample's own draws, not its batch's
    assert not np.array_equal(together, batch_uniforms({"__index__": np.array([5, 9, 2]), "__epoch__": 2}, 4, seed=7))
    assert not np.array_equal(together, batch_uniforms({"__index__": np.array([5, 9, 2]), "__epoch__": 1}, 4, seed=8))


def test_a_composed_placement_is_its_members() -> None:
    from naiad.transforms import Compose, Placement

    class Reads:
        def __init__(self, size: int | None = None, key: str | None = None) -> None:
            self.size, self.key = size, key

        def placement(self) -> Placement:
            return Placement("reads", column="x", key=self.key, decoded_row_bytes=self.size)

        def __call__(self, batch: object) -> object:
            return batch

    both = Compose([Reads(key="k"), Reads(size=12)]).placement()
    assert (both.runs, both.column, both.key, both.decoded_row_bytes) == ("reads", "x", "k", 12)
    assert Compose([Reads(), naiad.decode_images("x")]).placement().runs == "workers"
    assert Compose([naiad.decode_images("x"), Reads()]).placement().runs == "workers"
    assert Compose([naiad.to_tuple("x"), Reads()]).placement().runs == "loop"
