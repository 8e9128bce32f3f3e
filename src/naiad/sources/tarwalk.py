"""The walk over a tar shard's headers: every member's name, header offset, data offset and size.

NOTE [ Header walk ]
A member index (NOTE [ Member index ] in tarindex.py) is made by walking the shard's headers
from the start, once per shard. Python's ``tarfile`` does it right for every tar dialect, but
spends about 50 us per header (a ``TarInfo`` with every field decoded, each number parsed
through ``str``), and ``webdataset.TarWriter`` writes a pax header before every member (its
fractional modification time), so a shard of 10 samples of two members is 40 headers: 1 ms a
shard, a second for a thousand shards before the first batch.

:func:`walk_members` reads the headers itself, in the forms tar writers use for plain files:
ustar and GNU headers, a pax extended header (``x``: ``path``, ``size``) or a GNU long name
(``L``) before a member, ustar's name prefix. It reads a shard through a window of
``WINDOW_BYTES`` (a small shard in one read), takes from each header only what the index needs
(type, name, size), and checks every header's checksum and number fields as ``tarfile`` does
once the walk ends, all headers at once (``_headers_ok``: one regex where every number field is
written the plain way, octal digits and a NUL, and the checksums summed in NumPy, 50 us for 40
headers; else the full check, 150 us). It is strict: anything else (a global pax header, sparse
files, base-256 numbers, ``hdrcharset``, a bad checksum, a number field ``tarfile`` would
read differently, a member past the end of the file, no zero block where the walk ends) makes
it give up, and :func:`walk_members` walks the shard again with ``tarfile``, whose reading (and
errors) are the reference. So the fast walk can only ever agree with ``tarfile`` or step aside;
tests/unit/test_tar_walk.py checks that it agrees on tars written by ``tarfile`` in each format,
by ``webdataset`` and by the ``tar`` command, and that it steps aside on damaged ones.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from naiad.errors import SourceError

__all__ = ["Member", "WINDOW_BYTES", "walk_members", "walk_with_tarfile"]

WINDOW_BYTES = 1 << 20
"""How much of a shard one read brings in for the walk (a shard this small in one read)."""

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # tarfile.REGULAR_TYPES without sparse files (the walk steps aside)
_SUPPORTED = (b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7")  # tarfile.SUPPORTED_TYPES, builtin
# The number fields tarfile reads (and checks) in every header: mode, uid, gid, size, mtime,
# checksum, devmajor, devminor.
_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))
_CHECKSUM = 5
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_ENCODING = tarfile.ENCODING


class Member(NamedTuple):
    """One member of a tar as the walk sees it.

    Attributes:
        name: its name, as ``tarfile`` gives it (long names and pax paths applied).
        offset: its first header's offset (a pax or long-name header's, where it has one).
        offset_data: its data's offset.
        size: its data's size.
        regular: whether it is a regular file (what a sample is made of).
    """

    name: str
    offset: int
    offset_data: int
    size: int
    regular: bool


class _GiveUp(Exception):
    """The fast walk meets what only tarfile reads right (NOTE [ Header walk ])."""


def walk_members(f: io.BufferedIOBase, size: int, path: str) -> tuple[list[Member], int]:
    """Every member of the tar ``f`` (``size`` bytes) in order, and the offset where the walk
    ended (its end-of-archive marker), fast where the headers are plain, else by ``tarfile``
    (NOTE [ Header walk ]).

    Raises:
        SourceError: naming ``path``: not a tar, a member past the end of the file, or a shard
            cut short or damaged (no end-of-archive marker where the members end).
    """
    capped = _Capped(f, size)
    try:
        return _fast_walk(_Window(capped, size).read, size)
    except _GiveUp:
        return walk_with_tarfile(capped, size, path)


def walk_with_tarfile(f: io.BufferedIOBase | _Capped, size: int, path: str) -> tuple[list[Member], int]:
    """:func:`walk_members` done by ``tarfile``: every dialect, and the reference for errors.
    A member's bytes must lie inside the file and before the next header, and a sparse member
    (stored as runs with holes between them, which a sample's bytes cannot be sliced from) is
    refused."""
    members: list[Member] = []
    data_end = 0  # where the last regular member's bytes end: the next header is not before it
    f = f if isinstance(f, _Capped) else _Capped(f, size)
    try:
        f.seek(0)
        with tarfile.open(fileobj=f, mode="r:") as tar:  # type: ignore[call-overload]
            while True:
                info = tar.next()
                if info is None:
                    break
                tar.members.clear()  # tarfile keeps every member; the index is what is kept
                if info.offset_data + info.size > size:
                    raise SourceError(
                        f"the tar is cut short: member {info.name!r} needs bytes up to "
                        f"{info.offset_data + info.size:,}, the file has {size:,}; is the shard truncated?",
                        path=path)
                if info.offset < data_end:
                    raise SourceError(f"the tar is damaged: the bytes of the member before {info.name!r} run into its "
                                      "header (a size that is not the member's).", path=path)
                if info.sparse is not None or info.type == tarfile.GNUTYPE_SPARSE:
                    raise SourceError(f"member {info.name!r} is a sparse file (stored with holes, as tar -S writes it), "
                                      "which a sample's bytes cannot be read from; write the shard without -S.", path=path)
                if info.isreg():
                    data_end = info.offset_data + info.size
                members.append(Member(info.name, info.offset, info.offset_data, info.size, info.isreg()))
            # tarfile ends quietly at a header it cannot read past the first one: a shard cut
            # inside a header, or a damaged one, ends where the end-of-archive marker (a zero
            # block) should be, and it is checked there.
            f.seek(tar.offset)
            end = f.read(_BLOCK)
            if len(end) < _BLOCK or any(end):
                what = "cut short" if len(end) < _BLOCK else "damaged"
                raise SourceError(f"the tar is {what} at byte {tar.offset:,} of {size:,} (no end-of-archive "
                                  "marker after the last member read); is the shard truncated?", path=path)
            return members, tar.offset
    except (tarfile.TarError, OverflowError, ValueError, UnicodeError) as exc:
        # A header's number can be too large for an offset (OverflowError), or not one at all.
        raise SourceError(f"not a readable tar ({type(exc).__name__}: {str(exc):.200}); is the shard truncated or "
                          "damaged?", path=path) from None


class _Capped:
    """A file whose reads never ask for more than the bytes left in it: a header may say that
    the next 2**62 bytes are its pax records or long name, and a plain ``read(n)`` allocates
    ``n`` bytes before it reads any."""

    def __init__(self, f: io.BufferedIOBase, size: int) -> None:
        self.f = f
        self.size = size

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self.size - self.f.tell())
        return self.f.read(left if n is None or n < 0 else min(n, left))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


class _Window:
    """Reads at offsets of a file through one window of ``WINDOW_BYTES`` (a header walk moves
    forward: small members are all in the window, a big one is skipped with a seek)."""

    def __init__(self, f: io.BufferedIOBase | _Capped, size: int) -> None:
        self.f = f
        self.size = size
        self.lo = 0
        self.buf = b""

    def read(self, offset: int, n: int) -> bytes:
        if not (self.lo <= offset and offset + n <= self.lo + len(self.buf)):
            self.f.seek(offset)
            self.buf = self.f.read(max(n, min(WINDOW_BYTES, self.size - offset)))
            self.lo = offset
        at = offset - self.lo
        return self.buf[at:at + n]


def _size(h: bytes) -> int:
    """A header's size field, read to find the next header (checked with the other number
    fields once the walk ends, by :func:`_headers_ok`)."""
    try:
        return int(h[124:136].split(b"\0", 1)[0] or b"0", 8)
    except ValueError:
        raise _GiveUp from None


# Every number field as tarfile and GNU tar write them: octal digits ending in a NUL (the checksum's
# six and a NUL and a space; device numbers all NUL when unset), for every 512-byte header at once.
_PLAIN_NUMBERS = re.compile(
    rb"(?:.{100}(?:[0-7]{7}\x00){3}[0-7]{11}\x00[0-7]{11}\x00[0-7]{6}\x00 .{173}(?:[0-7]{7}\x00|\x00{8}){2}.{167})*",
    re.S,
)
_CHECKSUM_PLACES = 8 ** np.arange(5, -1, -1, dtype=np.int64)


def _headers_ok(blocks: bytes) -> bool:
    """Whether every header in ``blocks`` has a checksum and number fields that tarfile reads as
    this walk did (:func:`_headers_ok_any`). Headers whose number fields are all written the
    plain way are checked with one regex and their checksums summed together (a third of the
    time, for the shards most writers make); any other answer comes from the full check."""
    if _PLAIN_NUMBERS.fullmatch(blocks) is not None:
        heads = np.frombuffer(blocks, np.uint8).reshape(-1, _BLOCK)
        stored = (heads[:, 148:154].astype(np.int64) - 0x30) @ _CHECKSUM_PLACES
        unsigned = heads.sum(1, dtype=np.int64) - heads[:, 148:156].sum(1, dtype=np.int64) + 256
        if np.array_equal(stored, unsigned):
            return True
    return _headers_ok_any(blocks)


def _headers_ok_any(blocks: bytes) -> bool:
    """Whether every header in ``blocks`` (whole 512-byte headers, one after another) has a
    checksum and number fields that tarfile reads as this walk did: each number field (mode,
    uid, gid, size, mtime, checksum, devmajor, devminor), up to its first NUL, is spaces, octal
    digits, spaces; each checksum is the header's byte sum with its own field as spaces (or the
    signed sum old tars wrote). Checked for all headers at once: a dozen NumPy calls, not eight
    parses a header."""
    heads = np.frombuffer(blocks, np.uint8).reshape(-1, _BLOCK)
    fields = np.zeros((len(heads), len(_NUMBERS), 12), np.uint8)  # NUL-padded to 12: read the same
    for k, (lo, hi) in enumerate(_NUMBERS):
        fields[:, k, :hi - lo] = heads[:, lo:hi]
    nul = fields == 0
    inside = np.arange(12) < np.where(nul.any(2), nul.argmax(2), 12)[..., None]
    digit = (fields >= 0x30) & (fields <= 0x37) & inside
    if np.any(inside & ~digit & (fields != 0x20)):
        return False
    count = digit.sum(2)
    first, last = digit.argmax(2), 11 - digit[..., ::-1].argmax(2)
    if np.any((count > 0) & (count != last - first + 1)):
        return False  # a space between two digits
    place = np.where(digit, last[..., None] - np.arange(12), 0)
    stored = (np.where(digit, fields.astype(np.int64) - 0x30, 0) << (3 * place)).sum(2)[:, _CHECKSUM]
    unsigned = heads[:, :148].sum(1, dtype=np.int64) + heads[:, 156:].sum(1, dtype=np.int64) + 256
    wrong = stored != unsigned
    if wrong.any():
        signed = heads[wrong].view(np.int8)
        return bool(np.all(stored[wrong] == signed[:, :148].sum(1, dtype=np.int64) + signed[:, 156:].sum(1, dtype=np.int64) + 256))
    return True


def _text(raw: bytes) -> str:
    """A name field: up to its first NUL, decoded as tarfile decodes names."""
    return raw.split(b"\0", 1)[0].decode(_ENCODING, "surrogateescape")


def _header(read: Callable[[int, int], bytes], offset: int, heads: list[bytes]) -> tuple[bytes, bytes, int] | None:
    """The header at ``offset`` (kept in ``heads`` for :func:`_headers_ok`): (the block, its
    type, its size), or None at a zero block."""
    h = read(offset, _BLOCK)
    if len(h) < _BLOCK:
        raise _GiveUp  # cut short: tarfile names it
    if h == _ZERO:
        return None
    if h[124] in (0x80, 0xFF):
        raise _GiveUp  # base-256 numbers: a member past 8 GiB
    heads.append(h)
    return h, h[156:157], _size(h)


def _pax_records(data: bytes) -> dict[str, str]:
    """A pax extended header's records, as tarfile parses them (steps aside on what changes how
    a name is decoded or how a member is read: ``hdrcharset``, sparse files)."""
    out: dict[str, str] = {}
    pos = 0
    while True:
        m = _PAX_RECORD.match(data, pos)
        if m is None:
            return out
        length = int(m.group(1))
        if length == 0 or pos + length > len(data):
            raise _GiveUp  # a record past the header's end: tarfile names the damage
        value = data[m.end(2) + 1:m.start(1) + length - 1]
        try:
            keyword, text = m.group(2).decode("utf-8"), value.decode("utf-8")
        except UnicodeDecodeError:
            raise _GiveUp from None
        if keyword == "hdrcharset" or keyword.startswith("GNU.sparse"):
            raise _GiveUp
        out[keyword] = text
        pos += length


def _fast_walk(read: Callable[[int, int], bytes], size: int) -> tuple[list[Member], int]:
    members: list[Member] = []
    heads: list[bytes] = []
    offset = 0
    while True:
        head = _header(read, offset, heads)
        if head is None:
            if heads and not _headers_ok(b"".join(heads)):
                raise _GiveUp  # a header tarfile reads otherwise, or not a header at all
            return members, offset
        first = offset
        long_name: str | None = None
        pax: dict[str, str] = {}
        if head[1] in (b"x", b"L"):
            offset, head, long_name, pax = _extended(read, size, offset, head, heads)
        h, kind, n = head
        if kind not in _SUPPORTED:
            raise _GiveUp  # global pax, sparse, long link names, vendor types: tarfile reads them
        name, kind = _member_name(h, kind, long_name, pax)
        if "size" in pax:
            try:
                n = int(pax["size"])
            except ValueError:
                n = 0
        data = offset + _BLOCK
        regular = kind in _REGULAR
        if data + n > size:
            raise _GiveUp  # cut short: tarfile's walk names the member
        members.append(Member(name, first, data, n, regular))
        offset = data + (_padded(n) if regular else 0)  # tarfile skips the data of regular files only


Header = tuple[bytes, bytes, int]
"""A header block, its type and its size (:func:`_header`)."""


def _extended(read: Callable[[int, int], bytes], size: int, offset: int, head: Header,
              heads: list[bytes]) -> tuple[int, Header, str | None, dict[str, str]]:
    """A pax (``x``) or GNU long name (``L``) header at ``offset`` and the member's header after
    it: (that header's offset, the header, the long name, the pax records)."""
    _, kind, n = head
    # tarfile reads the extension's blocks whole (padding included) and then the member's header.
    padded = _padded(n)
    if offset + _BLOCK + padded > size:
        raise _GiveUp  # an extension past the end of the file: tarfile names the damage
    ext = read(offset + _BLOCK, padded)
    if len(ext) < padded:
        raise _GiveUp
    pax = _pax_records(ext) if kind == b"x" else {}
    long_name = _text(ext) if kind == b"L" else None
    offset += _BLOCK + padded
    member = _header(read, offset, heads)
    if member is None:
        raise _GiveUp  # an extended header with no member: tarfile refuses it
    return offset, member, long_name, pax


def _member_name(h: bytes, kind: bytes, long_name: str | None, pax: dict[str, str]) -> tuple[str, bytes]:
    """A member's name as tarfile gives it (the header's prefix and name, a GNU long name, a pax
    path), and its type (an old-style directory's ``\\0`` with a trailing slash is ``5``)."""
    name = _text(h[0:100])
    if kind == b"\0" and name.endswith("/"):
        kind = b"5"  # an old-style directory
    if kind == b"5":
        name = name.rstrip("/")
    prefix = _text(h[345:500])
    if prefix:
        name = prefix + "/" + name
    if long_name is not None:
        name = long_name.removesuffix("/") if kind == b"5" else long_name
    if "path" in pax:
        name = pax["path"].rstrip("/")
    return name, kind


def _padded(n: int) -> int:
    """``n`` bytes rounded up to whole blocks."""
    return -(-n // _BLOCK) * _BLOCK
