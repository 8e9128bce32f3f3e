"""Tar shards for the sample fuzzers: the seeds (written by ``tarfile`` in ustar, GNU and pax
format, and by ``webdataset.TarWriter``), the damage done to their headers (a field, pax records, a
GNU long name, a cut), the samples ``tarfile`` reads in them (the reference, which borrows nothing
of naiad's), naiad's read of them, and :func:`tar_case`.
"""

from __future__ import annotations

import functools
import io
import os
import re
import tarfile
from collections.abc import Sequence
from typing import Any

import naiad
from naiad.errors import SourceError
from tests.fuzz.formats import assert_named
from tests.fuzz.samples.damage import drawn_bytes, write_file
from tests.fuzz.samples.rules import Pick, settled, within_case_time

TAR_WRITERS = ("ustar", "gnu", "pax", "webdataset")
TAR_NAMES = ("plain", "long", "latin1")
BLOCK = 512
TAR_FIELDS: dict[str, tuple[int, int]] = {
    "name": (0, 100), "mode": (100, 108), "uid": (108, 116), "gid": (116, 124), "size": (124, 136),
    "mtime": (136, 148), "chksum": (148, 156), "type": (156, 157), "linkname": (157, 257), "magic": (257, 263),
    "version": (263, 265), "uname": (265, 297), "gname": (297, 329), "devmajor": (329, 337), "devminor": (337, 345),
    "prefix": (345, 500),
}
NUMBERS = (
    b"0", b"0000000\x00", b"7777777\x00", b"77777777777\x00", b"-1", b" 12 \x00", b"1 2\x00", b"99999999999",
    b"\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x00", b"\x80" + b"\xff" * 11, b"\xff" * 12, b"", b"\x00" * 12,
    b"        ", b"0o777", b"1e9", b"\x00123",
)
NAMES = (
    b"", b"/etc/passwd", b"../up.bin", b"a" * 100, b"caf\xe9.bin", b"k0.bin\x00junk", b"k0", b"__meta__.bin",
    b"K0.BIN", b"x/.bin", b".bin", b"k\xff\xfe.bin", b"k0.bin/", b"./k0.bin", b"dir/sub/k9.bin", b"\x00",
)
TYPES = (b"0", b"\x00", b"1", b"2", b"3", b"5", b"6", b"7", b"x", b"g", b"L", b"K", b"S", b"V", b"M", b"A", b"\xff")
PAX_RECORDS = (
    ("path", "k0.bin"), ("path", ""), ("path", "/abs.bin"), ("path", "k\udce9.bin"), ("path", "k7.bin/"),
    ("size", "0"), ("size", "-5"), ("size", "99999999999999999999"), ("size", "nan"), ("size", "3"),
    ("mtime", "nan"), ("mtime", "1e400"), ("uid", "-1"), ("hdrcharset", "BINARY"), ("GNU.sparse.major", "1"),
    ("GNU.sparse.size", "4096"), ("linkpath", "/etc/passwd"), ("comment", "x" * 2000),
)
RAW_PAX = (b"99999 path=x\n", b"0 path=\n", b"5 a=b\n", b"12 path=k0\n", b"x", b"18 path=\xff\xfe.bin\n", b"\n" * 40,
           b"30 path=k0.bin\n" + b"\x00" * 20, b"9" * 40 + b" path=k\n")
LONG_NAMES = (b"", b"k0.bin", b"d" * 5000 + b".bin", b"no-nul" * 20, b"caf\xe9/k0.bin", b"\x00" * 600, b"k0.bin\x00" * 3)
_EXTENDED = (b"x", b"g", b"L", b"K")


def member_bytes(shard: int, sample: int) -> bytes:
    """A member's bytes, unique to its shard and sample (a read from elsewhere would show)."""
    return f"s{shard}-k{sample}|".encode() * (20 + 13 * sample)


@functools.cache
def tar_shard(writer: str, names: str = "plain", shard: int = 0, samples: int = 6) -> bytes:
    """A valid shard of ``samples`` samples, each a ``.bin`` and a ``.cls`` member, written by
    ``writer`` (``tarfile`` in ustar, GNU or pax format, or ``webdataset.TarWriter``); ``names``:
    "plain", "long" (past 100 bytes: ustar's prefix, GNU's long-name blocks, pax records) or
    "latin1" (not UTF-8, as a tar made on a Latin-1 system names its members)."""
    def key(i: int) -> str:
        return {"long": f"{'deep/' * 22}sample-{i:04d}", "latin1": f"caf\udce9-{i}"}.get(names, f"sample-{i:04d}")

    buf = io.BytesIO()
    if writer == "webdataset":
        import webdataset

        with webdataset.TarWriter(buf, mtime=1_700_000_000.5) as sink:
            for i in range(samples):
                sink.write({"__key__": key(i), "bin": member_bytes(shard, i), "cls": i})
        return buf.getvalue()
    fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}[writer]
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tar:
        for i in range(samples):
            for ext, data in (("bin", member_bytes(shard, i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key(i)}.{ext}")
                info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _number(field: bytes) -> int:
    """A tar number field as tarfile reads it (octal, or base-256), 0 where it reads none."""
    if field[:1] in (b"\x80", b"\xff"):
        return int.from_bytes(field[1:], "big", signed=field[:1] == b"\xff")
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return 0


def tar_headers(data: bytes) -> list[int]:
    """The offsets of the headers (extended ones included) a lenient walk finds, in order."""
    out, offset = [], 0
    while offset + BLOCK <= len(data) and any(data[offset:offset + BLOCK]) and len(out) < 10_000:
        out.append(offset)
        h = data[offset:offset + BLOCK]
        skip = h[156:157] in (b"0", b"\0", b"7", *_EXTENDED)
        offset += BLOCK + (-(-max(_number(h[124:136]), 0) // BLOCK) * BLOCK if skip else 0)
    return out


def checksummed(block: bytes) -> bytes:
    """A header block with its checksum made right again (so damage reaches past the check)."""
    block = block[:148] + b" " * 8 + block[156:]
    return block[:148] + b"%06o\x00 " % (sum(block) & 0o777777) + block[156:]


def set_field(data: bytes, header: int, field: str, value: bytes, fix: bool = True) -> bytes:
    """``data`` with the ``field`` of the header at offset ``header`` set to ``value`` (cut or
    NUL-padded to the field's width), its checksum made right again if ``fix``."""
    lo, hi = TAR_FIELDS[field]
    block = data[header:header + BLOCK]
    block = block[:lo] + value[:hi - lo].ljust(hi - lo, b"\0") + block[hi:]
    if fix and field != "chksum":
        block = checksummed(block)
    return data[:header] + block + data[header + BLOCK:]


def size_field(size: int) -> bytes:
    """``size`` as tarfile writes it: octal, or base-256 past 11 octal digits."""
    return b"%011o\x00" % size if 0 <= size < 8**11 else b"\x80" + (size % 2**88).to_bytes(11, "big")


def replace_extension(data: bytes, kind: bytes, payload: bytes, nth: int = 0) -> bytes | None:
    """``data`` with its ``nth`` extended header of type ``kind`` (``x``: pax records, ``L``: a
    GNU long name) holding ``payload`` instead, its size and checksum set to fit; None when the
    shard has no such header."""
    found = [h for h in tar_headers(data) if data[h + 156:h + 157] == kind]
    if not found:
        return None
    h = found[nth % len(found)]
    old = -(-_number(data[h + 124:h + 136]) // BLOCK) * BLOCK
    head = set_field(data[h:h + BLOCK], 0, "size", size_field(len(payload)))
    return data[:h] + head + payload.ljust(-(-len(payload) // BLOCK) * BLOCK, b"\0") + data[h + BLOCK + old:]


def pax_record(keyword: str, value: str) -> bytes:
    """One pax record with its length right (as ``tarfile`` writes it)."""
    body = b" " + keyword.encode() + b"=" + value.encode("utf-8", "surrogateescape") + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


# webdataset.tariterators.base_plus_ext, written out here so the reference borrows nothing of naiad's.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


Reference = list[tuple[str, "bytes | None", bool]]
"""The samples of a shard as ``tarfile`` reads them: (key, member bytes or None where tarfile
cannot extract them, whether the sample may also be left out)."""


def reference_samples(data: bytes, ext: str = "bin") -> Reference | None:
    """The samples with one ``ext`` member as ``tarfile`` reads the shard (``extractfile``) and
    WebDataset groups its members (regular files, ``__*__`` names skipped; a sample with two
    members of one extension left out, as ``on_bad_rows="skip"`` leaves it). A sparse member
    (its bytes stored as runs, not where its header points) is read right or left out as bad.
    None where ``tarfile`` fails or a member runs past the end of the file (naiad must raise)."""
    groups: list[tuple[str, dict[str, tuple[bytes | None, bool]], list[str]]] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                if info.offset_data + info.size > len(data):
                    return None
                name = info.name
                if not info.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")):
                    continue
                m = _KEY_EXT.match(name)
                if m is None or re.match(r"__[^/]*__($|/)", name):
                    continue
                key, e = m.group(1), m.group(2).lower()
                if not groups or groups[-1][0] != key:
                    groups.append((key, {}, []))
                groups[-1][2].append(e)
                if e not in groups[-1][1]:
                    groups[-1][1][e] = (_extracted(tar, info), info.sparse is not None)
    except (tarfile.TarError, EOFError, ValueError, OverflowError, MemoryError, UnicodeError):
        return None
    return [(k, *m[ext]) for k, m, seen in groups if ext in m and len(seen) == len(set(seen))]


def _extracted(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes | None:
    try:
        f = tar.extractfile(info)
        return None if f is None else f.read()
    except (tarfile.TarError, EOFError, ValueError, OSError):
        return None


def same_samples(got: list[tuple[str, bytes]], expected: Reference) -> bool:
    """Whether naiad read the samples ``expected`` (:func:`reference_samples`), in order: each
    with tarfile's bytes, but those that may be left out (a sparse member's) or must be (one
    tarfile cannot extract)."""
    i = 0
    for key, value, optional in expected:
        if i < len(got) and got[i][0] == key and value is not None and got[i][1] == value:
            i += 1
        elif not (optional or value is None):
            return False
    return i == len(got)


def read_shards(paths: Sequence[str], *, index_dir: Any = False, num_workers: int = 0) -> list[tuple[str, bytes]] | None:
    """Every sample of the shards as ``[(key, its .bin member)]`` in order, bad samples skipped;
    None when a naiad error named one of the shards. Any other exception, or an error naming none
    of them, fails."""
    try:
        source = naiad.read_webdataset(list(paths), extensions=["bin"], on_bad_rows="skip", index_dir=index_dir)
        loader = naiad.DataLoader(source, batch_size=4, num_workers=num_workers, worker_mode="process",
                                  timeout=60 if num_workers else 0)
        return [(k, v) for batch in loader for k, v in zip(batch["__key__"], batch["bin"], strict=True)]
    except SourceError as exc:
        assert_named(exc, *paths)
        return None


def damaged_shard(pick: Pick) -> tuple[bytes, str]:
    """A seed shard damaged in one of its headers (a field, with or without its checksum made
    right; pax records; a GNU long name) or cut short; and what was done."""
    writer, names = pick.choice(TAR_WRITERS), pick.choice(TAR_NAMES)
    data = tar_shard(writer, names)
    how = pick.choice(("field", "field", "size", "pax", "raw pax", "long name", "cut"))
    what = f"{writer} shard, {names} names: {how}"
    heads = tar_headers(data)
    if how == "field":
        h, field, fix = pick.choice(heads), pick.choice(sorted(TAR_FIELDS)), pick.random() < 0.8
        pool = {"name": NAMES, "prefix": NAMES, "linkname": NAMES, "type": TYPES}.get(field, NUMBERS)
        value = pick.choice(pool) if pick.random() < 0.8 else drawn_bytes(pick)
        return set_field(data, h, field, value, fix), f"{what} {field}={value!r} at {h} (checksum fixed: {fix})"
    if how == "size":
        h = pick.choice(heads)
        n = _number(data[h + 124:h + 136]) + pick.choice((-513, -512, -1, 1, 511, 512, 513, 4096, 10**6, 2**33, 2**36, 2**70))
        return set_field(data, h, "size", size_field(n)), f"{what} size {n} at {h}"
    if how in ("pax", "raw pax", "long name"):
        if how == "pax":
            payload = b"".join(pax_record(*pick.choice(PAX_RECORDS)) for _ in range(pick.randrange(1, 4)))
        else:
            payload = pick.choice(RAW_PAX if how == "raw pax" else LONG_NAMES)
        new = replace_extension(data, b"L" if how == "long name" else b"x", payload, pick.randrange(0, 24))
        if new is not None:
            return new, f"{what} {payload[:80]!r}"
    at = pick.randrange(0, len(data))
    return data[:at], f"{what} cut at {at} of {len(data)}"


def tar_case(pick: Pick, folder: str, *, kept: bool = False, workers: bool = False) -> None:
    """A damaged shard read gives what ``tarfile`` reads in it, or a SourceError naming it; read
    again with a kept index (``kept``: made, then used) and by 2 process workers (``workers``),
    the same."""
    data, what = damaged_shard(pick)
    path = write_file(os.path.join(folder, "s.tar"), data)
    with within_case_time(what):
        got = read_shards([path])
        expected = reference_samples(data)
        assert got is None or (expected is not None and same_samples(got, expected)), f"{what}: other samples than tarfile's"
        if kept:
            index = os.path.join(folder, "index")
            assert read_shards([path], index_dir=index) == got, f"{what}: the first read with an index folder differs"
            assert read_shards([path], index_dir=index) == got, f"{what}: the read with the kept index differs"
        if workers:
            from tests.helpers import child_pids, shm_entries

            pids, shm = child_pids(), shm_entries()
            assert read_shards([path], num_workers=2) == got, f"{what}: 2 process workers read otherwise"
            settled(pids, shm)

