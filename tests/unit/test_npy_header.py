"""naiad's .npy header reader (NOTE [ npy headers without ast ] in naiad/trust/npy_header.py)
against NumPy's own: the same shape, order, dtype and data offset for every kind of array NumPy
writes, the same literal as ``ast.literal_eval`` for whatever it accepts, and a ValueError
naming the problem for what no writer produces."""

from __future__ import annotations

import ast
import io
import re
import struct
import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from naiad.trust.npy_header import MAX_DEPTH, MAX_HEADER, parse_literal, read_npy_header

DTYPES = [
    np.dtype("<f4"), np.dtype(">i8"), np.dtype("u1"), np.dtype("?"), np.dtype("c16"), np.dtype("U5"),
    np.dtype("S7"), np.dtype("M8[ns]"), np.dtype("m8[s]"), np.dtype("V3"),
    np.dtype([("a", "<i4"), ("b", "<f8", (2, 3))]),
    np.dtype([("x", [("y", "u1"), ("z", "S3")])]),
    np.dtype({"names": ["a", "b"], "formats": ["i4", "f4"], "offsets": [0, 8], "itemsize": 16}),
    np.dtype([(("a title", "named"), "i2")]),
    np.dtype([("名前", "i4")]),  # a name past latin-1: NumPy writes format 3.0 (UTF-8)
    np.dtype([("q'\"\\\n", "i4")]),  # quotes, a backslash and a newline in a field name
]


def numpy_header(raw: bytes) -> tuple[tuple[tuple[int, ...], bool, np.dtype], int]:
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if version == (1, 0):
            got = np.lib.format.read_array_header_1_0(f)
        else:  # 3.0 differs from 2.0 only in the header's encoding, which the reader takes from the file
            from numpy.lib import _format_impl
            got = _format_impl._read_array_header(f, version)
    return got, f.tell()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4)])
@pytest.mark.parametrize("fortran", [False, True])
def test_every_array_numpy_writes_reads_as_numpy_reads_it(dtype: np.dtype, shape: tuple[int, ...], fortran: bool) -> None:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Stored array in format 3.0"
        np.save(buf, np.zeros(shape, dtype, order="F" if fortran else "C"))
    raw = buf.getvalue()
    f = io.BytesIO(raw)
    got = read_npy_header(f)
    assert (got, f.tell()) == numpy_header(raw)


def _header(text: str, version: tuple[int, int] = (1, 0)) -> bytes:
    body = text.encode("utf8" if version == (3, 0) else "latin1")
    length = struct.pack("<H" if version == (1, 0) else "<I", len(body))
    return b"\x93NUMPY" + bytes(version) + length + body


def test_python_2_headers_with_long_integers_read() -> None:
    raw = _header("{'descr': '<i8', 'fortran_order': False, 'shape': (10L, 3L), }\n")
    assert read_npy_header(io.BytesIO(raw)) == ((10, 3), False, np.dtype("<i8"))


@pytest.mark.parametrize(("raw", "problem"), [
    (b"PK\x03\x04" + bytes(20), "no .npy magic string"),
    (b"\x93NUMPY", "ends inside its magic string"),
    (b"\x93NUMPY\x07\x00" + bytes(4), "version 7.0"),
    (b"\x93NUMPY\x01\x00\x50\x00{'descr'", "ends inside its header"),
    (b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 31), "a header of 2,147,483,648 bytes"),
    (_header("[1, 2]"), "not a dict of"),
    (_header("{'descr': '<f4', 'shape': (3,)}"), "not a dict of"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"), "not a dict of"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}"), "shape is not a tuple of sizes"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': [3]}"), "shape is not a tuple of sizes"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}"), "shape is not a tuple of sizes"),
    (_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}"), "fortran_order is not a bool"),
    (_header("{'descr': '<q9', 'fortran_order': False, 'shape': (3,)}"), "descr is not a dtype"),
    (_header("{'descr': None, 'fortran_order': False, 'shape': (3,)}"), "descr is not a dtype"),
    # NumPy reads a string with a comma as its comma form, through ast.literal_eval
    (_header("{'descr': 'f4,(2,3)i2', 'fortran_order': False, 'shape': (3,)}"), "is not a type"),
    (_header("{'descr': '<)72e,u<f4', 'fortran_order': False, 'shape': (3,)}"), "is not a type"),
    (_header("{'descr': [('a', 'f4,i2')], 'fortran_order': False, 'shape': (3,)}"), "is not a type"),
    (_header("{'descr': [('a', '<f4', 3)], 'fortran_order': False, 'shape': (3,)}"), "is not a shape"),
    (_header("{'descr': [('a',)], 'fortran_order': False, 'shape': (3,)}"), "is not (name, type[, shape])"),
    (_header("{'descr': __import__('os').system('x'), 'fortran_order': False, 'shape': (3,)}"), "cannot read the header"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} {}"), "goes on after its literal"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}"), "cannot read the header"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 40 + ")" * 40 + "}"), "nests deeper"),
    (_header("{'descr': '<f\\q4', 'fortran_order': False, 'shape': (3,)}"), "an escape"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,"), "ends inside a literal"),
    (_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}".ljust(MAX_HEADER + 1)), "longer than any array's"),
    (b"\x93NUMPY\x01\x00\x04\x00\xff\xfe\xfd\xfc", "cannot read the header"),  # latin-1 reads any byte
    (b"\x93NUMPY\x03\x00\x04\x00\x00\x00\xff\xfe\xfd\xfc", "utf-8"),
])
def test_a_damaged_or_hostile_header_is_a_value_error_that_says_what(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        read_npy_header(io.BytesIO(raw))
    assert problem in str(info.value), str(info.value)


# The literals a header holds: strings, integers, booleans, None, in tuples, lists and dicts.
_atoms = st.one_of(st.text(max_size=8), st.integers(-(2**70), 2**70), st.booleans(), st.none())
literals = st.recursive(
    _atoms,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(literals)
def test_every_literal_of_a_header_kind_reads_as_python_reads_it(value: object) -> None:
    text = repr(value)
    if text.count("(") + text.count("[") + text.count("{") > MAX_DEPTH:
        return
    assert parse_literal(text) == ast.literal_eval(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="{}()[],:'\"\\ 0123456789-+uTrueFalsNonxab\n", max_size=40))
@example("(1)")
@example("'a' 'b'")
@example("u'\\x41'")
@example("01")
def test_what_the_reader_accepts_python_reads_alike(text: str) -> None:
    assume(not re.search(r"[0-9][lL]", text))  # Python 2's long suffix: read, but not Python 3's
    try:
        got = parse_literal(text)
    except ValueError:
        return  # refusing what a writer never writes is allowed; reading it otherwise is not
    assert got == ast.literal_eval(text.strip())  # white space around the literal is passed over


def _saved(dtype: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype))
    return buf.getvalue()


SEEDS = [_saved("<f4", (3, 2)), _saved("<i8", (5,)), _saved("f4,u1,(2,3)i2", (2,))]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(SEEDS), st.integers(0, 200), st.binary(min_size=1, max_size=12),
       st.sampled_from(["overwrite", "insert", "cut"]))
def test_a_damaged_header_reads_or_is_a_value_error(seed: bytes, at: int, payload: bytes, how: str) -> None:
    # Kept indexes and token files treat a ValueError as "refuse this file": nothing else may
    # escape; and nothing, NumPy's dtype parser included, may run Python's parser.
    if how == "overwrite":
        raw = seed[:at] + payload + seed[at + len(payload):]
    elif how == "insert":
        raw = seed[:at] + payload + seed[at:]
    else:
        raw = seed[:at]
    try:
        with mock.patch("ast.parse", side_effect=AssertionError("Python's parser ran")):
            shape, fortran, dtype = read_npy_header(io.BytesIO(raw))
    except ValueError:
        return
    assert isinstance(fortran, bool) and all(type(n) is int and n >= 0 for n in shape)
    assert isinstance(dtype, np.dtype)
