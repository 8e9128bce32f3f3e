"""The tar half of ``naiad convert --format webdataset``: record batches of samples written as
WebDataset tar shards, ``<key>.<ext>`` members one sample after another, atomically and hashed
like the Parquet and Arrow shards (NOTE [ Atomic shards ] in convert_write.py).

A batch has the string column ``__key__`` and one column per member. Each column's field says
in its ``naiad.member`` metadata (JSON) which extension its members get: ``{"ext": "cls"}`` for
every sample alike, or ``{"media": true, "name": ..., "prefix": ...}`` for encoded bytes, whose
extension follows their format (:func:`media_extension`: a JPEG is ``jpg``, a PNG ``png``).
Integers are written as decimal text (``cls``, as WebDataset writes a class), strings as UTF-8,
bytes as they are. Members carry a fixed modification time, owner and mode, so the same samples
make the same bytes (and the same SHA-256 in the manifest).
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import IO, Any, cast

import pyarrow as pa

from naiad.tools.convert_write import Destination, ShardFiles, ShardInfo
from naiad.tools.sample_media import media_format, same_format

__all__ = ["MEMBER_KEY", "TarShardSet", "media_extension", "member_field"]

MEMBER_KEY = b"naiad.member"
_MTIME = 0  # fixed: the same samples make the same shard bytes


def member_field(name: str, type_: pa.DataType, rule: dict[str, Any]) -> pa.Field:
    """A field of a tar batch: its column ``name`` and how its members are named (``rule``)."""
    return pa.field(name, type_, metadata={MEMBER_KEY: json.dumps(rule).encode()})


def media_extension(rule: dict[str, Any], data: bytes) -> str:
    """The member extension of encoded bytes: the column's own name when it names their format
    (``jpeg`` for a JPEG in a ``jpeg`` column), else ``prefix`` + the format's extension
    (``jpg``, ``png``; ``seg.`` + ``png``), else the column's name for bytes of no known format."""
    found = media_format(data)
    name = rule.get("name")
    if found is None:
        return str(name or rule.get("fallback") or "bin")
    fmt, ext = found
    if name and same_format(name, fmt):
        return str(name)
    return f"{rule.get('prefix', '')}{ext}"


class TarShardSet(ShardFiles):
    """Writes batches of samples as tar shards of ``rows_per_shard`` samples (None: one shard);
    the same interface as :class:`~naiad.tools.convert_write.ShardSet`."""

    def __init__(self, dest: Destination, schema: pa.Schema, *, rows_per_shard: int | None) -> None:
        super().__init__(dest, rows_per_shard)
        self.schema = schema
        self._rules = [json.loads((f.metadata or {}).get(MEMBER_KEY, b"{}")) for f in schema]
        self._writer: tarfile.TarFile | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Write ``batch``'s samples, opening and closing shards as they fill."""
        if batch.num_rows == 0:
            return
        names = batch.schema.names
        key_at = names.index("__key__")
        columns = [c.to_pylist() for c in batch.columns]
        for row in range(batch.num_rows):
            if self._writer is None:
                self._open()
            key = columns[key_at][row]
            for i, values in enumerate(columns):
                if i == key_at:
                    continue
                value = values[row]
                if value is None:
                    continue  # a sample without this member
                rule = self._rules[i]
                if isinstance(value, (bytes, bytearray)):
                    data = bytes(value)
                    ext = media_extension(rule, data) if rule.get("media") else str(rule.get("ext", names[i]))
                else:
                    data = (value if isinstance(value, str) else str(value)).encode("utf-8")
                    ext = str(rule.get("ext", names[i]))
                self._member(f"{key}.{ext}", data)
            self._rows += 1
            if self.rows_per_shard is not None and self._rows >= self.rows_per_shard:
                self._close_shard()

    def _member(self, name: str, data: bytes) -> None:
        assert self._writer is not None
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = _MTIME
        info.mode = 0o444
        info.uname = info.gname = "naiad"
        self._writer.addfile(info, io.BytesIO(data))

    def _open(self) -> None:
        # A stream ("w|"): the sink hashes what goes out and cannot seek back.
        # A stream needs only write(); typeshed asks "w|" for a whole IO[bytes].
        sink = cast(IO[bytes], self._open_sink())
        self._writer = tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def finish(self) -> list[ShardInfo]:
        """Close the last shard and rename every shard into place (no samples: one empty tar)."""
        if self._writer is None and not self.shards:
            self._open()
        if self._writer is not None:
            self._close_shard()
        return self._commit()
