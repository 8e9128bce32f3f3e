"""Pixel columns: ``fixed_size_binary`` with a ``naiad.shape`` (what ``naiad convert --decode``
writes) read as uint8 ``(rows, *shape)`` arrays, in files written by hand with PyArrow; the
metadata that does not fit falls back to bytes; and the fixed-size lists earlier versions wrote
still read as pixels."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch

import naiad
from naiad.sources.columns import (
    field_shape,
    is_pixel_field,
    numpy_dtype,
    pixel_array,
    row_bytes,
    table_to_columns,
)

SHAPE = (3, 4, 5)
WIDTH = 60


def images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, *SHAPE), dtype=np.uint8)


def pixel_field(shape: object = SHAPE, width: int = WIDTH) -> pa.Field:
    return pa.field("image", pa.binary(width), metadata={b"naiad.shape": json.dumps(shape).encode()})


def pixel_table(pixels: np.ndarray, field: pa.Field | None = None) -> pa.Table:
    field = field or pixel_field()
    column = pa.array([p.tobytes() for p in pixels], field.type)  # as any writer would, row by row
    return pa.table([column, pa.array(np.arange(len(pixels)))], schema=pa.schema([field, pa.field("label", pa.int64())]))


def read_all(source: naiad.sources.Source) -> dict[str, np.ndarray]:
    parts = [source.read_block(b).columns for b in source.blocks()]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_hand_written_fixed_size_binary_file_with_a_shape_reads_as_uint8_pixels(tmp_path, suffix):
    pixels = images(50)
    path = str(tmp_path / f"px.{suffix}")
    if suffix == "parquet":
        pq.write_table(pixel_table(pixels), path, row_group_size=16)
    else:
        feather.write_feather(pixel_table(pixels), path, chunksize=16)
    source = naiad.read(path)
    cols = read_all(source)
    assert cols["image"].dtype == np.uint8 and cols["image"].shape == (50, *SHAPE)
    np.testing.assert_array_equal(cols["image"], pixels)
    empty = source.empty_columns()["image"]
    assert empty.dtype == np.uint8 and empty.shape == (0, *SHAPE)
    # Through the shuffle buffer and the batches: a uint8 tensor per batch, each row once.
    batches = list(naiad.DataLoader(source, batch_size=8, shuffle=True, seed=3))
    assert all(b["image"].dtype == torch.uint8 and b["image"].shape[1:] == SHAPE for b in batches)
    labels = torch.cat([b["label"] for b in batches])
    assert sorted(labels.tolist()) == list(range(50)) and labels.tolist() != list(range(50))
    np.testing.assert_array_equal(torch.cat([b["image"] for b in batches]).numpy(), pixels[labels.numpy()])


def test_a_slice_reads_its_own_rows_from_the_buffer():
    pixels = images(10)
    table = pixel_table(pixels)
    for lo, n in [(3, 4), (9, 1), (0, 10), (5, 0)]:
        got = table_to_columns(table.slice(lo, n))["image"]
        assert got.shape == (n, *SHAPE)
        np.testing.assert_array_equal(got, pixels[lo:lo + n])
    chunked = pa.concat_tables([table.slice(0, 4), table.slice(4)])  # two chunks
    np.testing.assert_array_equal(table_to_columns(chunked)["image"], pixels)


def test_a_null_image_reads_as_zeros():
    pixels = images(4)
    column = pa.array([pixels[0].tobytes(), None, pixels[2].tobytes(), None], pa.binary(WIDTH))
    table = pa.table([column], schema=pa.schema([pixel_field()]))
    got = table_to_columns(table.slice(1))["image"]
    assert got.shape == (3, *SHAPE)
    assert not got[0].any() and not got[2].any()
    np.testing.assert_array_equal(got[1], pixels[2])


@pytest.mark.parametrize("shape", [[3, 4, 4], [0, 60], [-3, -20], "not json", {"a": 1}, []])
def test_a_shape_that_does_not_fit_the_width_leaves_the_column_bytes(tmp_path, shape):
    pixels = images(6)
    field = pa.field("image", pa.binary(WIDTH), metadata={
        b"naiad.shape": shape.encode() if isinstance(shape, str) else json.dumps(shape).encode()})
    path = str(tmp_path / "bad.parquet")
    pq.write_table(pixel_table(pixels, field), path)
    source = naiad.read_parquet(path)
    col = read_all(source)["image"]
    assert col.dtype == object and col.tolist() == [p.tobytes() for p in pixels]
    assert source.empty_columns()["image"] == []
    f = source.schema().field("image")
    assert not is_pixel_field(f) and numpy_dtype(f) is None and field_shape(f) == (WIDTH,)


def test_fixed_size_binary_without_a_shape_stays_bytes():
    column = pa.array([b"abcd", b"efgh"], pa.binary(4))
    got = table_to_columns(pa.table({"digest": column}))["digest"]
    assert got.dtype == object and got.tolist() == [b"abcd", b"efgh"]


def test_a_fixed_size_list_of_pixels_as_earlier_versions_wrote_still_reads(tmp_path):
    pixels = images(20)
    field = pa.field("image", pa.list_(pa.uint8(), WIDTH), metadata={
        b"naiad.shape": json.dumps(list(SHAPE)).encode(), b"naiad.layout": b"CHW"})
    column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), WIDTH)
    path = str(tmp_path / "old.parquet")
    pq.write_table(pa.table([column], schema=pa.schema([field])), path, row_group_size=8)
    source = naiad.read_parquet(path)
    np.testing.assert_array_equal(read_all(source)["image"], pixels)
    assert source.empty_columns()["image"].shape == (0, *SHAPE)
    batch = next(iter(naiad.DataLoader(source, batch_size=20)))
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (20, *SHAPE)


def test_row_bytes_counts_a_pixel_row_by_its_width():
    schema = pa.schema([pixel_field(), pa.field("label", pa.int64())])
    assert row_bytes(schema) == WIDTH + 8
    assert row_bytes(pa.schema([pa.field("image", pa.list_(pa.uint8(), WIDTH))])) == WIDTH


def test_pixel_array_is_the_inverse_of_the_read():
    pixels = images(7)
    field = pixel_field()
    array = pixel_array(pixels[::2], field)  # a strided view: copied contiguous
    assert array.type == pa.binary(WIDTH) and array.to_pylist() == [p.tobytes() for p in pixels[::2]]
    table = pa.table([array], schema=pa.schema([field]))
    np.testing.assert_array_equal(table_to_columns(table)["image"], pixels[::2])
