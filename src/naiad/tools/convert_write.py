"""The writing half of ``naiad convert``: shards of Parquet or Arrow IPC, local or behind a URL,
cut into row groups of a fixed size, hashed while written, and renamed into place at the end.

NOTE [ Atomic shards ]
Every shard is written to a temporary name beside its final one (``mkstemp`` in the destination
folder for a local path; ``.<name>.<random>.tmp`` for a URL) and hashed as its bytes go out.
Only when every shard is complete are they renamed to their final names, and the manifest is
written last, itself through a temporary name: a convert that fails or is interrupted removes
its temporary files and leaves no half shard, and a manifest names only shards that are whole.
A temporary name ends in ``.tmp``, so a glob of ``*.parquet`` never picks one up.
"""

from __future__ import annotations

import functools
import glob as globlib
import hashlib
import io
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal, cast

import pyarrow as pa
import pyarrow.parquet as pq

from naiad.errors import ConfigError, SourceError
from naiad.sources.storage import Storage, is_remote, local_path, object_path

__all__ = ["FORMATS", "Destination", "ShardFiles", "ShardInfo", "ShardSet", "format_of"]

OutputFormat = Literal["parquet", "arrow", "webdataset"]

FORMATS: dict[str, OutputFormat] = {".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
                                    ".tar": "webdataset"}
"""Destination suffix -> output format (``webdataset``: tar shards of samples, convert_tar.py)."""

_SUFFIX: dict[OutputFormat, str] = {"parquet": ".parquet", "arrow": ".arrow", "webdataset": ".tar"}


def format_of(dst: str, fmt: str | None) -> OutputFormat:
    """The output format: ``fmt`` if given, else from ``dst``'s suffix, else Parquet (a folder)."""
    suffix = PurePosixPath(dst.rstrip("/")).suffix.lower()
    if fmt is not None:
        if fmt not in _SUFFIX:
            raise ConfigError(f"`format` must be 'parquet', 'arrow' or 'webdataset', got {fmt!r}.")
        if suffix in FORMATS and FORMATS[suffix] != fmt:
            raise ConfigError(f"the destination {dst!r} ends in {suffix} but the format is {fmt!r}; make them agree.")
        return cast(OutputFormat, fmt)  # one of _SUFFIX's keys, checked above
    return FORMATS.get(suffix, "parquet")


class Destination:
    """Where shards go: a file name (``out/train.parquet``) or a folder (``out/``, ``s3://b/p/``).

    A file name with ``sharded=False`` is the one shard; with ``sharded=True`` its stem numbers
    them (``train-00000.parquet``). A folder holds ``part-00000.parquet``, ... The manifest is
    ``<stem>.manifest.json`` beside a file name, ``manifest.json`` in a folder.
    """

    def __init__(self, dst: str, fmt: OutputFormat, *, sharded: bool, storage: Storage) -> None:
        self.remote = is_remote(dst)
        self.storage = storage
        dst = dst if self.remote else local_path(dst)
        is_file = PurePosixPath(dst.rstrip("/")).suffix.lower() in FORMATS and not dst.endswith("/")
        if is_file:
            self.folder, name = _split(dst)
            stem = name[: -len(PurePosixPath(name).suffix)]
            self.suffix = PurePosixPath(name).suffix
            self._single = None if sharded else name
            self._stem = stem
            self.manifest_name = f"{stem}.manifest.json"
        else:
            self.folder = dst.rstrip("/") or "/"
            self.suffix = _SUFFIX[fmt]
            self._single = None
            self._stem = "part"
            self.manifest_name = "manifest.json"
        if not self.remote:
            os.makedirs(self.folder or ".", exist_ok=True)

    def shard_name(self, index: int) -> str:
        """The file name of shard ``index``."""
        return self._single if self._single is not None else f"{self._stem}-{index:05d}{self.suffix}"

    def join(self, name: str) -> str:
        """The full path or URL of ``name`` in the destination folder."""
        if self.remote:
            return f"{self.folder}/{name}"
        return os.path.join(self.folder, name) if self.folder else name

    def existing(self) -> list[str]:
        """Names in the destination that this convert would write or replace (shards, manifest)."""
        if self.remote:
            pattern = self._single or f"{self._stem}-[0-9]*{self.suffix}"
            fs = self.storage.filesystem(self.folder)
            found: list[str] = []
            for n in (self.manifest_name, pattern):
                url = self.join(n)
                # Through Storage.call: transient errors retried, others a SourceError naming the URL.
                found += self.storage.call(url, None, functools.partial(fs.glob, object_path(url)))
            return sorted({PurePosixPath(p).name for p in found})
        esc = globlib.escape
        pattern = esc(self._single) if self._single else f"{esc(self._stem)}-[0-9]*{self.suffix}"
        folder = esc(self.folder) if self.folder else ""
        found = [p for n in (esc(self.manifest_name), pattern) for p in globlib.glob(os.path.join(folder, n))]
        return sorted({os.path.basename(p) for p in found})

    # -- writing -----------------------------------------------------------------------------

    def open_temp(self, name: str) -> tuple[Any, str]:
        """A new file for writing under a temporary name beside ``name``: (file object, temp path)."""
        if self.remote:
            tmp = self.join(f".{name}.{secrets.token_hex(6)}.tmp")
            fs = self.storage.filesystem(tmp)
            return self.storage.call(tmp, None, lambda: fs.open(object_path(tmp), "wb")), tmp
        fd, tmp = tempfile.mkstemp(dir=self.folder or ".", prefix=f".{name}.", suffix=".tmp")
        # mkstemp makes the file private (0600); a shard gets the mode any new file would.
        os.fchmod(fd, 0o666 & ~_umask())
        return os.fdopen(fd, "wb"), tmp

    def commit(self, tmp: str, name: str) -> None:
        """Rename a finished temporary file to ``name``."""
        final = self.join(name)
        if self.remote:
            fs = self.storage.filesystem(tmp)
            self.storage.call(final, None, lambda: fs.mv(object_path(tmp), object_path(final)))
        else:
            os.replace(tmp, final)

    def remove(self, path: str) -> None:
        """Remove a file (a temporary one, or a stale shard); missing is fine."""
        try:
            if self.remote:
                fs = self.storage.filesystem(path)
                self.storage.call(path, None, lambda: fs.rm(object_path(path)))
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass

    def write_bytes(self, name: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``name``, through a temporary name."""
        f, tmp = self.open_temp(name)
        try:
            with f:
                f.write(data)
        except BaseException:
            self.remove(tmp)
            raise
        self.commit(tmp, name)

    def write_json(self, name: str, value: Mapping[str, Any]) -> None:
        """Write ``value`` as JSON to ``name``, through a temporary name."""
        self.write_bytes(name, (json.dumps(value, indent=2) + "\n").encode())


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def _split(path: str) -> tuple[str, str]:
    i = path.rstrip("/").rfind("/")
    return (path[:i] if i > 0 else ("/" if i == 0 else "")), path[i + 1:]


class _HashingSink(io.RawIOBase):
    """A write-only file that hashes and counts every byte on its way to ``inner``."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.sha = hashlib.sha256()
        self.nbytes = 0

    def writable(self) -> bool:
        """Always true."""
        return True

    def write(self, data: Any) -> int:
        """Hash, count and pass on ``data``."""
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.inner.write(view)
        self.nbytes += len(view)
        return len(view)

    def tell(self) -> int:
        """Bytes written so far."""
        return self.nbytes

    def flush(self) -> None:
        """Flush the inner file."""
        self.inner.flush()

    def close(self) -> None:
        """Close the inner file (an object store completes its upload here)."""
        if not self.closed:
            super().close()  # flushes first, while the inner file is open
            self.inner.close()


@dataclass
class ShardInfo:
    """One finished shard, as the manifest lists it."""

    file: str
    rows: int
    bytes: int
    sha256: str
    row_groups: int
    tmp: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The manifest's entry."""
        return {"file": self.file, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256,
                "row_groups": self.row_groups}


class ShardFiles:
    """What every kind of shard set shares: the shards finished so far (written to temporary
    names, hashed as written), the one being written, and renaming them all into place at the end
    or removing them on failure (NOTE [ Atomic shards ]). A subclass opens its writer over
    :meth:`_open_sink` and closes a shard with :meth:`_close_shard`."""

    def __init__(self, dest: Destination, rows_per_shard: int | None) -> None:
        self.dest = dest
        self.rows_per_shard = rows_per_shard
        self.shards: list[ShardInfo] = []
        self._writer: Any = None
        self._sink: _HashingSink | None = None
        self._tmp = ""
        self._rows = 0

    @property
    def bytes_written(self) -> int:
        """Bytes of every shard so far, the open one included."""
        return sum(s.bytes for s in self.shards) + (self._sink.nbytes if self._sink else 0)

    @property
    def rows_written(self) -> int:
        """Rows written so far (for Parquet and Arrow: in finished row groups)."""
        return sum(s.rows for s in self.shards) + self._rows

    def _open_sink(self) -> _HashingSink:
        """The next shard's temporary file, hashed as it is written."""
        f, self._tmp = self.dest.open_temp(self.dest.shard_name(len(self.shards)))
        self._sink = _HashingSink(f)
        return self._sink

    def _close_shard(self, row_groups: int = 0) -> None:
        assert self._writer is not None and self._sink is not None
        self._writer.close()
        self._sink.close()
        self.shards.append(ShardInfo(self.dest.shard_name(len(self.shards)), self._rows, self._sink.nbytes,
                                     self._sink.sha.hexdigest(), row_groups, self._tmp))
        self._writer = self._sink = None
        self._tmp = ""
        self._rows = 0

    def _commit(self) -> list[ShardInfo]:
        """Rename every finished shard into place."""
        for shard in self.shards:
            self.dest.commit(shard.tmp, shard.file)
            shard.tmp = ""
        return self.shards

    def abort(self) -> None:
        """Remove every temporary file (a failed or interrupted convert): the shard being written
        closed first, quietly, since the error that stopped it is the one to report."""
        if self._writer is not None:
            try:
                self._writer.close()
                if self._sink is not None:
                    self._sink.close()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        for tmp in [self._tmp] + [s.tmp for s in self.shards]:
            if tmp:
                try:
                    self.dest.remove(tmp)
                except (OSError, SourceError):
                    pass


class ShardSet(ShardFiles):
    """Writes a stream of record batches as shards of ``rows_per_shard`` rows, in row groups (or
    IPC record batches) of exactly ``row_group_rows`` rows, the last of each shard shorter.

    Batches are held only until a row group is full, so memory is one row group plus the batch
    being added. See NOTE [ Atomic shards ] for how the files reach their names.
    """

    def __init__(self, dest: Destination, fmt: OutputFormat, schema: pa.Schema, *, row_group_rows: int,
                 rows_per_shard: int | None, compression: str | None) -> None:
        super().__init__(dest, rows_per_shard)
        self.fmt = fmt
        self.schema = schema
        self.row_group_rows = row_group_rows
        self.compression = compression
        self._pending = schema.empty_table()  # slices of the batches added: no copy
        self._groups = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch``'s rows; every full row group is written at once."""
        if batch.num_rows == 0:
            return
        self._pending = pa.concat_tables([self._pending, pa.Table.from_batches([batch], schema=self.schema)])
        while self._pending.num_rows >= self._next_group_rows():
            self._write_group(self._next_group_rows())

    def _next_group_rows(self) -> int:
        if self.rows_per_shard is None:
            return self.row_group_rows
        return min(self.row_group_rows, self.rows_per_shard - self._rows)

    def _write_group(self, n: int) -> None:
        group, self._pending = self._pending.slice(0, n), self._pending.slice(n)
        if self._writer is None:
            self._open()
        writer: Any = self._writer  # set by _open
        if self.fmt == "parquet":
            writer.write_table(group, row_group_size=n)
        else:  # one record batch per group: read_arrow's block
            writer.write_table(group.combine_chunks())
        self._rows += n
        self._groups += 1
        if self.rows_per_shard is not None and self._rows >= self.rows_per_shard:
            self._close_shard()

    def _open(self) -> None:
        out = pa.PythonFile(self._open_sink(), mode="w")
        if self.fmt == "parquet":
            # Float features without dictionary pages: a 64k-row float chunk always fits in its
            # dictionary, and decoding through it costs about twice the CPU of PLAIN pages
            # (docs/STREAMING.md, "Parquet encodings"). Images and pixels never repeat: a
            # dictionary only fills up and falls back, and its first pages read through it
            # (60,000 28x28 pixel rows: 26 ms against 15 ms plain). Other columns keep it.
            dictionary = [f.name for f in self.schema if not _is_float(f.type) and not _is_blob(f.type)]
            self._writer = pq.ParquetWriter(out, self.schema, use_dictionary=dictionary,
                                            compression=self.compression or "none")
        else:
            options = pa.ipc.IpcWriteOptions(compression=self.compression)
            self._writer = pa.ipc.new_file(out, self.schema, options=options)

    def _close_shard(self, row_groups: int = 0) -> None:
        super()._close_shard(self._groups)
        self._groups = 0

    def finish(self) -> list[ShardInfo]:
        """Write the last, short row group, close the last shard and rename every shard into
        place (an input with no rows gives one empty shard, so the schema is kept)."""
        if self._pending.num_rows:
            self._write_group(self._pending.num_rows)
        if self._writer is None and not self.shards:
            self._open()
            writer: Any = self._writer
            if self.fmt == "arrow":
                writer.write_table(self.schema.empty_table())
        if self._writer is not None:
            self._close_shard()
        return self._commit()


def _is_blob(t: pa.DataType) -> bool:
    """Bytes (``--decode`` pixels are ``fixed_size_binary``), a struct holding bytes (an image's
    ``{bytes, path}``), or a fixed-size list of bytes (pixels as earlier versions wrote them)."""
    if pa.types.is_struct(t):
        return any(_is_blob(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_fixed_size_list(t):
        return bool(pa.types.is_uint8(t.value_type))
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _is_float(t: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return _is_float(t.value_type)
    return bool(pa.types.is_floating(t))
