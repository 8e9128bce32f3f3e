"""A source's columns: the user's ``dtypes`` as PyArrow types, Arrow tables as NumPy columns,
and the checks that a file's columns and values fit the source's schema.

NOTE [ Ragged columns ]
A column whose rows are lists of numbers of any length (Arrow ``list`` or ``large_list`` of
integers, floats or bools: a tokenizer's ``input_ids`` and ``attention_mask`` in a Hugging Face
dataset, a JSON array per line) reaches the batch as a list of 1-D tensors, one per row, of the
column's own dtype: what ``datasets``' torch format gives, ready for ``pad_sequence`` or
``torch.nested``. torch's ``default_collate`` refuses rows of unequal length, and a list of Python
lists cost a Python int per value: 15 µs a row of 136 tokens, against 0.75 µs for Arrow's own
conversion into an object array of NumPy views of the block's values (``to_numpy``), which is how
the column travels through the reads, the shuffle buffer and a process worker's pipe. A batch's
rows are copied once into one tensor and split into views of it (``batching.ragged_tensors``): a
batch owns its values, and no row is a Python loop in the training process.

A row NumPy cannot hold that way is a bad row, as a null in an integer column is: a null row, or a
missing integer or bool inside one (``missing_values``; a missing float is NaN), raised naming
the file, row and column, or skipped with ``on_bad_rows="skip"``. Lists of anything else
(strings, structs, lists of lists) stay Python lists.

The default shuffle buffer counts such rows at the first file's bytes per row
(``Source.sample_bytes``; Parquet's footer counts a ragged column's values), not at a schema
width that cannot know them: 131,072 rows of 8,192 token ids would hold 4 GiB. While any row of a
block is in the buffer, the views keep the block's values alive, so the buffer can hold more than
its own rows' bytes; Python lists held more still (a 200,000-row file of 16-256 int32 ids per
row, shuffled whole: a peak RSS of 713 MB against 1,641 MB, bench/RESULTS.md "Tokenized rows").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from naiad.errors import ConfigError, SourceError

__all__ = [
    "Columns",
    "DTypes",
    "apply_dtypes",
    "as_array",
    "cast_to_schema",
    "check_columns_present",
    "concat_columns",
    "field_shape",
    "is_pixel_field",
    "is_ragged_numeric",
    "missing_columns",
    "missing_reason",
    "missing_values",
    "null_column",
    "null_rows",
    "numpy_dtype",
    "pixel_array",
    "resolve_dtypes",
    "row_bytes",
    "select_columns",
    "table_to_columns",
    "to_arrow_type",
]


DTypes: TypeAlias = Union[Mapping[str, Any], str, np.dtype, pa.DataType, None]  # noqa: UP007
"""Column types: a mapping column -> dtype, or one dtype for every numeric column."""


Columns = dict[str, np.ndarray | list[Any]]
"""One chunk of rows: column name -> NumPy array (numeric, bool) or list (strings, others)."""


def resolve_dtypes(dtypes: DTypes, names: Sequence[str]) -> dict[str, pa.DataType] | pa.DataType | None:
    """Turn the user's ``dtypes`` into PyArrow types (a per-column dict or one numeric type)."""
    if dtypes is None:
        return None
    if isinstance(dtypes, Mapping):
        unknown = [c for c in dtypes if c not in names]
        if unknown:
            raise ConfigError(
                f"`dtypes` names unknown column(s) {unknown}; the columns are {list(names)}."
            )
        return {c: to_arrow_type(t) for c, t in dtypes.items()}
    return to_arrow_type(dtypes)


def to_arrow_type(dtype: Any) -> pa.DataType:
    """A PyArrow type from a NumPy dtype, a name ("float32", "str") or a PyArrow type."""
    if isinstance(dtype, pa.DataType):
        return dtype
    if dtype in ("str", "string", str):
        return pa.string()
    try:
        return pa.from_numpy_dtype(np.dtype(dtype))
    except (TypeError, pa.ArrowNotImplementedError) as exc:
        raise ConfigError(f"`dtypes` has an unsupported type {dtype!r}: {exc}") from None


def apply_dtypes(schema: pa.Schema, dtypes: dict[str, pa.DataType] | pa.DataType | None) -> pa.Schema:
    """The schema after ``dtypes``: per-column types, or one type for every numeric column."""
    if dtypes is None:
        return schema
    fields = []
    for f in schema:
        if isinstance(dtypes, dict):
            t = dtypes.get(f.name, f.type)
        elif pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type):
            t = dtypes
        else:
            t = f.type
        fields.append(pa.field(f.name, t))
    return pa.schema(fields)


def select_columns(schema: pa.Schema, columns: Sequence[str] | None, path: str) -> pa.Schema:
    """Keep ``columns`` (in the file's order) or all; a name not in the file is a SourceError."""
    if columns is None:
        return schema
    names = schema.names
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise SourceError(
            f"unknown column(s) {unknown} in `columns`; the file has {names}.", path=path,
            column=unknown[0],
        )
    wanted = set(columns)
    return pa.schema([f for f in schema if f.name in wanted])


SHAPE_KEY = b"naiad.shape"
"""A fixed-width field's metadata key: its values' shape per row, as JSON (``[1, 28, 28]``), on a
fixed-size list of numbers or on a ``fixed_size_binary`` column of uint8 pixels."""


def _declared_shape(field: pa.Field, width: int) -> tuple[int, ...] | None:
    """The field's ``naiad.shape`` where it is a list of positive ints whose product is
    ``width``; else None (no metadata, or metadata that does not fit the column)."""
    raw = (field.metadata or {}).get(SHAPE_KEY)
    if raw is None:
        return None
    try:
        shape = tuple(int(n) for n in json.loads(raw))
    except (ValueError, TypeError):
        return None
    if shape and all(n > 0 for n in shape) and math.prod(shape) == width:
        return shape
    return None


def is_pixel_field(field: pa.Field) -> bool:
    """Whether ``field`` is a ``fixed_size_binary`` column of uint8 values with a ``naiad.shape``
    that fits its byte width (``naiad convert --decode`` pixels): read as a uint8 array."""
    return bool(pa.types.is_fixed_size_binary(field.type)
                and _declared_shape(field, field.type.byte_width) is not None)


def _is_numeric_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_fixed_size_list(t) and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)))


def is_ragged_numeric(t: pa.DataType) -> bool:
    """Whether ``t`` is a list of numbers of any length per row (a tokenizer's ``input_ids``):
    a batch holds such a column as a list of 1-D tensors (NOTE [ Ragged columns ])."""
    return bool((pa.types.is_list(t) or pa.types.is_large_list(t))
                and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
                     or pa.types.is_boolean(t.value_type)))


def field_shape(field: pa.Field) -> tuple[int, ...]:
    """The shape one row of a fixed-width column has in a batch: the ``naiad.shape`` in the
    field's metadata when it agrees with the width (``naiad convert`` writes it for ``.npy``
    arrays of several axes and for ``--decode`` pixels), else ``(width,)`` (a fixed-size list's
    values, a ``fixed_size_binary``'s bytes), else ``()`` for a column of scalars."""
    t = field.type
    if pa.types.is_fixed_size_list(t):
        width = t.list_size
    elif pa.types.is_fixed_size_binary(t):
        width = t.byte_width
    else:
        return ()
    return _declared_shape(field, width) or (width,)


def numpy_dtype(field: pa.Field) -> np.dtype | None:
    """The NumPy dtype the column ``field`` becomes in a batch, or None where it becomes a list
    or an object array (strings, bytes, nested values)."""
    t = field.type
    dt: np.dtype  # pyarrow is unannotated: to_pandas_dtype() gives a NumPy scalar type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        dt = np.dtype(t.to_pandas_dtype())
        return dt
    if _is_numeric_list(t):
        dt = np.dtype(t.value_type.to_pandas_dtype())
        return dt
    if is_pixel_field(field):
        return np.dtype(np.uint8)
    return None


def _pixels(col: pa.FixedSizeBinaryArray, shape: tuple[int, ...]) -> np.ndarray:
    """A ``fixed_size_binary`` column's bytes as uint8 ``(rows, *shape)``: a view of the Arrow
    buffer from the array's offset (a slice's rows only), no copy and no loop per row. Null
    rows (no image) become zeros, in a copy."""
    width = math.prod(shape)
    data = col.buffers()[1]
    rows = len(col)
    if data is None or rows == 0:
        return np.zeros((0, *shape), np.uint8)
    out = np.frombuffer(data, np.uint8, count=rows * width, offset=col.offset * width).reshape(rows, *shape)
    if col.null_count:
        out = out.copy()
        out[col.is_null().to_numpy(zero_copy_only=False)] = 0
    return out


def pixel_array(pixels: np.ndarray, field: pa.Field) -> pa.FixedSizeBinaryArray:
    """uint8 pixels ``(rows, *shape)`` as the ``fixed_size_binary`` column ``field`` (a pixel
    field, :func:`is_pixel_field`): each row's bytes, one buffer for the whole column."""
    flat = np.ascontiguousarray(pixels, np.uint8)
    return pa.FixedSizeBinaryArray.from_buffers(field.type, len(flat), [None, pa.py_buffer(flat)])


def table_to_columns(table: pa.Table | pa.RecordBatch) -> Columns:
    """Columns as NumPy arrays (numeric, bool, fixed-size lists, pixels; bytes as object arrays)
    or lists (everything else). A fixed-size list column is one ``(rows, width)`` array, or
    ``(rows, *shape)`` with a ``naiad.shape`` in its field's metadata (:func:`field_shape`); a
    ``fixed_size_binary`` column with a ``naiad.shape`` that fits its width (``naiad convert
    --decode`` pixels, :func:`is_pixel_field`) is one uint8 ``(rows, *shape)`` array.

    Nulls in float columns become NaN, in pixel columns zeros; integer and bool columns must have
    none (the caller checks, because only it knows the file and line).
    """
    out: Columns = {}
    for field, col in zip(table.schema, table.columns):
        name, t = field.name, col.type
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            out[name] = col.to_numpy(zero_copy_only=False)
        elif _is_numeric_list(t):
            # e.g. an embedding column: one (rows, width) array, not a list of lists.
            flat = col.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(col), *field_shape(field))
        elif is_pixel_field(field):
            # Parquet decodes a fixed-size list value by value (a repetition level each), a
            # fixed_size_binary as one block of bytes: pixels are stored so, and read as uint8.
            out[name] = _pixels(col, field_shape(field))
        elif is_ragged_numeric(t) and missing_values(col) is None:
            # NOTE [ Ragged columns ]: each row a NumPy view of the block's values, made by
            # Arrow in C (20x faster than a list of Python ints, a tenth of its memory).
            out[name] = col.to_numpy(zero_copy_only=False)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            # Bytes (an image, a clip): an object array of ``bytes``, filled by Arrow in C; it
            # travels through the shuffle buffer as one and reaches the batch as a list.
            out[name] = col.to_numpy(zero_copy_only=False)
        else:
            out[name] = col.to_pylist()
    return out


def row_bytes(schema: pa.Schema) -> int:
    """About how many bytes a row of ``schema`` takes as NumPy columns (32 for a string or other
    Python value)."""
    total = 0
    for f in schema:
        dt = numpy_dtype(f)
        total += dt.itemsize * max(1, math.prod(field_shape(f))) if dt is not None else 32
    return total


def missing_values(col: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A mask of the rows of ``col`` that NumPy cannot hold, or None where there are none: a null
    in an integer or bool column (NumPy integers have no NaN), and in a ragged column of numbers
    (NOTE [ Ragged columns ]) a null row, or a null integer or bool inside one (a null float is NaN)."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
    if not is_ragged_numeric(t):
        return None
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    values = col.flatten()  # the slice's values, less the null rows'
    inner = bool(values.null_count) and not pa.types.is_floating(t.value_type)
    if not col.null_count and not inner:
        return None
    mask = np.array(col.is_null().to_numpy(zero_copy_only=False))
    if inner:
        parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
        mask[parents[values.is_null().to_numpy(zero_copy_only=False)]] = True
    return mask


def missing_reason(name: str, t: pa.DataType, fix: str = "NumPy integers have no NaN") -> str:
    """Why a row :func:`missing_values` marks in column ``name`` of type ``t`` is bad (``fix``:
    what the words say of an integer column's)."""
    if is_ragged_numeric(t):
        return f"missing value in list column {name!r} (a row of numbers must be a list, with no missing integer in it)"
    return f"missing value in integer column {name!r} ({fix})"


def missing_columns(table: pa.Table) -> np.ndarray:
    """Each row's first column with a value NumPy cannot hold (:func:`missing_values`), or ""."""
    names = np.full(table.num_rows, "", object)
    for name, column in zip(table.column_names, table.columns):
        m = missing_values(column)
        if m is not None:
            names[m & (names == "")] = name
    return names


def null_rows(table: pa.Table) -> np.ndarray:
    """Row indices with a value NumPy cannot hold in any column (:func:`missing_values`)."""
    mask: np.ndarray | None = None
    for col in table.columns:
        m = missing_values(col)
        if m is not None:
            mask = m if mask is None else (mask | m)
    return np.zeros(0, np.int64) if mask is None else np.flatnonzero(mask)


def as_array(values: Any) -> np.ndarray:
    """A column as a NumPy array: lists (strings, nested values) become 1-D object arrays."""
    if isinstance(values, np.ndarray):
        return values
    return np.fromiter(values, dtype=object, count=len(values))


def concat_columns(pieces: Sequence[Mapping[str, np.ndarray | list[Any]]]) -> Columns:
    """Chunks of the same columns, one after another."""
    out: Columns = {}
    for name in pieces[0]:
        cols = [p[name] for p in pieces]
        if isinstance(cols[0], np.ndarray):
            out[name] = np.concatenate(cols)
        else:
            out[name] = [v for c in cols for v in c]
    return out


def null_column(table: pa.Table) -> str:
    """The first column with a value NumPy cannot hold (:func:`missing_values`)."""
    for name, col in zip(table.column_names, table.columns):
        if missing_values(col) is not None:
            return str(name)
    return ""


def check_columns_present(names: Sequence[str], present: Sequence[str], path: str, first_path: str) -> None:
    """A SourceError when ``path`` lacks a column the source's schema (from ``first_path``) has."""
    missing = [n for n in names if n not in present]
    if missing:
        raise SourceError(f"column(s) {missing} missing (present in {first_path}).", path=path, column=missing[0])


def cast_to_schema(table: pa.Table, schema: pa.Schema, part: str, path: str) -> pa.Table:
    """``table`` with ``schema``'s columns and types, or a SourceError naming the file and ``part``."""
    if table.schema == schema:
        return table
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise SourceError(f"cannot convert {part} to {schema}: {exc}", path=path) from None
