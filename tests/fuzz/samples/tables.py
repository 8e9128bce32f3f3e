"""Tables of ``{bytes, path}`` structs for the sample fuzzers: a Parquet table, in a local folder or
in an fsspec ``memory://`` bucket, whose media column names files by hostile paths (outside the
table's folder, other schemes, chains, NUL bytes, names that are not UTF-8). Each row must be its
bytes, a file inside the table's folder, or a bad row: :func:`table_case`.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import naiad
from naiad.errors import SourceError
from tests.fuzz.formats import assert_named
from tests.fuzz.samples.damage import write_file
from tests.fuzz.samples.rules import SECRET, Pick, within_case_time

MEDIA = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
EMBEDDED = b"EMBEDDED"
INSIDE = {"img/0.png": b"IMG0", "img/1.png": b"IMG1"}
GOOD_PATHS = ("img/0.png", "./img/0.png", "img//1.png", "img/./1.png", "img/../img/1.png")
# {root}: the folder holding the table's folder (data/), the secret and a sibling (data-other/);
# {bucket}: the memory:// bucket holding the same.
HOSTILE_PATHS = (
    "../secret.bin", "../../secret.bin", "img/../../secret.bin", "img/" + "../" * 200 + "secret.bin", "../data-other/o.png",
    "{root}/secret.bin", "{root}/data/../secret.bin", "{root}/data/img/0.png", "{root}/data-other/o.png",
    "file://{root}/secret.bin", "FILE://{root}/secret.bin", "local://{root}/secret.bin", "file:{root}/secret.bin",
    "file:///{root}/data/../secret.bin", "file://{root}/data/img/0.png", "file:///etc/hostname",
    "{bucket}/secret.bin", "{bucket}/data/../secret.bin", "{bucket}-other/x.png", "{bucket}/data/img/0.png",
    "{bucket}/data-other/o.png", "MEMORY://{bucket_name}/secret.bin", "memory:/{bucket_name}/secret.bin",
    "memory:///secret.bin", "s3://bucket/x.png", "gs://b/x", "http://127.0.0.1:9/x.png", "ftp://127.0.0.1:9/x",
    "hdfs://h/x", "simplecache::file://{root}/secret.bin", "img/0.png::file://{root}/secret.bin",
    "", "/", ".", "..", "img", "img/", "\x00", "img/0.png\x00", "img/\x00/../0.png", "x" * 5000, "~/secret.bin",
    "$HOME/secret.bin", "img\\..\\..\\secret.bin", "%2e%2e/secret.bin", "img/ÿ.png", "img/\u202e.png",
)
NOT_UTF8 = (b"img/\xff\xfe.png", b"img/0.png\xc3", b"\xed\xa0\x80/secret.bin")


def media_files(root: str, bucket: str) -> None:
    """The table's folder (``data/img``) and, beside it, a secret and a sibling folder whose
    name starts like the table's; the same in the memory bucket, and a secret in another."""
    import fsspec

    os.makedirs(os.path.join(root, "data", "img"), exist_ok=True)
    for name, data in INSIDE.items():
        write_file(os.path.join(root, "data", name), data)
    os.makedirs(os.path.join(root, "data-other"), exist_ok=True)
    write_file(os.path.join(root, "secret.bin"), SECRET)
    write_file(os.path.join(root, "data-other", "o.png"), SECRET)
    fs = fsspec.filesystem("memory")
    for url, data in [*((f"{bucket}/data/{n}", v) for n, v in INSIDE.items()), (f"{bucket}/secret.bin", SECRET),
                      (f"{bucket}/data-other/o.png", SECRET), (f"{bucket}-other/x.png", SECRET)]:
        with fs.open(url, "wb") as f:
            f.write(data)


def table_case(pick: Pick, folder: str, *, remote: bool) -> None:
    """A Parquet table (in ``folder``, or in a memory:// bucket) whose ``{bytes, path}`` column
    names files by hostile paths: each row is its bytes, a file inside the table's folder, or a
    bad row (a SourceError naming the table, the row and the column; with ``on_bad_rows="skip"``
    in the ledger), never a file outside the folder. A path that is not UTF-8 makes the whole
    column chunk unreadable to Arrow: a SourceError naming the table."""
    import fsspec

    bucket_name = f"naiad-fuzz-{os.getpid()}-{os.path.basename(folder)}"
    bucket = f"memory://{bucket_name}"
    fill = {"root": folder, "bucket": bucket, "bucket_name": bucket_name}
    values: list[dict[str, Any] | None] = []
    for _ in range(pick.randrange(1, 7)):
        r = pick.random()
        path: Any = (pick.choice(GOOD_PATHS) if r < 0.3 else pick.choice(NOT_UTF8) if r < 0.35
                     else pick.choice(HOSTILE_PATHS).format(**fill))
        values.append(None if r > 0.95 else {"bytes": EMBEDDED if r > 0.85 else None, "path": None if r > 0.8 else path})
    media_files(folder, bucket)
    raw = pa.array([None if v is None or v["path"] is None else v["path"] if isinstance(v["path"], bytes)
                    else v["path"].encode("utf-8", "surrogatepass") for v in values], pa.binary())
    column = pa.StructArray.from_arrays([pa.array([v and v["bytes"] for v in values], pa.binary()), raw.view(pa.string())],
                                        ["bytes", "path"], mask=pa.array([v is None for v in values]))
    out = io.BytesIO()
    pq.write_table(pa.table({"image": column, "y": np.arange(len(values))}), out)
    fs = fsspec.filesystem("memory")
    if remote:
        url = f"{bucket}/data/t.parquet"
        with fs.open(url, "wb") as f:
            f.write(out.getvalue())
    else:
        url = write_file(os.path.join(folder, "data", "t.parquet"), out.getvalue())
    what = f"{'remote' if remote else 'local'} table of {[v and v['path'] for v in values]!r:.600}"
    broken = any(v and isinstance(v["path"], bytes) for v in values)
    try:
        with within_case_time(what):
            for skip in (True, False):
                _check_media_rows(url, values, skip=skip, broken=broken, what=what)
    finally:
        for b in (bucket, f"{bucket}-other"):
            if fs.exists(b):
                fs.rm(b, recursive=True)


def _check_media_rows(url: str, values: list[dict[str, Any] | None], *, skip: bool, broken: bool, what: str) -> None:
    try:
        loader = naiad.DataLoader(naiad.read_parquet(url, on_bad_rows="skip" if skip else "raise"), batch_size=8)
        got = {int(y): v for b in loader for y, v in zip(b["y"], b["image"], strict=True)}
        ledger = {e["row"]: e for e in loader.stats().bad_row_ledger} if skip else {}
    except SourceError as exc:
        assert_named(exc, url, case=what)
        assert broken or not skip, f"{what}: with on_bad_rows='skip', {exc!r}"
        assert broken or (re.search(r"\brow \d+", str(exc)) and "'image'" in str(exc)), f"{what}: {exc!r}"
        return
    assert not broken, f"{what}: a path that is not UTF-8 was read"
    assert sorted([*got, *ledger]) == list(range(len(values))), f"{what}: rows {sorted(got)} and bad {sorted(ledger)}"
    for row, value in got.items():
        v = values[row]
        assert SECRET not in value, f"{what}: row {row} read a file outside the table's folder"
        assert value == EMBEDDED if v and v["bytes"] else value in INSIDE.values(), f"{what}: row {row} is {value[:40]!r}"
    for entry in ledger.values():
        assert entry.get("column") == "image" and url in str(entry.get("file", url)), f"{what}: ledger {entry}"
    for row, v in enumerate(values):
        # A bucket's keys are names, not paths: img//1.png is another object than img/1.png.
        if v and v["path"] in GOOD_PATHS and not (v["path"] == "img//1.png" and "://" in url):
            assert row in got, f"{what}: row {row} ({v['path']!r}) names a file in the table's folder, not read"

