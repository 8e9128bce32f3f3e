"""CSV type inference: PyArrow's own inference first, the number patterns only on text columns.

The reference is the slower rule it replaced: every column read as text and matched against the
number patterns, PyArrow inferring the columns that are not numbers; except that a column PyArrow
reads as numbers or booleans keeps PyArrow's type (the old rule called ``+3`` or a 20-digit
number an integer, and the block parse then failed on every such value; and it called
``true, 0, 0`` integers with one bad value, where PyArrow reads every value as a boolean). Both
must give the same types on any sample, bad rows and odd values included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from naiad import sources
from naiad.errors import SourceError
from naiad.sources.csv import _numeric_types, _skip_row

VALUES = {
    "int": st.integers(-10**12, 10**12).map(str),
    "float": st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    "word": st.sampled_from(["x", "abc", "n/a", "true", "false", "2020-01-02", "1.5.2", "oops"]),
    "null": st.sampled_from(["", "NA", "null", "NaN", "None", "<NA>"]),
    "odd": st.sampled_from([" 7", "7 ", "+3", "-0", ".5", "1e5", "1E-3", "inf", "-Infinity", "nan", "0x10", "1_0"]),
}


def reference_types(sample: bytes, names: list[str]) -> pa.Schema:
    """Every column matched against the number patterns; PyArrow infers the others."""
    read = pacsv.ReadOptions(column_names=names)
    parse = pacsv.ParseOptions(invalid_row_handler=_skip_row)
    as_text = pacsv.read_csv(pa.py_buffer(sample), read_options=read, parse_options=parse,
                             convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))
    numeric = _numeric_types(list(zip(names, as_text.columns, strict=True)))
    others = pacsv.read_csv(pa.py_buffer(sample), read_options=read, parse_options=parse,
                            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in numeric})).schema
    own = pacsv.read_csv(pa.py_buffer(sample), read_options=read, parse_options=parse).schema
    numeric.update((f.name, f.type) for f in own
                   if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type))
    return pa.schema([pa.field(f.name, pa.string() if pa.types.is_null(numeric.get(f.name, f.type))
                               else numeric.get(f.name, f.type)) for f in others])


@st.composite
def samples(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    ncols = draw(st.integers(1, 4))
    kinds = [draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=3)) for _ in range(ncols)]
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 19)) == 0:  # a row with the wrong number of fields
            rows.append([draw(VALUES["int"]) for _ in range(ncols + draw(st.sampled_from([-1, 1])) or 1)])
        else:
            rows.append([draw(VALUES[draw(st.sampled_from(k))]) for k in kinds])
    return [f"c{i}" for i in range(ncols)], rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sample=samples())
@example(sample=(["c0", "c1", "c2"], [["true", "0.0", "0.0"], *[["0", "0"]] * 21, *[["0", "0.0", "0.0"]] * 2]))
def test_inferred_types_match_matching_every_column(tmp_path: Path, sample: tuple[list[str], list[list[str]]]) -> None:
    names, rows = sample
    body = "".join(",".join(r) + "\n" for r in rows)
    path = tmp_path / "s.csv"
    path.write_text(",".join(names) + "\n" + body)
    try:
        want = reference_types(body.encode(), names)
    except pa.ArrowException:
        return  # the reference cannot read it either: the source reports it when read
    assert sources.read_csv(str(path)).schema() == want


def test_a_few_bad_values_leave_a_column_numeric_and_are_reported_when_read(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b,c\n" + "".join(f"{i},{i * 0.5},{'oops' if i == 7 else i}\n" for i in range(50)))
    src = sources.read_csv(str(path), on_bad_rows="skip")
    assert [str(t) for t in src.schema().types] == ["int64", "double", "int64"]
    cols = src.read_block(src.blocks()[0]).columns
    assert len(cols["a"]) == 49 and 7 not in cols["a"].tolist()
    strict = sources.read_csv(str(path))
    with pytest.raises(SourceError, match=r"d\.csv.*line 9"):
        strict.read_block(strict.blocks()[0])


def test_numbers_pyarrow_reads_only_as_floats_are_floats_and_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b\n" + "".join(f"+{i},{i}{'0' * 19}\n" for i in range(20)))
    src = sources.read_csv(str(path))
    assert [str(t) for t in src.schema().types] == ["double", "double"]
    cols = src.read_block(src.blocks()[0]).columns
    assert cols["a"].tolist() == [float(i) for i in range(20)] and cols["b"][3] == 3e19


def test_text_columns_stay_text_and_empty_ones_are_text(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b,c,d\n" + "".join(f"{i},x{i},,{i % 2 == 0}\n" for i in range(20)))
    src = sources.read_csv(str(path))
    assert [str(t) for t in src.schema().types] == ["int64", "string", "string", "bool"]
    assert np.array_equal(src.read_block(src.blocks()[0]).columns["a"], np.arange(20))
