"""The header walk (NOTE [ Header walk ] in tarwalk.py): it reads tars written by ``tarfile`` in
each format, by ``webdataset`` and by the ``tar`` command as ``tarfile`` reads them, without
``tarfile``; on anything else (a global pax header, damage anywhere) it steps aside and the
result, or the error, is ``tarfile``'s."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from naiad.errors import SourceError
from naiad.sources import tarwalk


def members_of(fmt: int) -> list[tuple[str, bytes, bytes]]:
    """Members as a shard may hold them: names past 100 bytes (a ustar prefix, a GNU long name or
    a pax path), non-ASCII names, a folder, links, empty and multi-block files, metadata."""
    out = [("__meta__", b"{}", tarfile.REGTYPE), ("a.jpg", b"x" * 700, tarfile.REGTYPE), ("a.cls", b"1", tarfile.REGTYPE),
           ("dir", b"", tarfile.DIRTYPE), ("link", b"", tarfile.SYMTYPE), ("hard", b"", tarfile.LNKTYPE),
           ("p" * 90 + "/" + "q" * 60 + ".png", b"z" * 1025, tarfile.REGTYPE), ("empty.txt", b"", tarfile.REGTYPE),
           ("é/ü.txt", b"ok", tarfile.REGTYPE)]
    if fmt != tarfile.USTAR_FORMAT:  # ustar has no room for a 131-byte base name
        out.append(("d" * 130 + "/b.cls", b"22", tarfile.REGTYPE))
    return out


def write(fmt: int, members: list[tuple[str, bytes, bytes]], mtime: float = 1234567890.5) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type, info.mtime = kind, mtime  # a fractional time: a pax header before each member
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "a.jpg"
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return out.getvalue()


def outcome(walk: Any, data: bytes) -> Any:
    try:
        return walk(io.BytesIO(data), len(data), "s.tar")
    except SourceError as exc:
        return ("error", str(exc))


@pytest.fixture()
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many walks stepped aside to tarfile."""
    count: list[int] = []
    real = tarwalk.walk_with_tarfile

    def counted(*args: Any) -> Any:
        count.append(1)
        return real(*args)

    monkeypatch.setattr(tarwalk, "walk_with_tarfile", counted)
    return count


def reference(data: bytes) -> Any:
    return outcome(tarwalk.walk_with_tarfile, data)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tars_of_every_format_walk_as_tarfile_walks_them_without_it(fmt: int, fallbacks: list[int]) -> None:
    data = write(fmt, members_of(fmt))
    expected = reference(data)
    fallbacks.clear()
    assert outcome(tarwalk.walk_members, data) == expected
    assert not fallbacks
    members, end = expected
    assert [m.name for m in members if m.regular][:3] == ["__meta__", "a.jpg", "a.cls"] and data[end:end + 512] == bytes(512)


def test_a_member_bigger_than_the_window_is_skipped_by_a_seek(fallbacks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tarwalk, "WINDOW_BYTES", 4096)
    data = write(tarfile.PAX_FORMAT, [("big.bin", bytes(range(256)) * 100, tarfile.REGTYPE), ("b.cls", b"7", tarfile.REGTYPE)])
    expected = reference(data)
    fallbacks.clear()
    assert outcome(tarwalk.walk_members, data) == expected and not fallbacks


def test_webdataset_shards_walk_without_tarfile(tmp_path: Path, fallbacks: list[int]) -> None:
    wds = pytest.importorskip("webdataset", reason="pip install 'naiad[test]'")
    with wds.TarWriter(str(tmp_path / "s.tar")) as sink:
        for k in range(5):
            sink.write({"__key__": f"dir/s{k}", "jpg": bytes([k]) * (300 * k), "cls": k, "json": {"k": k}})
    data = (tmp_path / "s.tar").read_bytes()
    expected = reference(data)
    fallbacks.clear()
    assert outcome(tarwalk.walk_members, data) == expected and not fallbacks
    assert [m.name for m in expected[0]][:3] == ["dir/s0.cls", "dir/s0.jpg", "dir/s0.json"]


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command")
def test_a_shard_written_by_the_tar_command_walks_without_tarfile(tmp_path: Path, fallbacks: list[int]) -> None:
    files = tmp_path / "files"
    deep = files / ("long-folder-name-" * 8) / "x"
    deep.mkdir(parents=True)
    for k in range(4):
        (deep / f"s{k}.jpg").write_bytes(b"j" * (k * 600))
        (deep / f"s{k}.cls").write_text(str(k))
    shard = tmp_path / "by-tar.tar"
    subprocess.run(["tar", "-cf", str(shard), "-C", str(files), "."], check=True)
    data = shard.read_bytes()
    expected = reference(data)
    fallbacks.clear()
    assert outcome(tarwalk.walk_members, data) == expected and not fallbacks
    assert sum(m.regular for m in expected[0]) == 8


def test_a_global_pax_header_steps_aside_to_tarfile(fallbacks: list[int]) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    fallbacks.clear()
    got = outcome(tarwalk.walk_members, out.getvalue())
    assert fallbacks and got == reference(out.getvalue()) and [m.name for m in got[0]] == ["a.jpg"]


def test_damaged_and_cut_tars_give_what_tarfile_gives() -> None:
    # Every cut, and random damage to headers (with and without a checksum that still adds up),
    # reads as tarfile reads it: the same members, or the same error.
    data = write(tarfile.PAX_FORMAT, members_of(tarfile.PAX_FORMAT))
    members, _ = reference(data)
    heads = sorted({m.offset for m in members} | {m.offset_data - 512 for m in members})
    cases = [data[:cut] for cut in range(0, len(data), 97)]
    rng = np.random.default_rng(0)
    for _ in range(400):
        damaged = bytearray(data)
        at = int(rng.choice(heads)) + int(rng.integers(0, 512))
        damaged[at] = int(rng.integers(0, 256))
        if rng.random() < 0.5:  # the checksum made right again: only the field itself is wrong
            h = at - at % 512  # the header damaged
            block = damaged[h:h + 512]
            block[148:156] = b" " * 8
            damaged[h + 148:h + 156] = b"%06o\0 " % sum(block)
        cases.append(bytes(damaged))
    # Number fields tarfile reads in its own way: spaces inside, a base prefix, text after a NUL.
    h = heads[2]
    for mode in (b"06 44\0\0\0", b"0o644\0\0\0", b"  644  \0", b"0644\0abc", b"\0" * 8, b"0644 \x1c\0\0"):
        damaged = bytearray(data)
        damaged[h + 100:h + 108] = mode
        block = damaged[h:h + 512]
        block[148:156] = b" " * 8
        damaged[h + 148:h + 156] = b"%06o\0 " % sum(block)
        cases.append(bytes(damaged))
    for case in cases:
        assert outcome(tarwalk.walk_members, case) == reference(case)


def test_the_plain_headers_check_agrees_with_the_full_check_on_mutated_headers() -> None:
    # NOTE [ Header walk ]: headers written the plain way are checked by one regex and summed
    # checksums; anything else goes to the full check. Both must answer alike on any header.
    seen: list[bytes] = []
    full = tarwalk._headers_ok_any

    def keep(blocks: bytes) -> bool:  # the headers the walk checks, as it checks them
        seen.append(blocks)
        return full(blocks)

    data = write(tarfile.PAX_FORMAT, members_of(tarfile.PAX_FORMAT))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tarwalk, "_headers_ok", keep)
        tarwalk.walk_members(io.BytesIO(data), len(data), "t.tar")
    (blocks,) = seen
    heads = [blocks[k:k + 512] for k in range(0, len(blocks), 512)][:6]
    blocks = b"".join(heads)
    assert tarwalk._PLAIN_NUMBERS.fullmatch(blocks) is not None  # the plain way is what is tested
    assert tarwalk._headers_ok(blocks) and tarwalk._headers_ok_any(blocks)
    rng = np.random.default_rng(0)
    answers = set()
    fields = [range(lo, hi) for lo, hi in tarwalk._NUMBERS]
    for _ in range(600):
        raw = bytearray(blocks)
        for _ in range(int(rng.integers(1, 4))):
            h = int(rng.integers(0, len(heads)))
            at = h * 512 + int(rng.choice(list(fields[int(rng.integers(0, len(fields)))])))
            raw[at] = int(rng.choice([0x00, 0x20, 0x30, 0x37, 0x38, 0x41, int(rng.integers(0, 256))]))
        if rng.random() < 0.3:  # a checksum field written again to fit the bytes as they are now
            h = int(rng.integers(0, len(heads)))
            head = bytearray(raw[h * 512:(h + 1) * 512])
            head[148:156] = b" " * 8
            head[148:156] = b"%06o\x00 " % sum(head)
            raw[h * 512:(h + 1) * 512] = head
        answer = tarwalk._headers_ok_any(bytes(raw))
        assert tarwalk._headers_ok(bytes(raw)) == answer, bytes(raw)
        answers.add(answer)
    assert answers == {True, False}  # both answers were met
