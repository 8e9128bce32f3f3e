"""naiad.tokenize through naiad.DataLoader with real worker processes and real files: a BPE
trained here, JSONL and Parquet text, every document's tokens once per epoch across 2 ranks x 2
workers, the same windows as tokenizing the plain batches, exact and elastic (2 -> 3) resume,
padding, and the errors (a tokenizer path that does not exist, a document that is not text)."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch

import naiad
from naiad.tokens.text import TOKENS_COLUMN, TokenizedSource, pack_windows
from tests.integration.tokenizer_data import (
    documents_of,
    make_documents,
    train_tokenizer,
    write_jsonl,
    write_parquet,
)

pytest.importorskip("tokenizers")

N_DOCS = 300
SEQ = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    docs = make_documents(N_DOCS)
    tok_path = train_tokenizer(docs, root / "tokenizer.json")
    jsonl = write_jsonl(docs, root / "jsonl")
    parquet = write_parquet(docs, root / "parquet")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id("<|endoftext|>")
    expected = [tuple(e.ids) + (eos,) for e in tok.encode_batch(docs, add_special_tokens=False)]
    return {"docs": docs, "tokenizer": tok_path, "jsonl": jsonl, "parquet": parquet, "eos": eos, "expected": expected}


def source(corpus, fmt: str) -> naiad.Source:
    if fmt == "jsonl":
        return naiad.read_jsonl([str(p) for p in corpus["jsonl"]])
    return naiad.read_parquet(str(corpus["parquet"]))


def run(loader: naiad.DataLoader, limit: int | None = None, *, clone: bool = True) -> list[dict]:
    """The loader's batches (the first ``limit``, the loader left open), each copied unless
    ``clone=False`` (raw batches, to be tokenized by hand)."""
    out = []
    try:
        for b in loader:
            out.append({k: v.clone() for k, v in b.items()} if clone else b)
            if limit is not None and len(out) == limit:
                break
    finally:
        if limit is None:
            loader.close()
    return out


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_every_documents_tokens_once_per_epoch_across_two_ranks_of_two_workers(corpus, fmt):
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    per_rank, steps = [], []
    for rank in range(2):
        loader = naiad.DataLoader(source(corpus, fmt), batch_size=16, shuffle=True, seed=3, shuffle_buffer=64,
                                  num_workers=2, worker_mode="process", rank=rank, world_size=2, transform=t)
        assert isinstance(loader.pipeline.source, TokenizedSource)  # tokenized in the workers
        batches = run(loader)
        steps.append(len(batches))
        per_rank.append(batches)
    assert steps[0] == steps[1]
    got = documents_of(per_rank[0] + per_rank[1], corpus["eos"])
    assert Counter(got) == Counter(corpus["expected"])
    first = documents_of(per_rank[0][:1], corpus["eos"])
    assert first != corpus["expected"][: len(first)]  # shuffled
    b = per_rank[0][0]
    assert b["input_ids"].shape[1] == SEQ and b["input_ids"].dtype == torch.int64
    assert set(b) == {"input_ids", "labels", "position_ids", "document_ids"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_windows_equal_tokenizing_the_plain_batches_in_this_process(corpus, mode):
    # The loader splits the work (tokens in the workers, packing here); the transform applied to
    # the untokenized batches here gives the same windows. Thread workers share one tokenizer.
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    kw = dict(batch_size=10, shuffle=True, seed=1, shuffle_buffer=50, num_workers=2, worker_mode=mode)
    split = run(naiad.DataLoader(source(corpus, "jsonl"), transform=t, **kw))
    plain = [t(b) for b in run(naiad.DataLoader(source(corpus, "jsonl"), **kw), clone=False)]
    assert_same(split, plain)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_exact_resume_mid_epoch_gives_the_same_windows(corpus, fmt):
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(source(corpus, fmt), batch_size=12, shuffle=True, seed=5, shuffle_buffer=40,
                                num_workers=2, worker_mode="process", transform=t)

    whole = run(make())
    first = make()
    try:
        head = run(first, limit=7)
        state = json.loads(json.dumps(first.state_dict()))
    finally:
        first.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert_same(head + run(resumed), whole)


@pytest.mark.timeout(300)
def test_elastic_resume_two_to_three_ranks_trains_every_document_once(corpus):
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    kw = dict(batch_size=8, shuffle=True, seed=9, shuffle_buffer=32, num_workers=2, worker_mode="process")

    def make(rank: int, world: int, transform=t) -> naiad.DataLoader:
        return naiad.DataLoader(source(corpus, "jsonl"), rank=rank, world_size=world, transform=transform, **kw)

    before, states = [], {}
    for rank in range(2):
        for transform in (t, None):
            loader = make(rank, 2, transform)
            try:
                got = run(loader, limit=5) if transform is not None else run(loader, limit=5, clone=False)
                if transform is not None:
                    before += got
                if rank == 0:  # ranks step in lockstep: rank 0's state is the job's
                    states[transform is None] = json.loads(json.dumps(loader.state_dict()))
            finally:
                loader.close()
    after, again, plain = [], [], []
    for rank in range(3):
        for into, transform in ((after, t), (again, t), (plain, None)):
            loader = make(rank, 3, transform)
            loader.load_state_dict(states[transform is None])  # the plain source's state has its own columns
            into += run(loader) if transform is not None else [t(b) for b in run(loader, clone=False)]
    got = documents_of(before + after, corpus["eos"])
    assert Counter(got) == Counter(corpus["expected"])
    assert_same(after, again)  # a resume is a pure function of the state
    assert_same(after, plain)  # and packs each new batch from its own documents


def test_last_window_is_padded_with_ignored_labels_and_ids_restart_per_document():
    eos = 0
    docs = [np.array([5, 6, 7, eos]), np.array([8, eos]), np.array([9, 9, 9, 9, 9, eos])]
    flat = np.concatenate(docs).astype(np.uint16)
    lens = np.array([len(d) for d in docs])
    b = pack_windows(flat, lens, 4, eos)
    stream = [eos, 5, 6, 7, eos, 8, eos, 9, 9, 9, 9, 9, eos]  # 13 tokens: 12 labels, 3 windows
    assert b["input_ids"].tolist() == [stream[0:4], stream[4:8], stream[8:12]]
    assert b["labels"].tolist() == [stream[1:5], stream[5:9], stream[9:13]]
    b = pack_windows(flat, lens, 5, eos)  # 12 labels in windows of 5: the last has 3 of padding
    assert b["labels"][-1].tolist() == [9, eos, -100, -100, -100]
    assert b["input_ids"][-1].tolist() == [9, 9, eos, eos, eos]  # padding inputs are EOS
    assert b["position_ids"][0].tolist() == [0, 0, 1, 2, 3]  # the leading EOS is a document of its own
    assert b["document_ids"][0].tolist() == [0, 1, 1, 1, 1]
    one = pack_windows(flat, lens, 5, eos, pack=False)  # each document its own windows
    assert one["input_ids"].tolist() == [[eos, 5, 6, 7, eos], [eos, 8, eos, eos, eos], [eos, 9, 9, 9, 9], [9, eos, eos, eos, eos]]
    assert one["labels"].tolist() == [[5, 6, 7, eos, -100], [8, eos, -100, -100, -100], [9, 9, 9, 9, 9],
                                      [eos, -100, -100, -100, -100]]
    empty = pack_windows(flat[:0], lens[:0], 5, eos)
    assert empty["input_ids"].shape == (0, 5)


def test_the_tokenizer_path_must_exist_and_load(tmp_path):
    with pytest.raises(naiad.ConfigError, match="does not exist"):
        naiad.tokenize(tmp_path / "missing.json", seq_len=8)
    bad = tmp_path / "bad.json"
    bad.write_text("{not a tokenizer")
    with pytest.raises(naiad.ConfigError, match="not a tokenizer.json"):
        naiad.tokenize(bad, seq_len=8)
    with pytest.raises(naiad.ConfigError, match="seq_len"):
        naiad.tokenize(bad, seq_len=0)


def test_a_tokenizer_without_an_end_of_text_token_needs_eos_id(corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["a b c"], trainers.BpeTrainer(vocab_size=300))
    with pytest.raises(naiad.ConfigError, match="eos_id="):
        naiad.tokenize(tok, seq_len=8)
    assert naiad.tokenize(tok, seq_len=8, eos_id=3).eos_id == 3
    with pytest.raises(naiad.ConfigError, match="eos_id"):
        naiad.tokenize(tok, seq_len=8, eos_id=10**6)


def test_a_missing_text_column_is_a_config_error(corpus):
    t = naiad.tokenize(corpus["tokenizer"], column="body", seq_len=SEQ)
    with pytest.raises(naiad.ConfigError, match="column='body'.*'text'"):
        naiad.DataLoader(source(corpus, "jsonl"), batch_size=4, transform=t)


@pytest.mark.timeout(120)
def test_a_document_that_is_not_text_is_a_source_error_naming_its_file_and_line(corpus, tmp_path):
    p = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}) for d in corpus["docs"][:40]]
    lines[22] = json.dumps({"text": None})  # the reader takes null in a string column; the tokenizer cannot
    p.write_text("\n".join(lines) + "\n")
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    loader = naiad.DataLoader(naiad.read_jsonl(str(p)), batch_size=8, num_workers=2, worker_mode="process", transform=t)
    try:
        with pytest.raises(naiad.SourceError, match=r"bad.jsonl.*line 23.*NoneType None, not a string"):
            list(loader)
    finally:
        loader.close()
    with pytest.raises(naiad.SourceError, match=r"document 1 of the batch.*NoneType"):
        t({"text": ["fine", None]})


def test_tokenize_reads_a_batch_that_holds_text_or_tokens(corpus):
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    texts = corpus["docs"][:20]
    direct = t({"text": texts, "id": list(range(20))})
    via_tokens = t({TOKENS_COLUMN: t.documents(texts)})
    assert_same([direct], [via_tokens])
    with pytest.raises(naiad.ConfigError, match="no such column"):
        t({"body": texts})
    import pickle

    copy = pickle.loads(pickle.dumps(t))
    assert copy._tok is None  # the tokenizer travels as JSON, loaded once where it runs
    assert_same([copy({"text": texts})], [direct])


def test_a_null_document_in_parquet_is_named_by_its_row(corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts: list[str | None] = list(corpus["docs"][:50])
    texts[31] = None
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), tmp_path / "t.parquet", row_group_size=20)
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    loader = naiad.DataLoader(naiad.read_parquet(str(tmp_path / "t.parquet")), batch_size=10, transform=t)
    with pytest.raises(naiad.SourceError, match=r"t.parquet: row 31: `text` is NoneType"):
        list(loader)


class CountingTokenize(naiad.tokens.Tokenize):
    """Records, in a file, each process's loads of the tokenizer."""

    log = ""

    @property
    def tokenizer(self):
        if self._tok is None:
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return super().tokenizer


@pytest.mark.timeout(180)
def test_the_tokenizer_is_loaded_once_per_worker_process_not_per_batch(corpus, tmp_path):
    t = CountingTokenize(corpus["tokenizer"], "text", SEQ, True, None)
    t.log = str(tmp_path / "loads.txt")
    docs = naiad.read_jsonl([str(p) for p in corpus["jsonl"]], block_bytes=4096)  # dozens of read tasks
    loader = naiad.DataLoader(docs, batch_size=4, num_workers=2, worker_mode="process",
                              transform=t, persistent_workers=True, multiprocessing_context="spawn")
    try:
        for _ in range(2):  # two epochs, about 150 batches
            assert sum(1 for _ in loader) == len(loader)
    finally:
        loader.close()
    loads = (tmp_path / "loads.txt").read_text().split()
    # Spawned workers unpickle the transform without its tokenizer: each loads it once, for all its
    # tasks (dozens, over two epochs).
    assert len(docs.blocks()) > 20
    assert 1 <= len(loads) <= 2 and len(set(loads)) == len(loads)
    assert str(os.getpid()) not in loads  # the training process kept the one it loaded


@pytest.mark.timeout(120)
def test_with_on_bad_rows_skip_a_document_that_is_not_text_is_skipped_and_counted(corpus, tmp_path):
    p = tmp_path / "bad.jsonl"
    docs = corpus["docs"][:60]
    lines = [json.dumps({"text": d}) for d in docs]
    lines[22] = json.dumps({"text": None})
    lines[41] = json.dumps({"text": None})
    p.write_text("\n".join(lines) + "\n")
    t = naiad.tokenize(corpus["tokenizer"], seq_len=SEQ)
    loader = naiad.DataLoader(naiad.read_jsonl(str(p), on_bad_rows="skip"), batch_size=8, shuffle=True, seed=0,
                              num_workers=2, worker_mode="process", transform=t)
    batches = run(loader)
    good = [e for i, e in enumerate(corpus["expected"][:60]) if i not in (22, 41)]
    assert Counter(documents_of(batches, corpus["eos"])) == Counter(good)
    assert loader.bad_rows == {str(p): 2}
    assert [(e["line"], e["column"]) for e in loader.stats().bad_row_ledger] == [(23, "text"), (42, "text")]
