"""``naiad inspect`` on token files: tokens, dtype, layout, documents and windows per file.

Token files are what :func:`naiad.read_tokens` reads (flat ``.bin``, ``.npy``, modded-nanogpt's
shards, and the folders ``naiad convert --tokenize`` writes). Documents are counted from the
convert's offsets when its manifest is there, else as the end-of-document tokens (``eos_id``, or
the manifest's), which reads every token once, in chunks; without either they are not known.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from naiad.sources import storage
from naiad.sources.options import StorageLike
from naiad.tokens.windows import TokenWindows, read_tokens
from naiad.tools.convert_tokens import read_manifest

__all__ = ["TokenReport", "inspect_tokens", "looks_like_tokens"]

_CHUNK_TOKENS = 1 << 24


@dataclass
class TokenReport:
    """What ``naiad inspect`` shows for token files."""

    files: list[dict[str, Any]]
    tokens: int
    dtype: str
    seq_len: int
    windows: int
    dropped_tokens: int
    documents: int | None
    documents_from: str
    eos_id: int | None
    manifest: dict[str, Any] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data."""
        out = asdict(self)
        out.pop("manifest")
        return out

    def to_json(self) -> str:
        """The report as JSON (for ``--json``)."""
        return json.dumps(self.as_dict(), indent=2)

    def summary(self, max_files: int = 10) -> str:
        """The report as lines of text."""
        docs = f"{self.documents:,} ({self.documents_from})" if self.documents is not None else (
            "unknown (pass --eos-id to count the end-of-document tokens)")
        lines = [
            f"token files: {len(self.files)}, {self.tokens:,} tokens of {self.dtype}",
            f"documents: {docs}",
            f"windows of seq_len={self.seq_len}: {self.windows:,} ({self.windows * self.seq_len:,} training tokens; "
            f"{self.dropped_tokens:,} tokens after files' last windows are dropped)",
        ]
        for f in self.files[:max_files]:
            d = f"{f['documents']:,} documents, " if f["documents"] is not None else ""
            lines.append(f"  {f['path']}: {f['layout']}, {f['dtype']}, {f['tokens']:,} tokens, {d}{f['windows']:,} windows")
        if len(self.files) > max_files:
            lines.append(f"  ... {len(self.files) - max_files} more")
        return "\n".join(lines)


def looks_like_tokens(paths: str | Sequence[str]) -> bool:
    """Whether ``naiad inspect`` should read ``paths`` as token files without being told: a
    token folder's manifest, or ``.bin`` files (no table reader takes them)."""
    if read_manifest(paths) is not None:
        return True
    names = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return bool(names) and all(os.fspath(n).endswith(".bin") for n in names)


def inspect_tokens(paths: str | Sequence[str], *, seq_len: int = 1024, dtype: Any = None, eos_id: int | None = None,
                   storage: StorageLike = None) -> TokenReport:
    """Report on token files: tokens, dtype, documents and windows of ``seq_len`` (``storage``:
    a ``naiad.Storage`` or a dict of the filesystem's options, as the readers take)."""
    manifest = read_manifest(paths)
    target: Any = paths
    if manifest is not None and isinstance(paths, (str, os.PathLike)):
        folder = os.fspath(paths) if os.path.isdir(os.fspath(paths)) else os.path.dirname(os.fspath(paths))
        target = [os.path.join(folder, s["file"]) for s in manifest["shards"]]
        if eos_id is None:
            eos_id = manifest.get("eos_id")
    windows = read_tokens(target, seq_len=seq_len, dtype=dtype, storage=storage)
    per_doc = _documents(windows, manifest, eos_id)
    files = [{"path": f.path, "layout": f.layout, "dtype": str(f.dtype), "tokens": f.tokens,
              "documents": per_doc[i] if per_doc is not None else None, "windows": int(windows.windows_per_file[i])}
             for i, f in enumerate(windows.files)]
    dtypes = sorted({str(f.dtype) for f in windows.files})
    return TokenReport(
        files=files, tokens=windows.total_tokens, dtype="/".join(dtypes), seq_len=seq_len, windows=len(windows),
        dropped_tokens=windows.dropped_tokens, documents=None if per_doc is None else sum(per_doc),
        documents_from="the manifest's offsets" if manifest is not None else f"counted end-of-document tokens, id {eos_id}",
        eos_id=eos_id, manifest=manifest,
    )


def _documents(windows: TokenWindows, manifest: dict[str, Any] | None, eos_id: int | None) -> list[int] | None:
    if manifest is not None:
        return [int(s["documents"]) for s in manifest["shards"]]
    if eos_id is None:
        return None
    out = []
    for f, store in zip(windows.files, windows.stores, strict=True):  # one pass over each file, a chunk at a time (bounded memory)
        count = 0
        for start in range(0, f.tokens, _CHUNK_TOKENS):
            n = min(_CHUNK_TOKENS, f.tokens - start)
            raw = storage.read_range(f.path, f.offset + start * f.dtype.itemsize,
                                     f.offset + (start + n) * f.dtype.itemsize, store=store)
            count += int(np.count_nonzero(np.frombuffer(raw, f.dtype) == eos_id))
        out.append(count)
    return out
