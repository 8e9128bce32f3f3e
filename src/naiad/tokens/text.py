"""Raw text as packed training windows: :func:`tokenize`, a transform of any text source.

NOTE [ Packing per batch ]
Packing turns N documents into a number of windows that is only known once they are tokenized,
and a window may hold the end of one document and the start of the next. Where the packing state
lives decides what a resume can promise. naiad packs *within each batch of documents*: a batch of
B documents (the loader's ``batch_size`` counts documents) becomes its own stream

    EOS, doc_1, EOS, doc_2, EOS, ..., doc_B, EOS

cut into windows of ``seq_len + 1`` tokens that share one token (as ``read_tokens`` cuts a file),
the last window padded (input EOS, label -100). Nothing is carried from one batch to the next, so
the windows are a pure function of the batch's documents, and the batch's documents are a pure
function of the plan: an exact resume delivers the same windows, an elastic one packs each of the
new batches from its own documents, every document once, and the loader's state stays what it is
for the text source (no carry to record). The leading EOS makes every token of every document,
and each document's closing EOS, a label exactly once (a stream's first token is never a label).
The price is the padding of one window per batch, on average half a window: measured in
docs/TOKENS.md ("Packing and its padding"); larger batches of documents make it smaller. The
number of windows per batch varies with the documents' lengths. Packing across batches instead
would give fixed shapes but needs the carry (the tail of the previous batch, which depends on
every batch before it on that rank) in the state, and cannot hand a carry over to a new world
size.

NOTE [ Tokenizing in the workers ]
The tokenizer runs where the source is read: :class:`TokenizedSource` wraps a text source, and
its reads (the workers' tasks, or the read-ahead threads with ``num_workers=0``) return, per
document, its token ids with the EOS after them, as bytes (uint16 when the vocabulary fits, else
uint32): one small value per row that crosses processes cheaply. ``naiad.DataLoader`` wraps the
source when the transform declares it (``Tokenize.placement``: the loop, with a ``wrap``, NOTE
[ Transform placement ] in transforms.py); the transform, in the training process, then only packs (NumPy over the batch). Rows are still documents, so the
plan, the shuffle buffer, resume and elastic resume are the text source's, unchanged. The
tokenizer is loaded once per process (kept on the transform, never pickled: workers rebuild it
from its JSON at their first batch); ``encode_batch`` is parallel in Rust and releases the GIL.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from naiad.errors import ConfigError, SourceError
from naiad.sources.base import Block, BlockData, Source, bad_entry
from naiad.sources.wrapper import Asked, FormatWrapper
from naiad.tokens.windows import document_ids, position_ids
from naiad.transforms import Placement

__all__ = ["TOKENS_COLUMN", "TokenizedSource", "Tokenize", "load_tokenizer", "pack_windows", "tokenize"]

TOKENS_COLUMN = "__tokens__"
"""The column a :class:`TokenizedSource` reads: each document's token ids and its EOS, as bytes."""

_INSTALL = "pip install 'naiad[text]'"
_EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
IGNORE_INDEX = -100


def load_tokenizer(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from itself or a path to a ``tokenizer.json``.

    Raises:
        ConfigError: tokenizers is not installed, the path does not exist, the file is not a
            tokenizer, or ``tokenizer`` is something else.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ConfigError(f"naiad.tokenize needs the `tokenizers` package, which is not installed: {_INSTALL}.") from exc
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if not os.path.isfile(path):
            raise ConfigError(f"`tokenizer` must be a tokenizers.Tokenizer or the path of a tokenizer.json; "
                              f"{path!r} does not exist.")
        try:
            return Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises its own Exception type
            raise ConfigError(f"`tokenizer`: {path!r} is not a tokenizer.json that tokenizers can load "
                              f"({type(exc).__name__}: {exc}).") from None
    raise ConfigError(f"`tokenizer` must be a tokenizers.Tokenizer or the path of a tokenizer.json, "
                      f"got {type(tokenizer).__name__}.")


def _eos_of(tok: Any, eos_id: int | None) -> int:
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if eos_id is not None:
        if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)) or not 0 <= eos_id < vocab:
            raise ConfigError(f"`eos_id` must be a token id of the tokenizer (0 to {vocab - 1}), got {eos_id!r}.")
        return int(eos_id)
    for name in _EOS_NAMES:
        found = tok.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(f"the tokenizer has none of the end-of-document tokens naiad looks for ({', '.join(_EOS_NAMES)}); "
                      "pass `eos_id=` (the id of the token that separates documents).")


class Tokenize:
    """The transform made by :func:`tokenize`: a batch of documents to packed windows.

    Picklable: it carries the tokenizer as its JSON and loads it once per process, at first use.
    Called on a batch whose ``column`` holds text, it tokenizes and packs; on a batch a
    :class:`TokenizedSource` read (tokenized in the workers), it only packs.

    Attributes:
        column: the text column.
        seq_len: tokens per training sequence (a window holds ``seq_len + 1``).
        pack: True: a batch's documents share windows; False: each document its own windows.
        eos_id: the end-of-document token put after every document.
        dtype: uint16 when the vocabulary fits, else uint32 (how tokens travel and are stored).
    """

    def __init__(self, tokenizer: Any, column: str, seq_len: int, pack: bool, eos_id: int | None) -> None:
        tok = load_tokenizer(tokenizer)
        self.column = column
        self.seq_len = seq_len
        self.pack = pack
        self.eos_id = _eos_of(tok, eos_id)
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)
        self._json = tok.to_str()
        self._tok: Any = tok
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tok"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Tokenize(column={self.column!r}, seq_len={self.seq_len}, pack={self.pack}, eos_id={self.eos_id}, "
                f"vocab={self.vocab_size})")

    @property
    def tokenizer(self) -> Any:
        """This process's tokenizer: loaded from its JSON once per process, never per batch."""
        if self._tok is None:
            with self._lock:
                if self._tok is None:
                    from tokenizers import Tokenizer

                    self._tok = Tokenizer.from_str(self._json)
        return self._tok

    # -- the two halves: tokenize (in the workers), pack (anywhere) ----------------------------

    def encode(self, texts: Sequence[Any] | np.ndarray, where: Callable[[int], tuple[str, int | None, str]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``texts`` tokenized: one flat array of every document's ids each followed by EOS (in
        :attr:`dtype`), and each document's length in it (EOS included).

        Raises:
            SourceError: a document that is not a string or that the tokenizer refuses, named by
                ``where(i)`` (its file and line or row) when given, else by its index.
        """
        texts = texts.tolist() if isinstance(texts, np.ndarray) else list(texts)
        tok = self.tokenizer
        fast = getattr(tok, "encode_batch_fast", None)  # tokenizers >= 0.20: no offsets computed
        try:
            encodings = (fast or tok.encode_batch)(texts, add_special_tokens=False)
        except Exception as exc:  # TypeError for a non-string, the Rust side's own Exception otherwise
            raise self._failure(texts, where, exc) from None
        ids = [e.ids for e in encodings]
        lens = np.fromiter(map(len, ids), np.int64, count=len(ids))
        n = int(lens.sum())
        out = np.empty(n + len(ids), self.dtype)
        ends = np.cumsum(lens + 1)
        body = np.ones(len(out), bool)
        body[ends - 1] = False
        out[~body] = self.eos_id
        out[body] = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, count=n)
        return out, lens + 1

    def failures(self, texts: Sequence[Any]) -> list[tuple[int, str]]:
        """Every document of ``texts`` the tokenizer cannot take, with why: not a string, or
        refused by the tokenizer (the error path only: one document at a time)."""
        out: list[tuple[int, str]] = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                out.append((i, f"`{self.column}` is {type(text).__name__} {text!r:.60}, not a string"))
                continue
            try:
                self.tokenizer.encode(text, add_special_tokens=False)
            except Exception as one:  # the Rust side raises its own Exception type
                out.append((i, f"the tokenizer failed: {type(one).__name__}: {one}"))
        return out

    def _failure(self, texts: list[Any], where: Callable[[int], tuple[str, int | None, str]] | None, exc: BaseException) -> SourceError:
        found = self.failures(texts)
        if not found:
            return SourceError(f"the tokenizer failed on a batch of {len(texts)} documents: {type(exc).__name__}: {exc}.")
        bad, reason = found[0]
        if where is None:
            return SourceError(f"document {bad} of the batch: {reason}.")
        path, line, place = where(bad)
        return SourceError(f"{place}{reason}; tokenize only text (drop or fix the document, or read with "
                           "on_bad_rows='skip').", path=path, line=line)

    def documents(self, texts: Sequence[Any] | np.ndarray, where: Callable[[int], tuple[str, int | None, str]] | None = None) -> list[bytes]:
        """Each document's ids and EOS as bytes (what :class:`TokenizedSource` reads)."""
        flat, lens = self.encode(texts, where)
        raw, size = flat.tobytes(), flat.dtype.itemsize
        ends = (np.cumsum(lens) * size).tolist()
        return [raw[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def pack_documents(self, pieces: Sequence[bytes]) -> dict[str, torch.Tensor]:
        """Windows from documents tokenized by :meth:`documents` (NOTE [ Packing per batch ])."""
        flat = np.frombuffer(b"".join(pieces), self.dtype)
        lens = np.fromiter(map(len, pieces), np.int64, count=len(pieces)) // self.dtype.itemsize
        return pack_windows(flat, lens, self.seq_len, self.eos_id, pack=self.pack)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """A batch of documents (``batch[column]``: text; or read tokenized) as windows."""
        if TOKENS_COLUMN in batch:
            return self.pack_documents(batch[TOKENS_COLUMN])
        if self.column not in batch:
            raise ConfigError(f"naiad.tokenize(column={self.column!r}): the batch has no such column; it has "
                              f"{sorted(batch)}. Pass the text column's name as `column=`.")
        flat, lens = self.encode(batch[self.column])
        return pack_windows(flat, lens, self.seq_len, self.eos_id, pack=self.pack)

    def placement(self) -> Placement:
        """Packs in the loop; a streaming source is read through :meth:`read_tokenized`, so the
        tokenizer runs in the reads (NOTE [ Tokenizing in the workers ], NOTE [ Transform
        placement ] in transforms.py)."""
        return Placement("loop", column=self.column, wrap=self.read_tokenized)

    def read_tokenized(self, source: Any) -> Any:
        """``source`` read tokenized (a :class:`TokenizedSource`) when it is a text
        :class:`~naiad.Source`; anything else as it is."""
        if not isinstance(source, Source) or isinstance(source, TokenizedSource):
            return source
        return TokenizedSource(source, self)


def pack_windows(flat: np.ndarray, lens: np.ndarray, seq_len: int, eos_id: int, *, pack: bool = True) -> dict[str, torch.Tensor]:
    """Documents (``flat``: each one's ids and its EOS, ``lens`` long) as training windows.

    ``pack=True``: one stream ``EOS, doc_1, EOS, ..., doc_B, EOS``; ``pack=False``: one stream
    ``EOS, doc, EOS`` per document. Each stream is cut into windows of ``seq_len + 1`` tokens that
    share one token, its last window padded with EOS inputs and -100 labels (NOTE [ Packing per
    batch ]). Vectorized: the windows are gathered with one fancy index.

    Returns:
        ``input_ids``, ``labels``, ``position_ids``, ``document_ids``: int64 ``[W, seq_len]``.
    """
    lens = np.asarray(lens, np.int64)
    if pack:
        streams = np.concatenate(([eos_id], flat)).astype(np.int64, copy=False)
        seg_lens = np.array([len(streams)] if len(lens) else [], np.int64)
    else:
        starts = np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else np.zeros(0, np.int64)
        streams = np.insert(flat.astype(np.int64), starts, eos_id)
        seg_lens = lens + 1
    seg_ends = np.cumsum(seg_lens)
    seg_starts = seg_ends - seg_lens
    per_seg = np.maximum((seg_lens - 1 + seq_len - 1) // seq_len, 0)
    seg_of = np.repeat(np.arange(len(seg_lens)), per_seg)
    k = np.arange(len(seg_of)) - np.repeat(np.cumsum(per_seg) - per_seg, per_seg)
    index = (seg_starts[seg_of] + k * seq_len)[:, None] + np.arange(seq_len + 1)
    valid = index < seg_ends[seg_of][:, None]
    windows = np.where(valid, streams[np.minimum(index, max(len(streams) - 1, 0))] if len(streams) else eos_id, eos_id)
    inputs = np.ascontiguousarray(windows[:, :-1])
    labels = np.where(valid[:, 1:], windows[:, 1:], IGNORE_INDEX)
    return {
        "input_ids": torch.from_numpy(inputs),
        "labels": torch.from_numpy(np.ascontiguousarray(labels)),
        "position_ids": torch.from_numpy(position_ids(inputs, eos_id)),
        "document_ids": torch.from_numpy(document_ids(inputs, eos_id)),
    }


def tokenize(tokenizer: Any, column: str = "text", *, seq_len: int, pack: bool = True, eos_id: int | None = None) -> Tokenize:
    """Tokenize a text source's documents in the workers and pack them into training windows.

    Give it as the ``transform=`` of a :class:`naiad.DataLoader` over any text source
    (``naiad.read_jsonl``, ``read_parquet``, ``read_text``): the loader reads the source
    tokenized, in its workers (NOTE [ Tokenizing in the workers ]), and the transform packs each
    batch of documents into windows (NOTE [ Packing per batch ]). ``batch_size`` counts
    documents; a batch is ``{"input_ids", "labels", "position_ids", "document_ids"}``, int64
    ``[W, seq_len]``, as :func:`naiad.read_tokens` gives with ``eos_id``, where ``W`` is the
    number of windows the batch's documents fill; the last window of each batch is padded (label
    -100), so every token of every document is a label once per epoch. Every document once per
    epoch across ranks and workers; exact and elastic resume as for the text source.
    docs/TOKENS.md, "Raw text".

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json``.
        column: the text column.
        seq_len: tokens per training sequence.
        pack: True: a batch's documents share windows; False: every document starts a window.
        eos_id: the token put after every document; None: the tokenizer's own end-of-text
            token (``<|endoftext|>``, ``</s>``, ...).

    Raises:
        ConfigError: tokenizers not installed, a tokenizer path that does not exist or does not
            load, a bad ``seq_len``, no end-of-document token.

    Example:
        >>> docs = naiad.read_jsonl("corpus/*.jsonl")  # doctest: +SKIP
        >>> loader = naiad.DataLoader(docs, batch_size=64, shuffle=True, seed=0, num_workers=2,
        ...                           transform=naiad.tokenize("tokenizer.json", seq_len=1024))  # doctest: +SKIP
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
        raise ConfigError(f"`seq_len` must be an int >= 1, got {seq_len!r}.")
    if not isinstance(column, str):
        raise ConfigError(f"`column` must be the text column's name, got {column!r}.")
    return Tokenize(tokenizer, column, int(seq_len), bool(pack), eos_id)


class TokenizedSource(FormatWrapper):
    """A text source read tokenized: its rows, blocks, traits and plan are the text source's
    (NOTE [ Format wrappers ] in sources/wrapper.py); each read returns one column,
    :data:`TOKENS_COLUMN`, each document's ids and EOS as bytes (NOTE [ Tokenizing in the
    workers ]).

    Raises:
        ConfigError: at construction, when the source has no such text column.
    """

    def __init__(self, inner: Source, tokenize: Tokenize) -> None:
        names = inner.column_names
        if tokenize.column not in names:
            raise ConfigError(f"naiad.tokenize(column={tokenize.column!r}): the source has no such column; it has "
                              f"{names}. Pass the text column's name as `column=`.")
        super().__init__(inner)
        self.tokenize = tokenize

    def __repr__(self) -> str:
        return f"TokenizedSource({self.inner!r}, {self.tokenize!r})"

    def _read_schema(self) -> pa.Schema:
        return pa.schema([(TOKENS_COLUMN, pa.binary())])

    def transform(self, data: BlockData, asked: Asked) -> BlockData:
        """The inner's read of documents as their tokens; with ``on_bad_rows="skip"`` a document
        the tokenizer cannot take is skipped as a bad row, keeping its position (NOTE [ Bad rows
        keep their positions ])."""
        lines = self.traits.line_numbers  # a block's first line is 1-based, one row a line; else its first row, 0-based

        def kept() -> list[tuple[int, Block, int]]:  # the rows returned: (position asked, block, row)
            skipped = {int(e["at"]) for e in data.bad}
            return [(j, b, r) for j, (b, r) in enumerate(asked()) if j not in skipped]

        def where(i: int) -> tuple[str, int | None, str]:
            _, block, row = kept()[i]
            if lines:
                return block.path, block.first_line + row, ""
            return block.path, None, f"row {block.first_line + row}: "

        texts = data.columns[self.tokenize.column]
        try:
            return BlockData({TOKENS_COLUMN: self.tokenize.documents(texts, where)}, data.bad)
        except SourceError:
            if self.on_bad_rows != "skip":
                raise
        texts = texts.tolist() if isinstance(texts, np.ndarray) else list(texts)
        found = dict(self.tokenize.failures(texts))
        rows = kept()
        bad = list(data.bad)
        for i, reason in found.items():
            at, block, row = rows[i]
            number = block.first_line + row
            bad.append(bad_entry(at, block.path, reason, line=number if lines else None,
                                 row=None if lines else number, column=self.tokenize.column))
        bad.sort(key=lambda e: int(e["at"]))
        good = [t for i, t in enumerate(texts) if i not in found]
        return BlockData({TOKENS_COLUMN: self.tokenize.documents(good, where) if good else []}, tuple(bad))


def iter_documents(tokenize_: Tokenize, source: Source) -> Iterator[tuple[np.ndarray, np.ndarray, tuple[dict[str, Any], ...]]]:
    """Every document of ``source`` in file order, tokenized a block at a time: ``(flat, lens,
    bad)``, ``flat`` and ``lens`` as :meth:`Tokenize.encode` returns them, ``bad`` the rows skipped
    (``on_bad_rows="skip"``; for ``naiad convert --tokenize``)."""
    wrapped = TokenizedSource(source, tokenize_)
    for block in source.blocks():
        data = wrapped.read_block(block, use_threads=True)
        pieces = data.columns[TOKENS_COLUMN]
        flat = np.frombuffer(b"".join(pieces), tokenize_.dtype)
        lens = np.fromiter(map(len, pieces), np.int64, count=len(pieces)) // tokenize_.dtype.itemsize
        yield flat, lens, data.bad
