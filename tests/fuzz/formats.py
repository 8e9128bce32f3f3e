"""Valid seed files for every reader, the mutations the fuzz tests apply to them, and the check
that reading a damaged file ends in a naiad error naming the file, or in data."""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import naiad
from naiad.errors import ConfigError, SourceError
from naiad.sources import CsvFormat

ROWS = 60


def _table() -> pa.Table:
    i = np.arange(ROWS)
    return pa.table({
        "id": pa.array(i, pa.int64()),
        "x": pa.array(i * 0.5, pa.float64()),
        "s": pa.array([f"r{v}é" for v in i], pa.string()),
    })


def csv_bytes() -> bytes:
    t = _table().to_pydict()
    lines = ["id,x,s"] + [f'{a},{b},"{c}"' for a, b, c in zip(t["id"], t["x"], t["s"], strict=True)]
    return ("\n".join(lines) + "\n").encode()


def jsonl_bytes() -> bytes:
    t = _table().to_pylist()
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in t).encode()


def text_bytes() -> bytes:
    return "".join(f"line {i} é\n" for i in range(ROWS)).encode()


def parquet_bytes() -> bytes:
    sink = io.BytesIO()
    pq.write_table(_table(), sink, row_group_size=16)
    return sink.getvalue()


def arrow_bytes() -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, _table().schema) as w:
        for b in _table().to_batches(max_chunksize=16):
            w.write_batch(b)
    return sink.getvalue()


def npy_bytes() -> bytes:
    sink = io.BytesIO()
    np.save(sink, np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3))
    return sink.getvalue()


def zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(data)
    return bytes(sink.getvalue())


@dataclass(frozen=True)
class Format:
    """One reader over one kind of file: the suffix, a valid file's bytes, how to open it."""

    name: str
    suffix: str
    seed: Callable[[], bytes]
    open: Callable[[str], naiad.Source]


# Small blocks, so that a file is several blocks and the damage lands in one of them.
FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("csv", ".csv", csv_bytes, lambda p: naiad.read_csv(p, block_bytes=256)),
    Format("csv_skip", ".csv", csv_bytes, lambda p: naiad.read_csv(p, block_bytes=256, on_bad_rows="skip")),
    Format("csv_quoted_newlines", ".csv", csv_bytes, lambda p: naiad.read_csv(p, csv=CsvFormat(newlines_in_values=True))),
    Format("jsonl", ".jsonl", jsonl_bytes, lambda p: naiad.read_jsonl(p, block_bytes=256)),
    Format("jsonl_skip", ".jsonl", jsonl_bytes, lambda p: naiad.read_jsonl(p, block_bytes=256, on_bad_rows="skip")),
    Format("text", ".txt", text_bytes, lambda p: naiad.read_text(p, block_bytes=128)),
    Format("text_skip", ".txt", text_bytes, lambda p: naiad.read_text(p, block_bytes=128, on_bad_rows="skip")),
    Format("parquet", ".parquet", parquet_bytes, lambda p: naiad.read_parquet(p)),
    Format("arrow", ".arrow", arrow_bytes, lambda p: naiad.read_arrow(p)),
    Format("npy", ".npy", npy_bytes, lambda p: naiad.read_npy(p, block_rows=16)),
    Format("csv_gz", ".csv.gz", lambda: gzip.compress(csv_bytes()), lambda p: naiad.read_csv(p)),
    Format("jsonl_zst", ".jsonl.zst", lambda: zstd(jsonl_bytes()), lambda p: naiad.read_jsonl(p)),
    Format("text_gz", ".txt.gz", lambda: gzip.compress(text_bytes()), lambda p: naiad.read_text(p)),
]}


def write(directory: str, fmt: Format, data: bytes, name: str = "data") -> str:
    """``data`` as a file of ``fmt``'s suffix in ``directory``."""
    path = os.path.join(directory, name + fmt.suffix)
    with open(path, "wb") as f:
        f.write(data)
    return path


def drain(fmt: Format, path: str, *, num_workers: int = 0, shuffle: bool = True) -> int | None:
    """Open ``path`` and read every batch of an epoch: the rows read, or None when a naiad error
    named the file. Any other exception, or a naiad error that does not name the file, fails."""
    try:
        loader = naiad.DataLoader(
            fmt.open(path), batch_size=16, shuffle=shuffle, seed=1, shuffle_buffer=32,
            num_workers=num_workers, worker_mode="process", timeout=60 if num_workers else 0,
        )
        rows = 0
        for batch in loader:
            rows += len(next(iter(batch.values())))
        return rows
    except (SourceError, ConfigError) as exc:
        assert_named(exc, path)
        return None


def assert_named(exc: BaseException, *paths: str, case: str = "") -> None:
    """The naiad error names ``paths`` (one of them, where the error may be about any: shards
    read together); ``case``, the damage done, leads the message of a failure."""
    assert isinstance(exc, (SourceError, ConfigError)), repr(exc)
    assert any(p in str(exc) for p in paths), f"{case + ': ' if case else ''}the error does not name {' or '.join(paths)}: {exc!r}"


def mutate(data: bytes, kind: str, pos: float, payload: bytes) -> bytes:
    """``data`` damaged: ``kind`` at relative position ``pos`` (0..1) with ``payload``."""
    at = int(pos * len(data))
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + payload + data[at:]
    if kind == "overwrite":
        return data[:at] + payload + data[at + len(payload):]
    if kind == "delete":
        return data[:at] + data[at + max(1, len(payload)):]
    if kind == "random":
        return payload
    raise ValueError(kind)


MUTATIONS = ("truncate", "insert", "overwrite", "delete", "random")
NASTY = (b"\x00", b"\x00\x00\x00\x00", b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b'"', b'"\n"', b",,,\n",
         b"\n", b"\r\n", b"{", b"}\n{", b"\\", b"NaN", b"1e999", b"-", b"\x80" * 8)


def describe(**kw: Any) -> str:
    """A readable label for a failing example."""
    return ", ".join(f"{k}={v!r:.60}" for k, v in kw.items())
