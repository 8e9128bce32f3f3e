"""``naiad convert`` for samples: an image folder, WebDataset tar shards or a table with bytes,
a block at a time, to tar shards that the ``webdataset`` library reads or to Parquet (or Arrow)
that Hugging Face ``datasets`` reads, optionally with large images made smaller
(``max_size``) or small ones stored decoded (``decode``). docs/CONVERT.md, "Samples".

NOTE [ Sample conversion ]
:class:`SampleBatches` turns each block the reader gives (columns of keys, bytes, labels) into
one Arrow record batch of the output's schema; the rest of ``convert`` (the external shuffle,
the shard writers, the manifest) handles those batches as it handles a table's. The schema is
fixed before the first shard is opened, from the source's schema and a peek at its first rows
(which bytes columns hold images; with ``decode``, the first image's size and mode), so a
shuffle can spill and every shard has the same columns.

- Keys: the source's ``__key__``; an image folder's file path under its root without its
  suffix (``cat/001``, as WebDataset keys a folder's files); else, for tar shards, the row's
  number in the input (a table written as a table gets no key column it did not have). A dot in a key's last part becomes ``_``: WebDataset cuts the key at the first dot of the
  base name, so ``img.v2`` would read back as the key ``img``.
- Parquet and Arrow: an image column becomes the ``{bytes, path}`` struct of ``datasets``'
  ``Image`` feature, a folder's ``label`` a ``ClassLabel`` with the class names, and the
  features are written in the schema's ``huggingface`` metadata, as ``datasets`` writes them.
- Tar: one ``<key>.<ext>`` member per column (convert_tar.py): an image's extension from its
  format, ``label`` as ``cls``, other integers under their names, text as ``txt``, JSON as
  ``json``.
- ``max_size``: images whose longer side exceeds it are shrunk and encoded again
  (``sample_media.shrink``), ``decode``: images decoded by ``naiad.decode_images`` into a uint8
  ``[C, H, W]`` per row, stored as ``fixed_size_binary`` of C*H*W bytes with ``naiad.shape``
  ``[C, H, W]`` in its field's metadata, so naiad's readers hand back ``[B, C, H, W]`` as
  ``decode_images`` does (``columns.is_pixel_field``). Not a fixed-size list of uint8: Parquet
  decodes a list value by value (a repetition level each), some ten times slower than the
  same bytes as one binary value per row; ``datasets`` reads the column as bytes.
  Both run on the decode threads (NOTE [ Decode threads ]); an image that fails is a bad row,
  named by its file and key, raised or skipped as ``on_bad_rows`` says.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from naiad.errors import ConfigError, DecodeError, SourceError
from naiad.media.image_options import MODES
from naiad.media.images import decode_images
from naiad.media.rows import default_threads, run_rows
from naiad.sources.base import Source
from naiad.sources.columns import SHAPE_KEY, Columns, pixel_array
from naiad.sources.images import ImageFolderSource
from naiad.sources.parquet import ParquetSource, open_parquet
from naiad.sources.samples import MAX_BLOCK_BYTES, MIN_BLOCK_BYTES
from naiad.sources.webdataset import KEY, WebDatasetSource
from naiad.tools.convert_tar import member_field
from naiad.tools.sample_media import IMAGE_FORMATS, decode_mode, image_header, media_format, shrink

__all__ = ["LAYOUT_KEY", "SampleBatches", "checked_schema", "is_sample_source", "sample_group_rows"]

LAYOUT_KEY = b"naiad.layout"
"""A decoded pixel column's metadata: the axes of ``naiad.shape`` (``CHW``)."""

_PEEK_ROWS = 16
_KIND = b"naiad.kind"


def is_sample_source(source: Source, fmt: str) -> bool:
    """Whether a convert is one of samples: the source is a folder or tar shards, the output is
    tar shards, or the source has a column of bytes."""
    if isinstance(source, (ImageFolderSource, WebDatasetSource)) or fmt == "webdataset":
        return True
    return any(_is_binary(f.type) for f in source.schema())


def sample_group_rows(total_rows: int, row_bytes: int) -> int:
    """Rows per row group for samples of about ``row_bytes`` each: groups of about 1/4096 of the
    output's bytes, between 1 MiB and 32 MiB, as the readers of samples cut their blocks (NOTE
    [ Sample blocks ]), and never past 65,536 rows."""
    target = min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, total_rows * row_bytes // 4096))
    return int(min(1 << 16, max(1, target // max(1, row_bytes))))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def checked_schema(source: Source, columns: Sequence[str] | None) -> pa.Schema:
    """The source's schema, once every column of ``columns`` (None: all) is one of it.

    Raises:
        SourceError: a column it does not have, naming them and the ones it has.
    """
    schema = source.schema()
    unknown = [c for c in columns or () if c not in schema.names]
    if unknown:
        raise SourceError(f"unknown column(s) {unknown} in `columns`; the source has {schema.names}.",
                          path=source.paths[0])
    return schema


class SampleBatches:
    """A source's blocks as record batches of the output's schema (NOTE [ Sample conversion ]).

    Attributes:
        schema: the output's schema.
        images: the columns that hold encoded images.
        decoded: with ``decode``, ``{"shape": [C, H, W], "mode": ...}`` of the pixel columns.
        bad_examples: the first bad samples dropped (their file, key, column and reason).
        bad_rows: how many bad samples were dropped here (beyond the reader's own).
    """

    def __init__(self, source: Source, fmt: str, *, columns: Sequence[str] | None, max_size: int | None,
                 quality: int, decode: bool, mode: str | None, on_bad_rows: str, total_rows: int) -> None:
        self.source = source
        self.fmt = fmt
        self.max_size = max_size
        self.quality = quality
        self.decode = decode
        self.skip = on_bad_rows == "skip"
        self.bad_rows = 0
        self.bad_examples: list[dict[str, Any]] = []
        self.folder = source if isinstance(source, ImageFolderSource) else None
        in_schema = checked_schema(source, columns)
        if columns is not None:
            in_schema = pa.schema([f for f in in_schema if f.name in columns or f.name == KEY])
        # A folder's absolute `path` names this machine's files: it makes the keys, not a column.
        self.fields = [f for f in in_schema if f.name != KEY and not (self.folder is not None and f.name == "path")]
        # A table without keys written as a table stays without them; samples have keys.
        self.with_key = fmt == "webdataset" or KEY in in_schema.names or self.folder is not None
        self.key_width = max(8, len(str(max(total_rows - 1, 0))))
        peek = self._peek()
        self.images = [f.name for f in self.fields if _is_binary(f.type) and _first_format(peek.get(f.name)) in IMAGE_FORMATS]
        self.mode = mode
        self.decoded: dict[str, Any] | None = None
        if decode:
            self._decode_geometry(peek)
        self.schema = self._schema()

    # -- the output's schema ------------------------------------------------------------------

    def _peek(self) -> Columns:
        """The first rows of the source (which columns hold images; the first image's size)."""
        for block in self.source.blocks():
            if block.rows:
                return self.source.read_block(block, 0, min(block.rows, _PEEK_ROWS)).columns
        return {}

    def _decode_geometry(self, peek: Columns) -> None:
        if self.fmt == "webdataset":
            raise ConfigError("`decode` stores pixels in a fixed-size column, which needs Parquet or Arrow "
                              "output; got format 'webdataset' (drop --decode, or write .parquet).")
        if not self.images:
            raise ConfigError(f"`decode` decodes image columns, and the source has none (its columns: "
                              f"{[f.name for f in self.fields]}).")
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"`mode` must be one of {sorted(MODES)}, got {self.mode!r}.")
        values = peek[self.images[0]]
        first = next((v for v in values if v is not None), None)
        if first is None:
            raise ConfigError("`decode` needs the size of the first image, and the source has no rows.")
        if self.max_size is not None:
            first = shrink(first, self.max_size, self.quality) or first
        header = image_header(first)
        mode = self.mode or decode_mode(header.mode)
        self.mode = mode
        self.decoded = {"shape": [MODES[mode], header.height, header.width], "mode": mode, "layout": "CHW",
                        "columns": list(self.images)}

    def _schema(self) -> pa.Schema:
        fields = []
        if self.with_key:
            fields.append(pa.field(KEY, pa.string()) if self.fmt != "webdataset" else member_field(KEY, pa.string(), {}))
        for f in self.fields:
            fields.append(self._tar_field(f) if self.fmt == "webdataset" else self._table_field(f))
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ConfigError(f"the output would have two columns of one name ({names}); leave one out with `columns`.")
        self._from = [f.name for f in self.fields]  # each output column's source column, in order
        schema = pa.schema(fields)
        if self.fmt != "webdataset":
            schema = schema.with_metadata({b"huggingface": json.dumps({"info": {"features": self._features(schema)}}).encode()})
        return schema

    def _table_field(self, f: pa.Field) -> pa.Field:
        if f.name in self.images:
            if self.decoded is not None:
                c, h, w = self.decoded["shape"]
                return pa.field(f.name, pa.binary(c * h * w), metadata={
                    SHAPE_KEY: json.dumps([c, h, w]).encode(), LAYOUT_KEY: b"CHW"})
            return pa.field(f.name, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        if _json(f):
            return pa.field(f.name, pa.string())
        return pa.field(f.name, f.type)

    def _tar_field(self, f: pa.Field) -> pa.Field:
        t, name = f.type, f.name
        if _is_binary(t):
            several = sum(_is_binary(g.type) for g in self.fields) > 1
            # A tar source's columns are extensions already (``jpg``, ``seg.png``); a table's are names.
            named = isinstance(self.source, WebDatasetSource)
            prefix = (name.rsplit(".", 1)[0] + ".") if named and "." in name else (f"{name}." if several and not named else "")
            return member_field(name, pa.binary(), {"media": True, "name": name if named else None, "prefix": prefix,
                                                    "fallback": name})
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            ext = "cls" if name == "label" else name
            return member_field(ext, t, {"ext": ext})
        if _json(f):
            return member_field(name, pa.string(), {"ext": name if name.rsplit(".", 1)[-1] == "json" else f"{name}.json"})
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return member_field(name, pa.string(), {"ext": name if name.rsplit(".", 1)[-1] == "txt" else f"{name}.txt"})
        raise ConfigError(f"the column {name!r} holds {t} values; tar shards hold bytes, numbers and text: "
                          "leave it out with `columns`, or write Parquet.")

    def _source_features(self) -> dict[str, Any]:
        """The ``datasets`` features a Parquet source's first file declares (a ``ClassLabel``'s
        names are kept so), or none."""
        if not isinstance(self.source, ParquetSource):
            return {}
        meta = open_parquet(self.source.paths[0], self.source.storage).schema_arrow.metadata or {}
        try:
            features = json.loads(meta[b"huggingface"])["info"]["features"]
        except (KeyError, TypeError, ValueError):
            return {}
        return features if isinstance(features, dict) else {}

    def _features(self, schema: pa.Schema) -> dict[str, Any]:
        """The ``datasets`` features of the output's columns (those it would not infer alike)."""
        features: dict[str, Any] = {}
        declared = self._source_features()
        for f in schema:
            if f.name in self.images:
                if self.decoded is None:
                    features[f.name] = {"_type": "Image"}
                else:
                    features[f.name] = {"_type": "Value", "dtype": f"fixed_size_binary[{f.type.byte_width}]"}
            elif f.name == "label" and self.folder is not None and self.folder.classes:
                features[f.name] = {"_type": "ClassLabel", "names": list(self.folder.classes)}
            elif isinstance(declared.get(f.name), dict) and declared[f.name].get("_type") == "ClassLabel":
                features[f.name] = declared[f.name]
            else:
                dtype = _VALUE_TYPES.get(str(f.type))
                if dtype is not None:
                    features[f.name] = {"_type": "Value", "dtype": dtype}
        return features

    # -- the batches ------------------------------------------------------------------------

    def convert(self, columns: Columns, positions: np.ndarray, where: str) -> tuple[pa.RecordBatch, np.ndarray]:
        """A block's columns (rows at input ``positions``, read from ``where``) as a record batch
        of :attr:`schema`, with the positions of the rows kept (bad images dropped or raised)."""
        rows = len(positions)
        keys = self._keys(columns, positions)
        files = (np.asarray(columns["path"], dtype=object) if self.folder is not None
                 else np.full(rows, where, dtype=object))
        bad: dict[int, tuple[str, str]] = {}
        for i, key in enumerate(keys.tolist()):
            if not utf8_name(key):  # a name kept with surrogate escapes (NOTE [ Names as bytes ])
                bad[i] = (KEY, f"its name {key!r} is not UTF-8, which the output's names must be; rename the file")
        values: dict[str, Any] = {f.name: columns[f.name] for f in self.fields}
        for name in self.images:
            if self.max_size is not None:
                values[name] = self._shrink(values[name], bad, name)
        pixels: dict[str, np.ndarray] = {}
        if self.decoded is not None:
            for name in self.images:
                pixels[name] = self._decode(values[name], keys, bad, name)
        keep = np.ones(rows, bool)
        if bad:
            self._bad(bad, keys, files, positions)
            keep[list(bad)] = False
        arrays = [pa.array(keys[keep].tolist(), pa.string())] if self.with_key else []
        for f, name in zip(self.schema.remove(0) if self.with_key else self.schema, self._from):
            arrays.append(self._array(f, name, values, pixels, keep, keys, files))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema), positions[keep]

    def _array(self, f: pa.Field, name: str, values: dict[str, Any], pixels: dict[str, np.ndarray],
               keep: np.ndarray, keys: np.ndarray, files: np.ndarray) -> pa.Array:
        if name in pixels:
            return pixel_array(pixels[name][keep], f)
        col = values[name]
        if isinstance(col, np.ndarray):
            col = col[keep]
        else:
            col = [v for v, k in zip(col, keep.tolist()) if k]
        if pa.types.is_struct(f.type):  # an image as datasets keeps it: its bytes and a file name
            data = pa.array(list(col), pa.binary())
            return pa.StructArray.from_arrays([data, pa.array(self._paths(col, keys[keep], files[keep]), pa.string())],
                                              fields=list(f.type))
        source_field = next(g for g in self.fields if g.name == name)
        if _json(source_field):
            return pa.array([json.dumps(v) for v in col], pa.string())
        if isinstance(col, np.ndarray) and col.dtype != object:
            return pa.array(col, f.type)
        return pa.array(list(col), f.type)

    def _paths(self, images: Any, keys: np.ndarray, files: np.ndarray) -> list[str]:
        """The ``path`` of each image's struct: a folder's file under the root, else key.ext."""
        if self.folder is not None:
            root = self.folder.root
            return [os.path.relpath(p, root).replace(os.sep, "/") for p in files.tolist()]
        out = []
        for key, data in zip(keys.tolist(), images):
            found = media_format(data)
            out.append(f"{key}.{found[1]}" if found else key)
        return out

    def _keys(self, columns: Columns, positions: np.ndarray) -> np.ndarray:
        if KEY in columns:
            raw = [str(k) for k in columns[KEY]]
        elif self.folder is not None:
            root = self.folder.root
            raw = [os.path.splitext(os.path.relpath(p, root))[0].replace(os.sep, "/") for p in columns["path"]]
        else:
            raw = [f"{p:0{self.key_width}d}" for p in positions.tolist()]
        return np.array([safe_key(k) for k in raw], dtype=object)

    def _shrink(self, images: Any, bad: dict[int, tuple[str, str]], name: str) -> np.ndarray:
        out = np.empty(len(images), dtype=object)
        max_size, quality = self.max_size, self.quality
        assert max_size is not None

        def work(i: int) -> None:
            if i in bad:
                return
            smaller = shrink(images[i], max_size, quality)
            out[i] = images[i] if smaller is None else smaller

        for i, exc in run_rows(work, len(images), default_threads()).items():
            bad.setdefault(i, (name, f"{type(exc).__name__}: {exc}"))
        return out

    def _decode(self, images: Any, keys: np.ndarray, bad: dict[int, tuple[str, str]], name: str) -> np.ndarray:
        """The images as uint8 ``[B, C, H, W]`` through ``naiad.decode_images``; one of another
        size than the first image is a bad row (the column has one shape)."""
        assert self.decoded is not None and self.mode is not None
        _, height, width = self.decoded["shape"]
        for i, exc in run_rows(lambda i: _same_size(images[i], width, height), len(images), default_threads()).items():
            bad.setdefault(i, (name, f"{type(exc).__name__}: {exc}"))
        ok = [i for i in range(len(images)) if i not in bad]
        out = np.zeros((len(images), MODES[self.mode], height, width), np.uint8)
        if not ok:
            return out
        transform = decode_images(name, size=(height, width), resize="stretch", mode=self.mode)
        batch = {name: [images[i] for i in ok], KEY: [keys[i] for i in ok]}
        try:
            decoded = transform(batch)[name].numpy()
            out[ok] = decoded
        except DecodeError as exc:
            for j, reason in zip(exc.rows, exc.reasons):
                bad.setdefault(ok[j], (name, reason))
            good = [i for j, i in enumerate(ok) if j not in set(exc.rows)]
            if good and exc.kept is not None:
                out[good] = exc.kept[name].numpy()
        return out

    def _bad(self, bad: dict[int, tuple[str, str]], keys: np.ndarray, files: np.ndarray, positions: np.ndarray) -> None:
        first = min(bad)
        column, reason = bad[first]
        if not self.skip:
            raise SourceError(f"sample {keys[first]!r} (row {int(positions[first])}), column {column!r}: {reason}; pass "
                              "--on-bad-rows skip (on_bad_rows='skip') to leave such samples out.",
                              path=str(files[first]), column=column)
        self.bad_rows += len(bad)
        for i in sorted(bad)[: max(0, 20 - len(self.bad_examples))]:
            self.bad_examples.append({"file": str(files[i]), "row": int(positions[i]), "key": str(keys[i]),
                                      "column": bad[i][0], "reason": bad[i][1]})


_VALUE_TYPES = {"string": "string", "large_string": "large_string", "int64": "int64", "int32": "int32",
                "double": "float64", "float": "float32", "bool": "bool", "binary": "binary", "uint8": "uint8"}


def _json(f: pa.Field) -> bool:
    return (f.metadata or {}).get(_KIND) == b"json"


def _first_format(values: Any) -> str | None:
    if values is None:
        return None
    for v in values:
        if v is not None:
            found = media_format(v)
            return found[0] if found else None
    return None


def _same_size(data: Any, width: int, height: int) -> None:
    header = image_header(data)
    if (header.width, header.height) != (width, height):
        raise ValueError(f"the image is {header.width}x{header.height} and the first was {width}x{height}; "
                         "--decode stores one size (give --max-size so that they agree, or leave --decode out)")


def utf8_name(name: str) -> bool:
    """Whether ``name`` is text an output can hold (not one read with surrogate escapes)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def safe_key(key: str) -> str:
    """``key`` with the dots of its last part turned into ``_`` (a tar member's key ends at its first dot)."""
    head, sep, last = key.rpartition("/")
    return f"{head}{sep}{last.replace('.', '_')}" if "." in last else key


def check_sample_options(max_size: int | None, quality: int) -> None:
    """Raise a ConfigError for a ``max_size`` or ``quality`` out of range."""
    if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
        raise ConfigError(f"`max_size` must be an int >= 1 (pixels of the longer side), got {max_size!r}.")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ConfigError(f"`quality` must be an int from 1 to 100 (JPEG quality), got {quality!r}.")


def estimated_row_bytes(source: Source, decoded: dict[str, Any] | None) -> int:
    """About how many bytes an output row takes (the row group's size follows from it)."""
    if decoded is not None:
        return max(1, int(math.prod(decoded["shape"])) * len(decoded["columns"]))
    return max(1, int(source.sample_bytes() or 1024))
