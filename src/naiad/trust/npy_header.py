"""The header of an ``.npy`` array (a file, a kept index's member, a token file), read without
Python's parser.

NOTE [ npy headers without ast ]
An ``.npy`` header is a Python dict literal (``{'descr': '<f4', 'fortran_order': False, 'shape':
(10, 3), }``), which NumPy reads with ``ast.literal_eval``. Up to Python 3.11.7 the parser's
depth counter is one per interpreter (CPython gh-106905): a parse in one thread beside a parse
in another raises ``SystemError: AST constructor recursion depth mismatch`` in either, and naiad
opens these files in worker and read-ahead threads while the training thread may parse too
(pytest importing a module, a compiler reading source). A lock among naiad's own threads could
not cover the training thread's parses; this reader uses no parser state at all. It reads the
literals NumPy's writer produces (strings, integers with Python 2's ``L`` suffix, booleans,
``None``, tuples, lists, dicts), nested at most :data:`MAX_DEPTH` deep, in at most
:data:`MAX_HEADER` characters (NumPy's own bound), and checks what NumPy checks; the dtype is
NumPy's (``descr_to_dtype``), given only types spelled as NumPy's writer spells them (``<f4``,
``|S7``, ``<M8[ns]``): NumPy reads any other string as its comma form (``f4,(2,3)i2``), whose
shapes it parses with ``ast.literal_eval`` too.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Protocol

import numpy as np

__all__ = ["MAX_DEPTH", "MAX_HEADER", "parse_literal", "read_npy_header"]

MAX_HEADER = 10_000
"""The longest header read, in characters: NumPy's default ``max_header_size``."""

MAX_DEPTH = 16
"""How deep a header's literals may nest (a structured dtype of structured fields nests a few)."""

_MAGIC = b"\x93NUMPY"
_VERSIONS = {(1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf8")}
_KEYS = {"descr", "fortran_order", "shape"}

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<punct>[{}()\[\],:])
      | [uU]?(?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
      | (?P<int>[-+]?(?:0+|[1-9][0-9]*))[lL]?(?![\w.])
      | (?P<name>True|False|None)(?!\w)
    )""",
    re.VERBOSE | re.ASCII | re.DOTALL,
)
# The escapes ``repr`` of a string writes (a header's strings are dtype codes and field names).
_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[\\'\"ntr])", re.ASCII)
_SIMPLE = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_NAMES = {"True": True, "False": False, "None": None}


def _unescape(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group()[1:]
        return _SIMPLE[code] if code in _SIMPLE else chr(int(code[1:], 16))

    out = _ESCAPE.sub(one, body)
    if "\\" in _ESCAPE.sub("", body):
        raise ValueError(f"an escape in the string {body!r} that headers never hold")
    return out


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    at, end = 0, len(text.rstrip())
    while at < end:
        m = _TOKEN.match(text, at)
        if m is None:
            raise ValueError(f"cannot read the header at character {at}: {text[at:at + 20]!r}")
        at = m.end()
        if m.group("punct"):
            out.append(("punct", m.group("punct")))
        elif m.group("str") is not None:
            out.append(("value", _unescape(m.group("str")[1:-1])))
        elif m.group("int") is not None:
            out.append(("value", int(m.group("int"))))
        else:
            out.append(("value", _NAMES[m.group("name")]))
    return out


def parse_literal(text: str) -> Any:
    """The Python literal ``text`` holds, of the kinds an ``.npy`` header holds; ValueError for
    anything else (an expression, a float, a set, nesting past :data:`MAX_DEPTH`)."""
    tokens = _tokens(text)
    pos = 0

    def take() -> tuple[str, Any]:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("the header ends inside a literal")
        pos += 1
        return tokens[pos - 1]

    def items(close: str, depth: int) -> tuple[list[Any], bool]:
        """The values up to ``close``, and whether a comma followed the last one."""
        nonlocal pos
        out: list[Any] = []
        comma = False
        while True:
            if pos < len(tokens) and tokens[pos] == ("punct", close):
                pos += 1
                return out, comma
            out.append(value(depth))
            kind, tok = take()
            if tok == close and kind == "punct":
                return out, False
            if (kind, tok) != ("punct", ","):
                raise ValueError(f"expected ',' or {close!r} in the header, found {tok!r}")
            comma = True

    def value(depth: int) -> Any:
        nonlocal pos
        if depth > MAX_DEPTH:
            raise ValueError(f"the header nests deeper than {MAX_DEPTH}")
        kind, tok = take()
        if kind == "value":
            return tok
        if tok == "[":
            return items("]", depth + 1)[0]
        if tok == "(":
            vals, comma = items(")", depth + 1)
            return vals[0] if len(vals) == 1 and not comma else tuple(vals)
        if tok == "{":
            out: dict[Any, Any] = {}
            while True:
                if pos < len(tokens) and tokens[pos] == ("punct", "}"):
                    pos += 1
                    return out
                key = value(depth + 1)
                if not isinstance(key, (str, int)) or take() != ("punct", ":"):
                    raise ValueError("a header dict's entry is not 'key': value")
                out[key] = value(depth + 1)
                kind, tok = take()
                if (kind, tok) == ("punct", "}"):
                    return out
                if (kind, tok) != ("punct", ","):
                    raise ValueError(f"expected ',' or '}}' in the header, found {tok!r}")
        raise ValueError(f"unexpected {tok!r} in the header")

    result = value(0)
    if pos != len(tokens):
        raise ValueError(f"the header goes on after its literal: {tokens[pos][1]!r}")
    return result


class Readable(Protocol):
    """What the header is read from: a file or a buffer, at the array's first byte."""

    def read(self, n: int, /) -> bytes: ...


# A type as NumPy's writer spells it (``dtype.str``): byte order, kind, size, a time unit. NumPy
# reads other strings as its comma form ("f4,(2,3)i2"), through ast.literal_eval: never given.
_TYPE = re.compile(r"[<>|=]?[A-Za-z][0-9]*(?:\[[0-9]*[A-Za-z]+\])?", re.ASCII)


def _descr_problem(descr: Any, depth: int) -> str | None:
    """What makes ``descr`` other than a descr NumPy's writer writes (``dtype.str``, or a list of
    ``(name, descr[, shape])`` fields), or None."""
    if depth > MAX_DEPTH:
        return "nested too deep"
    if isinstance(descr, str):
        return None if _TYPE.fullmatch(descr) else f"{descr!r} is not a type"
    if isinstance(descr, tuple) and len(descr) == 2 and isinstance(descr[1], tuple):  # (type, shape)
        return _descr_problem(descr[0], depth + 1) or _shape_problem(descr[1])
    if not isinstance(descr, list):
        return "neither a type nor a list of fields"
    for field in descr:
        if not isinstance(field, tuple) or len(field) not in (2, 3):
            return f"a field {field!r} is not (name, type[, shape])"
        name = field[0]
        if not (isinstance(name, str) or (isinstance(name, tuple) and len(name) == 2
                                          and all(isinstance(n, str) for n in name))):
            return f"a field's name {name!r} is not a string or (title, name)"
        problem = _descr_problem(field[1], depth + 1) or (_shape_problem(field[2]) if len(field) == 3 else None)
        if problem:
            return problem
    return None


def _shape_problem(shape: Any) -> str | None:
    if isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape):
        return None
    return f"{shape!r} is not a shape"


def _read(f: Readable, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError(f"the file ends inside its {what} ({len(data)} of {n} bytes)")
    return data


def read_npy_header(f: Readable) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Read the magic string and header of the ``.npy`` array at ``f``'s position: its shape,
    whether it is in Fortran order, and its dtype, with ``f`` left at the array's first byte.
    ValueError says what is wrong with a damaged or hostile header (never more than
    :data:`MAX_HEADER` characters are read, and no Python parser runs: NOTE [ npy headers
    without ast ])."""
    magic = _read(f, 8, "magic string")
    if magic[:6] != _MAGIC:
        raise ValueError(f"no .npy magic string (the file starts {magic[:6]!r})")
    version = (magic[6], magic[7])
    if version not in _VERSIONS:
        raise ValueError(f"an .npy of version {version[0]}.{version[1]}, which NumPy never wrote")
    length_format, encoding = _VERSIONS[version]
    (length,) = struct.unpack(length_format, _read(f, struct.calcsize(length_format), "header length"))
    if length > MAX_HEADER * (4 if encoding == "utf8" else 1):
        raise ValueError(f"a header of {length:,} bytes, longer than any array's ({MAX_HEADER:,} characters)")
    text = _read(f, length, "header").decode(encoding)  # UnicodeDecodeError is a ValueError
    if len(text) > MAX_HEADER:
        raise ValueError(f"a header of {len(text):,} characters, longer than any array's ({MAX_HEADER:,})")
    d = parse_literal(text)
    if not isinstance(d, dict) or d.keys() != _KEYS:
        raise ValueError(f"the header is not a dict of {sorted(_KEYS)}: {text.strip()[:200]!r}")
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"the header's shape is not a tuple of sizes: {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"the header's fortran_order is not a bool: {fortran!r}")
    problem = _descr_problem(d["descr"], 0)
    if problem:
        raise ValueError(f"the header's descr is not a dtype: {d['descr']!r} ({problem})")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
        raise ValueError(f"the header's descr is not a dtype: {d['descr']!r} ({exc})") from None
    return shape, fortran, dtype
