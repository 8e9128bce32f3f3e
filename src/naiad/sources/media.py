"""Binary columns of tables, and the ``{bytes, path}`` struct Hugging Face ``datasets`` stores
images and audio in: read as one column of bytes.

NOTE [ Media structs ]
``datasets`` keeps an ``Image`` or ``Audio`` feature as a struct of two fields, ``bytes``
(binary) and ``path`` (string). Written by ``push_to_hub`` or ``to_parquet`` from files, the
bytes are embedded; made from paths without embedding (``cast_column("image", Image())`` over
file names, then written), only ``path`` is set. A reader of such a table gets the column as
bytes: the struct's ``bytes`` where they are there (no copy: the struct's child array), else
the file at ``path``, read now where the table may read it (NOTE [ Paths inside tables ] in
naiad/trust/paths.py: the table's own folder or bucket, or the roots of the reader's
``media=MediaAccess(roots=...)``; a local file through ``trust.read_local_file``, an object
through the source's storage; at most its ``max_bytes`` either way). A row with neither, or whose path is refused, is a bad row: a
SourceError naming the file, the row and the column, or skipped into the ledger with
``on_bad_rows="skip"``.

The struct is recognised by its shape alone (exactly the fields ``bytes``, binary, and
``path``, string), so tables that were not written by ``datasets`` but keep media the same way
read too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, SourceError
from naiad.sources import storage as storage_mod
from naiad.sources.columns import is_ragged_numeric
from naiad.trust.paths import MediaAccess, locate_media, read_local_file

if TYPE_CHECKING:
    from naiad.sources.storage import Storage

__all__ = ["has_variable_rows", "is_media_struct", "media_access", "media_schema", "resolve_media"]


def media_access(media: MediaAccess | None) -> MediaAccess:
    """A reader's ``media=`` checked: None (the table's own folder, 256 MiB a file) or a
    :class:`MediaAccess`, its roots normalised as :meth:`MediaAccess.of` makes them (one made
    with its own constructor, ``MediaAccess(roots=["/data/images"])``, reads the same).

    Raises:
        ConfigError: anything else, or roots or a size that :meth:`MediaAccess.of` refuses.
    """
    if media is None:
        return MediaAccess.of()
    if not isinstance(media, MediaAccess):
        raise ConfigError(f"`media` must be a naiad.MediaAccess(roots=..., max_bytes=...), got {type(media).__name__}.")
    return MediaAccess.of(media.roots or None, media.max_bytes)


def is_media_struct(t: pa.DataType) -> bool:
    """Whether ``t`` is the ``{bytes, path}`` struct of a ``datasets`` Image or Audio feature."""
    if not pa.types.is_struct(t) or t.num_fields != 2:
        return False
    fields = {t.field(i).name: t.field(i).type for i in range(2)}
    b, p = fields.get("bytes"), fields.get("path")
    return (b is not None and p is not None and (pa.types.is_binary(b) or pa.types.is_large_binary(b))
            and (pa.types.is_string(p) or pa.types.is_large_string(p)))


def media_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each media struct column as the binary column it is read as."""
    fields = []
    for f in schema:
        if is_media_struct(f.type):
            f = pa.field(f.name, f.type.field("bytes").type, nullable=True, metadata=f.metadata)
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def has_variable_rows(schema: pa.Schema) -> bool:
    """Whether the schema has a column whose rows vary in size: bytes, a media struct, a ragged
    column of numbers (NOTE [ Ragged columns ]). Its rows then weigh what their values do, not
    the few bytes a row of the schema's fixed-width columns says."""
    return any(pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or is_media_struct(f.type)
               or is_ragged_numeric(f.type) for f in schema)


def resolve_media(table: pa.Table, path: str, store: Storage, first_row: int, skip: bool,
                  access: MediaAccess) -> tuple[pa.Table, dict[int, tuple[str, str]]]:
    """``table`` with its media struct columns as bytes (NOTE [ Media structs ]).

    Args:
        path: the table's file (relative paths are resolved against its folder).
        store: the source's storage (a remote table's files are read through it).
        first_row: the file's row number of the table's first row (for messages).
        skip: False: a row with neither bytes nor a readable file raises; True: it is returned.
        access: where the table's paths may reach and how large a file they may name.

    Returns:
        The table, and for each row that has no bytes ``{row in table: (column, reason)}`` (its
        value is null).

    Raises:
        SourceError: naming the file, the row and the column, when ``skip`` is False.
    """
    import pyarrow.compute as pc  # on first use: its import is a third of naiad's
    bad: dict[int, tuple[str, str]] = {}
    for i, f in enumerate(table.schema):
        if not is_media_struct(f.type):
            continue
        col = table.column(i)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) and col.num_chunks != 1 else (
            col.chunk(0) if isinstance(col, pa.ChunkedArray) else col)
        data = pc.struct_field(col, "bytes")
        if col.null_count:  # a null struct: no bytes, no path
            data = pc.if_else(col.is_valid(), data, pa.nulls(len(col), data.type))
        missing = np.flatnonzero(data.is_null().to_numpy(zero_copy_only=False))
        if missing.size:
            paths = pc.struct_field(col, "path").to_pylist()  # the rows that need a file are few, or all
            values = data.to_pylist()
            for r in missing.tolist():
                where = paths[r] if col[r].is_valid else None
                value, reason = _read_media_file(where, path, store, access)
                if value is None:
                    if not skip:
                        raise SourceError(f"row {first_row + r}: {reason}; pass on_bad_rows='skip' to skip such rows.",
                                          path=path, column=f.name)
                    bad[r] = (f.name, reason)
                values[r] = value
            data = pa.array(values, data.type)
        table = table.set_column(i, pa.field(f.name, data.type, metadata=f.metadata), data)
    return table, bad


def _read_media_file(where: str | None, table_path: str, store: Storage, access: MediaAccess) -> tuple[bytes | None, str]:
    """The bytes of the file a media struct's ``path`` names, or (None, why not)."""
    if not where:
        return None, "neither bytes nor a path"
    url, refused = locate_media(where, table_path, access)
    if url is None:
        return None, f"no bytes, and {refused}"
    try:
        if storage_mod.is_remote(url):
            info = store.stat(url)
            if not info.is_file:
                return None, f"no bytes, and its path {where!r} names a folder, not a file"
            size = info.size
            if size > access.max_bytes:
                return None, (f"no bytes, and the file at its path {where!r} holds {size:,} bytes, more than "
                              f"the reader's MediaAccess(max_bytes={access.max_bytes:,})")
            return store.read_range(url, 0, size), ""
        return read_local_file(url, access.max_bytes), ""
    except (SourceError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return None, f"no bytes, and the file at its path {where!r} cannot be read ({why})"
