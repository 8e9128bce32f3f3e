"""Does tokenizing and packing through naiad.DataLoader keep up with the tokenizer itself?

JSONL text made here (documents of Zipf-distributed made-up words, 20 to 2,000 words each;
nothing is downloaded), a byte-level BPE trained here on it with ``tokenizers`` (vocabulary
``--vocab``), and, on the same cores, tokens per second of:

* ``bare encode_batch``: ``tokenizer.encode_batch(texts)`` over the documents already in memory,
  ``--batch`` at a time (Rust threads, the GIL released): the ceiling, with no file read, no JSON
  parse, no packing. ``encode_batch_fast`` (no offsets; what naiad calls) beside it.
* ``naiad``: ``naiad.DataLoader(naiad.read_jsonl(path), batch_size=--batch, shuffle=True, seed=0,
  transform=naiad.tokenize(tokenizer, seq_len=--seq-len))``: the file read and parsed, the
  documents tokenized where the source is read (NOTE [ Tokenizing in the workers ]) and packed
  into windows per batch, with 0 workers (the read-ahead threads), 2 thread workers and 2 worker
  processes.

Tokens are the documents' tokens (the same count for every method). Each method runs one pass
over the file per round, the methods alternating in each of ``--rounds`` rounds; medians. Also
the padding cost of packing per batch (NOTE [ Packing per batch ]): the share of label slots that
are padding, for several batch sizes and sequence lengths, over this corpus's documents.

Run: ``python bench/bench_tokenize.py [--mb 16] [--seq-len 1024] [--batch 64]``. The machines
here are shared and noisy: the load average is printed; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, markdown_table  # noqa: E402

import naiad  # noqa: E402


def make_corpus(path: str, mb: float, seed: int = 0) -> list[str]:
    """Documents of made-up words (Zipf frequencies) until ``mb`` MB, written as JSONL."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "an", "el", "is", "or", "un", "qu"]
    lex = ["".join(rng.choice(syllables, rng.integers(1, 5))) for _ in range(20000)]
    ranks = np.arange(1, len(lex) + 1)
    p = 1.0 / ranks
    p /= p.sum()
    docs: list[str] = []
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1e6:
            words = np.asarray(lex)[rng.choice(len(lex), int(rng.integers(20, 2000)), p=p)]
            text = " ".join(words.tolist()) + "."
            docs.append(text)
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            size += len(line)
    return docs


def train(docs: list[str], vocab: int, path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs[: max(1, len(docs) // 4)], trainer)
    tok.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=16.0, help="MB of JSONL text (default 16)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="documents per batch (default 64)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    print(environment())
    with tempfile.TemporaryDirectory(prefix="naiad-bench-tokenize-") as tmp:
        path, tok_path = os.path.join(tmp, "corpus.jsonl"), os.path.join(tmp, "tokenizer.json")
        docs = make_corpus(path, args.mb)
        train(docs, args.vocab, tok_path)
        tok = Tokenizer.from_file(tok_path)
        lens = np.array([len(e.ids) for e in tok.encode_batch_fast(docs, add_special_tokens=False)])
        n_tokens = int(lens.sum())
        print(f"{len(docs):,} documents, {os.path.getsize(path) / 1e6:.1f} MB, {n_tokens:,} tokens "
              f"(median {int(np.median(lens))} a document), vocab {tok.get_vocab_size()}")
        t = naiad.tokenize(tok_path, seq_len=args.seq_len)

        def bare(fast: bool) -> Callable[[], int]:
            def go() -> int:
                enc = tok.encode_batch_fast if fast else tok.encode_batch
                for i in range(0, len(docs), args.batch):
                    enc(docs[i:i + args.batch], add_special_tokens=False)
                return n_tokens
            return go

        def loader(workers: int, mode: str) -> Callable[[], int]:
            def go() -> int:
                dl = naiad.DataLoader(naiad.read_jsonl(path), batch_size=args.batch, shuffle=True, seed=0,
                                      num_workers=workers, worker_mode=mode, transform=t)
                try:
                    for _ in dl:
                        pass
                finally:
                    dl.close()
                return n_tokens
            return go

        methods: dict[str, Callable[[], int]] = {
            "bare encode_batch": bare(False),
            "bare encode_batch_fast": bare(True),
            "naiad, 0 workers": loader(0, "thread"),
            f"naiad, {args.workers} thread workers": loader(args.workers, "thread"),
            f"naiad, {args.workers} worker processes": loader(args.workers, "process"),
        }
        rates: dict[str, list[float]] = {m: [] for m in methods}
        loads = []
        for r in range(args.rounds):
            for name, fn in methods.items():
                loads.append(os.getloadavg()[0])
                began = time.perf_counter()
                n = fn()
                rates[name].append(n / (time.perf_counter() - began))
            print(f"round {r + 1}: " + ", ".join(f"{m} {rates[m][-1] / 1e6:.2f}" for m in methods), flush=True)
        base = statistics.median(rates["bare encode_batch"])
        rows = [[m, f"{statistics.median(v) / 1e6:.2f}", f"{statistics.median(v) / base:.2f}x"] for m, v in rates.items()]
        print(f"\nload average during the run: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores")
        print(markdown_table(["method", "M tokens/s", "vs bare encode_batch"], rows))

        # The padding cost of packing per batch: each batch of B documents (with their EOS, and a
        # leading EOS) fills ceil(tokens / seq_len) windows; the rest of the last is padding.
        rng = np.random.default_rng(1)
        pad_rows = []
        for seq in (512, 1024, 2048, 4096):
            cells = [seq]
            for b in (16, 64, 256):
                order = rng.permutation(len(lens))
                per = np.add.reduceat(lens[order] + 1, np.arange(0, len(order), b))
                windows = -(-per // seq)
                cells.append(f"{100 * (windows * seq - per).sum() / (windows * seq).sum():.2f}%")
            pad_rows.append(cells)
        print("\npadding, share of label slots, by seq_len and documents per batch:")
        print(markdown_table(["seq_len", "16 docs", "64 docs", "256 docs"], pad_rows))


if __name__ == "__main__":
    main()
