"""The indexes and listings naiad keeps, damaged for the sample fuzzers: tar shards' member indexes
and image folders' listings (``.npz``: their bytes, a member's header, or arrays rewritten by
``np.savez``) and CSV and JSONL block indexes (JSON). Each is made by a first read, damaged, and
read again: the right samples, or (a rewrite that passes every check, docs/SECURITY.md) only the
data's own files. Corpus recipes of such damage are replayed by :func:`replay_kept`.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import naiad
from naiad.errors import SourceError
from tests.fuzz.formats import assert_named
from tests.fuzz.samples.damage import mutated, npy_with_header, write_file
from tests.fuzz.samples.rules import SECRET, Pick, within_case_time
from tests.fuzz.samples.tars import read_shards, tar_shard

ARRAY_DTYPES = ("int32", "uint64", "float64", "bool", "int8", "uint8", "<U4", "S4")
DELTAS = (-1, 1, 2, 7, -300, 300, 512, -512, 2**31, -(2**31), 2**62, -(2**63))
REWRITES = ("add", "set", "dtype", "shape", "empty", "double", "reverse", "drop")
HOSTILE_NAMES = (
    "../secret.png", "/etc/passwd", "cat/../../secret.png", "cat/../dog/d0.png", "dog/d0.png", "cat/c0.png",
    "cat/", "cat", "cat/\x00.png", "cat/" + "x" * 300 + ".png", "", "./cat/c0.png", "cat/./c1.png", "cat//c1.png",
    "cat/missing.png", "cat/sub", "cat/notes.txt", "caf\udce9/c0.png", "cat/c\udcff.png", "../root/cat/c0.png",
)


def npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a kept ``.npz`` that naiad wrote (so NumPy's loader is safe on it)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files}


def npz_bytes(arrays: dict[str, np.ndarray], headers: dict[str, bytes] | None = None) -> bytes:
    """``arrays`` as an ``.npz`` as ``np.savez`` writes one (a consistent archive: the damage is
    in the values), with the ``.npy`` header of each array in ``headers`` replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, a in arrays.items():
            member = io.BytesIO()
            np.save(member, a, allow_pickle=False)
            raw = member.getvalue()
            if headers and name in headers:
                end = raw.index(b"\n") + 1
                raw = headers[name] + raw[end:]
            archive.writestr(name + ".npy", raw)
    return out.getvalue()


def rewrite_array(arrays: dict[str, np.ndarray], name: str, how: str, at: float, value: int) -> dict[str, np.ndarray]:
    """``arrays`` with ``arrays[name]`` changed ``how``: an element (at relative position ``at``)
    shifted by or set to ``value``, another dtype, another shape, emptied, doubled, reversed or
    dropped."""
    out, a = dict(arrays), np.array(arrays[name])
    if how == "drop":
        del out[name]
    elif how in ("add", "set") and a.size and a.dtype.kind in "iuU":
        flat = a.reshape(-1).copy()
        i = min(int(at * a.size), a.size - 1)
        if a.dtype.kind == "U":
            flat[i] = str(value)
        else:
            info = np.iinfo(a.dtype)
            flat[i] = min(max((int(flat[i]) if how == "add" else 0) + value, int(info.min)), int(info.max))
        out[name] = flat.reshape(a.shape)
    elif how == "dtype":
        dt = ARRAY_DTYPES[value % len(ARRAY_DTYPES)]
        try:
            out[name] = a.astype(dt)
        except (ValueError, TypeError, OverflowError):
            out[name] = np.zeros(a.shape, dt)
    elif how == "shape":
        out[name] = a.reshape(1, -1) if value % 2 else a.reshape(-1)[:1].reshape(()) if a.size else a.reshape(0, 1)
    elif how == "empty":
        out[name] = a.reshape(-1)[:0]
    elif how == "double":
        out[name] = np.concatenate([a.reshape(-1), a.reshape(-1)])
    elif how == "reverse":
        out[name] = a.reshape(-1)[::-1].copy().reshape(a.shape)
    return out


def huge_shape_header(a: np.ndarray, value: int) -> bytes:
    """An ``.npy`` header (version 1) for ``a`` that claims a huge or negative shape."""
    shape = {0: "(99999999999,)", 1: "(4611686018427387904, 4)", 2: "(-1,)", 3: "(3, 99999999999)"}[value % 4]
    return npy_with_header(f"{{'descr': '{a.dtype.str}', 'fortran_order': False, 'shape': {shape}, }}", b"")


def damaged_kept_file(pick: Pick, data: bytes, *, listing: bool = False) -> tuple[bytes, str, str]:
    """A kept ``.npz`` damaged: ``("raw", ...)`` its bytes (as a disk or a partial write damages
    them), ``("header", ...)`` a member's header claiming a huge shape, or ``("arrays", ...)``
    rewritten whole by ``np.savez`` with hostile arrays; and what was done."""
    how = pick.choice(("raw", "header", "arrays", "arrays"))
    if how == "raw":
        data, what = mutated(pick, data)
        return data, how, f"bytes: {what}"
    arrays = npz_arrays(data)
    name = pick.choice(sorted(arrays))
    if how == "header":
        value = pick.randrange(0, 4)
        return npz_bytes(arrays, {name: huge_shape_header(arrays[name], value)}), how, f"{name}'s header claims shape #{value}"
    rewrite, at, value = pick.choice(REWRITES), pick.random(), pick.choice(DELTAS)
    new = rewrite_array(arrays, name, rewrite, at, value)
    return npz_bytes(new), how, f"{name}: {rewrite} at {at:.3f} by {value}"


def zip_version_needed(data: bytes, value: int) -> bytes:
    """An archive whose first central directory entry says it needs zip version ``value / 10``
    to extract (``zipfile`` knows up to 6.3)."""
    at = data.rindex(b"PK\x05\x06")
    first = int.from_bytes(data[at + 16:at + 20], "little")  # the central directory's offset
    return data[:first + 6] + struct.pack("<H", value) + data[first + 8:]


def damage_by_recipe(data: bytes, recipe: dict[str, Any]) -> bytes:
    """A kept file damaged as a corpus recipe says: ``{"zip_version": 97}``, or ``{"array":
    "sizes", "rewrite": "add", "at": 0.2, "value": 2**62}`` (:func:`rewrite_array`)."""
    if "zip_version" in recipe:
        return zip_version_needed(data, recipe["zip_version"])
    arrays = rewrite_array(npz_arrays(data), recipe["array"], recipe["rewrite"], recipe.get("at", 0.0), recipe["value"])
    return npz_bytes(arrays)


def the_kept_file(folder: str) -> str:
    """The one file naiad keeps in ``folder``."""
    kept = [os.path.join(folder, n) for n in os.listdir(folder) if not n.startswith(".tmp-")]
    assert len(kept) == 1, kept
    return kept[0]


class Kept(NamedTuple):
    """Data read once with an index folder: the file naiad kept there, what the read gave, how to
    read the data again with that folder, and where the data lies."""

    path: str
    expected: list[Any]
    read: Callable[[], list[Any] | None]
    root: str


def kept_shards() -> list[bytes]:
    """The two shards whose member indexes are kept (``s0.tar``, ``s1.tar``)."""
    return [tar_shard("webdataset", "plain", 0), tar_shard("gnu", "long", 1)]


def kept_member_index(folder: str) -> Kept:
    """:func:`kept_shards` in ``folder``, read with their member indexes kept."""
    paths = [write_file(os.path.join(folder, f"s{k}.tar"), data) for k, data in enumerate(kept_shards())]
    index = os.path.join(folder, "index")
    expected = read_shards(paths)
    assert expected is not None and read_shards(paths, index_dir=index) == expected
    return Kept(the_kept_file(index), expected, lambda: read_shards(paths, index_dir=index), folder)


def kept_listing(folder: str) -> Kept:
    """:func:`image_folder` in ``folder``, read with its listing kept."""
    root, index = image_folder(folder), os.path.join(folder, "index")
    expected = read_folder(root, False)
    assert expected is not None and read_folder(root, index) == expected
    return Kept(the_kept_file(index), expected, lambda: read_folder(root, index), root)


def replay_kept(recipe: dict[str, Any], folder: str) -> None:
    """A corpus recipe of damage to a kept file (``"kept"``: ``"listing"`` or
    ``"member_index"``): made, damaged, and the data read again must give the right samples."""
    kept = kept_listing(folder) if recipe["kept"] == "listing" else kept_member_index(folder)
    with open(kept.path, "rb") as f:
        write_file(kept.path, damage_by_recipe(f.read(), recipe))
    with within_case_time(str(recipe)):
        assert kept.read() == kept.expected, f"{recipe}: other samples"


def kept_index_case(pick: Pick, folder: str) -> None:
    """Two shards read with their member indexes kept, the kept file damaged, read again: a
    damaged file (bytes, a header) is not used, the samples are the right ones; a rewritten one
    gives the right samples, a SourceError naming a shard, or (a lie that passes every check,
    docs/SECURITY.md) bytes of the source's own shards, never another file's."""
    kept = kept_member_index(folder)
    write_file(os.path.join(folder, "secret.tar"), SECRET * 100)
    with open(kept.path, "rb") as f:
        data, how, what = damaged_kept_file(pick, f.read())
    write_file(kept.path, data)
    with within_case_time(what):
        got = kept.read()
    if how != "arrays":
        assert got == kept.expected, f"kept member index, {what}: {got and got[:3]!r}"
        return
    for key, value in got or ():  # a lie that passed the checks (docs/SECURITY.md): the shards' own bytes, or a SourceError
        assert SECRET not in value and any(value in shard for shard in kept_shards()), f"kept member index, {what}: {key!r}"


def image_folder(folder: str) -> str:
    """An image folder of two classes (a sub-folder, a file that is no image), and a secret
    beside it."""
    from PIL import Image

    root = os.path.join(folder, "root")
    for k, name in enumerate(("cat/c0.png", "cat/c1.png", "cat/sub/s0.png", "dog/d0.png", "dog/d1.jpg")):
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        Image.new("RGB", (4, 4), (k * 40, 0, 0)).save(os.path.join(root, name))
    write_file(os.path.join(root, "cat", "notes.txt"), b"not an image")
    write_file(os.path.join(folder, "secret.png"), SECRET)
    return root


def read_folder(root: str, index_dir: Any) -> list[tuple[str, int, bytes]] | None:
    """Every file ``read_images`` gives as ``(path, label, bytes)``, sorted, unreadable files
    skipped; None when a SourceError named the folder (any other exception fails)."""
    try:
        loader = naiad.DataLoader(naiad.read_images(root, index_dir=index_dir, on_bad_rows="skip"), batch_size=4)
        return sorted((p, int(lab), img) for b in loader for p, lab, img in zip(b["path"], b["label"], b["image"], strict=True))
    except SourceError as exc:
        assert_named(exc, root)
        return None


def listing_case(pick: Pick, folder: str) -> None:
    """An image folder's kept listing damaged (its bytes, a member's header, or rewritten by
    ``np.savez``: array values or path names), then the folder read again: the right files,
    or (a rewrite that passes every check) only files inside the folder, each with its own bytes
    and its class folder's label; never the secret beside it."""
    kept = kept_listing(folder)
    root = kept.root
    with open(kept.path, "rb") as f:
        data = f.read()
    if pick.random() < 0.3:
        arrays = npz_arrays(data)
        ends, blob = arrays["path_ends"], arrays["path_bytes"]
        names = [bytes(blob[a:b]).decode("utf-8", "surrogateescape") for a, b in zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True)]
        i = pick.randrange(0, len(names))
        names[i] = pick.choice(HOSTILE_NAMES)
        blobs = [n.encode("utf-8", "surrogateescape") for n in names]
        arrays["path_ends"] = np.cumsum([len(b) for b in blobs]).astype(np.int64)
        arrays["path_bytes"] = np.frombuffer(b"".join(blobs), np.uint8)
        data, how, what = npz_bytes(arrays), "arrays", f"name {i} is {names[i]!r}"
    else:
        data, how, what = damaged_kept_file(pick, data, listing=True)
    write_file(kept.path, data)
    with within_case_time(what):
        got = kept.read()
    if how != "arrays":
        assert got == kept.expected, f"kept listing, {what}: {got and got[:3]!r}"
        return
    classes = sorted(os.listdir(root))
    for path, label, image in got or ():  # a lie that passed the checks: files of the folder, each its own bytes
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
        assert not rel.startswith(".."), f"kept listing, {what}: read {path!r}, outside the folder"
        with open(path, "rb") as f:
            assert image == f.read() and SECRET not in image, f"kept listing, {what}: {path!r} has other bytes"
        assert classes[label] == rel.split(os.sep)[0], f"kept listing, {what}: {path!r} labelled {label}"


def block_index_case(pick: Pick, folder: str) -> None:
    """A CSV's or JSONL's block index (JSON) damaged in its bytes, then the file read again: the
    right rows, or a SourceError naming the file (a wrong row count caught as a block is parsed)."""
    fmt = pick.choice(("csv", "jsonl"))
    rows = 200
    body = "id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in range(rows)) if fmt == "csv" else "".join(
        f'{{"id": {i}, "x": {i * 0.5}}}\n' for i in range(rows))
    path = write_file(os.path.join(folder, "d." + fmt), body.encode())
    index = os.path.join(folder, "index")
    reader = naiad.read_csv if fmt == "csv" else naiad.read_jsonl

    def ids() -> list[int] | None:
        try:
            loader = naiad.DataLoader(reader(path, block_bytes=256, index_dir=index), batch_size=64)
            return [int(v) for b in loader for v in b["id"]]
        except SourceError as exc:
            assert_named(exc, path)
            return None

    assert ids() == list(range(rows))
    kept = the_kept_file(index)
    with open(kept, "rb") as f:
        data = f.read()
    if pick.random() < 0.5:
        doc = json.loads(data)
        key = pick.choice(("starts", "rows", "first_lines"))
        i = pick.randrange(0, len(doc[key]))
        doc[key][i] += pick.choice(DELTAS)
        data, what = json.dumps(doc).encode(), f"{fmt} block index: {key}[{i}] is {doc[key][i]}"
    else:
        data, what = mutated(pick, data)
        what = f"{fmt} block index: {what}"
    write_file(kept, data)
    with within_case_time(what):
        got = ids()
    assert got in (None, list(range(rows))), f"{what}: rows {got and got[:10]}"
