"""``naiad convert SRC DST --tokenize tokenizer.json``: text to token shards that
:func:`naiad.read_tokens` reads (docs/CONVERT.md, "Token shards"; docs/TOKENS.md).

NOTE [ Token shards ]
Each shard is a ``.npy`` file of one 1-D array, ``tokens-00000.npy``, ...: the documents in input
order, each followed by the tokenizer's end-of-document token (as nanoGPT's ``prepare.py``
writes ``train.bin``), uint16 when the vocabulary fits, else uint32 (a ``.npy`` header names its
dtype, so ``read_tokens`` needs no ``dtype=``; modded-nanogpt's header format holds uint16 only).
Beside it, ``offsets/tokens-00000.npy``: int64, each document's first token and, last, the
token count, so document ``i`` is ``tokens[off[i]:off[i + 1]]`` (in a subfolder, so that
``read_tokens("out/")`` and ``"out/*.npy"`` read only the tokens). A document never spans two
shards: a shard closes at the first document end past ``tokens_per_shard``. Every file is
written under a temporary name and renamed whole; ``manifest.json``, written last, lists the
shards with their tokens, documents, bytes and SHA-256, and the tokenizer (its SHA-256, EOS id,
vocabulary size).
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.sources.base import Source
from naiad.sources.storage import Storage, is_remote
from naiad.tokens.text import Tokenize, iter_documents
from naiad.tools.convert_write import Destination

__all__ = ["TOKENS_MANIFEST_VERSION", "TokenShard", "convert_tokens"]

TOKENS_MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
OFFSETS = "offsets"


@dataclass
class TokenShard:
    """One written shard, as the manifest lists it."""

    file: str
    tokens: int
    documents: int
    bytes: int
    sha256: str
    offsets: str
    offsets_sha256: str

    def as_dict(self) -> dict[str, Any]:
        """The manifest's entry."""
        return dict(self.__dict__)


def _write_npy(folder: Destination, name: str, array: np.ndarray) -> tuple[int, str]:
    """``array`` saved as ``name`` in ``folder`` through a temporary name: (bytes, SHA-256)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getbuffer()
    folder.write_bytes(name, data)
    return len(data), hashlib.sha256(data).hexdigest()


def convert_tokens(source: Source, dst: str, tokenize: Tokenize, *, tokens_per_shard: int | None = None,
                   overwrite: bool = False, tokenizer_path: str | None = None,
                   progress: Callable[[str, int, int, int], None] | None = None) -> dict[str, Any]:
    """Tokenize ``source``'s documents (``tokenize.column``) into token shards in the folder
    ``dst`` (NOTE [ Token shards ]); returns the manifest it wrote.

    Raises:
        ConfigError: a URL destination, shards already there without ``overwrite``, a bad
            ``tokens_per_shard``.
        SourceError: a document that is not text, or that the tokenizer refuses, naming its file
            and line or row.
    """
    if is_remote(dst):
        raise ConfigError(f"naiad convert --tokenize writes to a local folder; got {dst!r}. Convert locally, then copy "
                          "the folder (its manifest lists every file with its SHA-256).")
    if tokens_per_shard is not None and (isinstance(tokens_per_shard, bool) or tokens_per_shard < 1):
        raise ConfigError(f"`tokens_per_shard` must be an int >= 1 or None (one shard), got {tokens_per_shard!r}.")
    began = time.monotonic()
    # Local folders (made here): the files go through temporary names, as every shard does.
    out = Destination(dst, "parquet", sharded=True, storage=Storage())
    out_offsets = Destination(os.path.join(dst, OFFSETS), "parquet", sharded=True, storage=Storage())
    existing = sorted(n for n in os.listdir(dst) if n == MANIFEST or (n.startswith("tokens-") and n.endswith(".npy")))
    if existing and not overwrite:
        raise ConfigError(f"{os.path.join(dst, existing[0])} exists; pass --overwrite (overwrite=True) to replace it "
                          f"and the other {len(existing) - 1} file(s).")
    total_rows = len(source)
    writer = _ShardWriter(out, out_offsets, tokenize.dtype, tokens_per_shard)
    shards = writer.shards
    rows = bad_rows = 0
    bad_examples: list[dict[str, Any]] = []
    for flat, doc_lens, bad in iter_documents(tokenize, source):
        rows += len(doc_lens) + len(bad)
        bad_rows += len(bad)
        bad_examples += [{k: v for k, v in e.items() if k != "at"} for e in bad[:max(0, 20 - len(bad_examples))]]
        writer.add(flat, doc_lens)
        if progress:
            progress("convert", rows, total_rows, sum(s.bytes for s in shards))
    writer.finish()
    for name in existing:  # stale shards of an earlier, larger convert
        if name != MANIFEST and name not in {s.file for s in shards}:
            os.unlink(os.path.join(dst, name))
            stale = os.path.join(dst, OFFSETS, name)
            if os.path.exists(stale):
                os.unlink(stale)
    tok_json = tokenize.tokenizer.to_str().encode()
    manifest = {
        "version": TOKENS_MANIFEST_VERSION,
        "format": "tokens",
        "dtype": str(tokenize.dtype),
        "eos_id": tokenize.eos_id,
        "tokens": sum(s.tokens for s in shards),
        "documents": sum(s.documents for s in shards),
        "bad_rows": bad_rows,
        "bad_row_examples": bad_examples,
        "shards": [s.as_dict() for s in shards],
        "tokenizer": {"path": tokenizer_path, "sha256": hashlib.sha256(tok_json).hexdigest(),
                      "vocab_size": tokenize.vocab_size, "column": tokenize.column},
        "source": {"paths": list(source.paths), "rows": total_rows},
        "seconds": round(time.monotonic() - began, 3),
        "naiad": _version(),
    }
    out.write_json(MANIFEST, manifest)
    return manifest


class _ShardWriter:
    """Documents' tokens into shards of about ``tokens_per_shard`` (None: one shard), each cut
    at the first document end past the limit: a document stays in one shard."""

    def __init__(self, out: Destination, out_offsets: Destination, dtype: np.dtype,
                 tokens_per_shard: int | None) -> None:
        self.out, self.out_offsets, self.dtype, self.limit = out, out_offsets, dtype, tokens_per_shard
        self.shards: list[TokenShard] = []
        self.pending: list[np.ndarray] = []
        self.lens: list[np.ndarray] = []
        self.held = 0

    def add(self, flat: np.ndarray, doc_lens: np.ndarray) -> None:
        """One read's documents: ``flat``, their tokens end to end, ``doc_lens`` their lengths."""
        if self.limit is None:
            self.pending.append(flat)
            self.lens.append(doc_lens)
            return
        ends = np.cumsum(doc_lens)
        at = 0
        while at < len(doc_lens):
            base = int(ends[at - 1]) if at else 0
            cut = int(np.searchsorted(ends, base + self.limit - self.held, side="left")) + 1
            cut = min(max(cut, at + 1), len(doc_lens))
            piece = flat[base:int(ends[cut - 1])]
            self.pending.append(piece)
            self.lens.append(doc_lens[at:cut])
            self.held += len(piece)
            at = cut
            if self.held >= self.limit:
                self.close()

    def close(self) -> None:
        """The tokens held so far as the next shard, with its documents' offsets beside it."""
        name = f"tokens-{len(self.shards):05d}.npy"
        tokens = np.concatenate(self.pending) if self.pending else np.zeros(0, self.dtype)
        doc_lens = np.concatenate(self.lens) if self.lens else np.zeros(0, np.int64)
        offsets = np.concatenate(([0], np.cumsum(doc_lens))).astype(np.int64)
        size, sha = _write_npy(self.out, name, tokens)
        _, osha = _write_npy(self.out_offsets, name, offsets)
        self.shards.append(TokenShard(name, len(tokens), len(doc_lens), size, sha, f"{OFFSETS}/{name}", osha))
        self.pending, self.lens, self.held = [], [], 0

    def finish(self) -> None:
        """The last shard (an input with no documents gives one empty shard)."""
        if self.pending or not self.shards:
            self.close()


def read_manifest(paths: str | Sequence[str]) -> dict[str, Any] | None:
    """The token manifest of a folder ``naiad convert --tokenize`` wrote, when ``paths`` is that
    folder or its manifest; else None."""
    import json

    if not isinstance(paths, (str, os.PathLike)) or is_remote(str(paths)):
        return None
    p = os.fspath(paths)
    if not (os.path.isdir(p) or os.path.basename(p) == MANIFEST):  # a glob or some files: what they name
        return None
    folder = p if os.path.isdir(p) else os.path.dirname(p)
    manifest = os.path.join(folder, MANIFEST)
    if not os.path.isfile(manifest):
        return None
    try:
        with open(manifest) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("format") == "tokens" else None


def _version() -> str:
    from naiad._version import __version__

    return __version__
