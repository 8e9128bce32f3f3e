"""Shared by the tokenize tests: a byte-level BPE trained here on generated text, and the text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ["alpha", "beta", "gamma", "delta", "naiad", "river", "token", "pack", "window", "résumé", "über", "数据"]


def make_documents(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 0 to 80 words (some empty), different lengths, some with newlines."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, int(rng.integers(0, 80))).tolist()
        if i % 7 == 3:
            words.insert(len(words) // 2, "\n")
        docs.append(f"doc{i} " + " ".join(words) if i % 11 else " ".join(words))
    return docs


def train_tokenizer(docs: list[str], path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE with ``<|endoftext|>`` trained on ``docs``, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))
    return path


def write_jsonl(docs: list[str], folder: Path, files: int = 2) -> list[Path]:
    """``docs`` split over ``files`` JSONL files, with an ``id`` column beside ``text``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f, part in enumerate(np.array_split(np.arange(len(docs)), files)):
        p = folder / f"part{f}.jsonl"
        p.write_text("".join(json.dumps({"id": int(i), "text": docs[i]}) + "\n" for i in part), encoding="utf-8")
        paths.append(p)
    return paths


def write_parquet(docs: list[str], folder: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "docs.parquet"
    pq.write_table(pa.table({"id": np.arange(len(docs)), "text": docs}), p, row_group_size=97)
    return p


def documents_of(batches: list[dict], eos: int) -> list[tuple[int, ...]]:
    """The documents a run of packed batches trained on: each batch's labels (padding dropped)
    are its stream less the leading EOS, so they split at EOS into the documents' ids."""
    out: list[tuple[int, ...]] = []
    for b in batches:
        labels = b["labels"].reshape(-1).numpy()
        stream = labels[labels != -100]
        ends = np.flatnonzero(stream == eos)
        assert len(stream) == 0 or stream[-1] == eos
        out += [tuple(x.tolist()) for x in np.split(stream, ends + 1)[:-1]]
    return out
