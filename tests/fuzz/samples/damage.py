"""The damage every kind of case shares: a few drawn bytes, one of the reader fuzzers' mutations
(``tests.fuzz.formats.mutate``) at a drawn place, a number field of a header set, an ``.npy``
under another header; and a case's file written.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Literal, NamedTuple

from tests.fuzz.formats import MUTATIONS, NASTY, mutate
from tests.fuzz.samples.rules import Pick


def write_file(path: str, data: bytes) -> str:
    """``data`` written to ``path``; the path."""
    with open(path, "wb") as f:
        f.write(data)
    return path


def drawn_bytes(pick: Pick) -> bytes:
    """A few bytes: one of the reader fuzzers' nasty ones, or 1 to 8 drawn at random."""
    return pick.choice(NASTY) if pick.random() < 0.6 else bytes(pick.randrange(0, 256) for _ in range(pick.randrange(1, 9)))


def mutated(pick: Pick, data: bytes, reach: float = 1.0) -> tuple[bytes, str]:
    """``data`` damaged by a drawn mutation at a drawn relative position (in its first ``reach``)
    with drawn bytes; and what was done."""
    kind, pos, payload = pick.choice(MUTATIONS), pick.random() * reach, drawn_bytes(pick)
    return mutate(data, kind, pos, payload), f"{kind} at {pos:.3f} with {payload!r}"


class Field(NamedTuple):
    """A number field of a file: its name, offset, width in bytes and byte order."""

    name: str
    offset: int
    width: int
    order: Literal["big", "little"] = "big"


def set_number(data: bytes, field: Field, value: int) -> bytes:
    """``data`` with ``field`` holding ``value`` (wrapped to the field's width)."""
    raw = (value % (1 << (8 * field.width))).to_bytes(field.width, field.order)
    return data[:field.offset] + raw + data[field.offset + field.width:]


def damaged_fields(pick: Pick, data: bytes, fields: Sequence[Field], values: Sequence[int], what: str) -> tuple[bytes, str]:
    """``data`` with one or two of ``fields`` set, mostly to one of ``values``, else to a drawn
    32-bit number; and ``what`` followed by what was done."""
    for _ in range(pick.randrange(1, 3)):
        field = pick.choice(fields)
        value = pick.choice(values) if pick.random() < 0.8 else pick.randrange(0, 1 << 32)
        data, what = set_number(data, field, value), f"{what} {field.name}={value}"
    return data, what


def npy_with_header(header: str, body: bytes, version: int = 1) -> bytes:
    """An ``.npy`` of ``body`` under another header (padded as NumPy pads it), of ``version``."""
    text = header.encode("latin-1") + b" "
    text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
    if version == 1 and len(text) < 65_536:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body
    return b"\x93NUMPY" + bytes((version, 0)) + struct.pack("<I", len(text)) + text + body
