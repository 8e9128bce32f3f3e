"""`naiad convert --tokenize` to token shards and `naiad inspect` on token files, on real files: a
BPE trained here, JSONL and Parquet text; read_tokens reads back exactly what tokenizing the
documents directly gives; documents whole within shards; the manifest's counts and checksums;
inspect's counts; the errors."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import naiad
from naiad.cli import main
from tests.integration.tokenizer_data import (
    make_documents,
    train_tokenizer,
    write_jsonl,
    write_parquet,
)

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    docs = make_documents(400, seed=1)
    tok_path = train_tokenizer(docs, root / "tokenizer.json")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    eos = tok.token_to_id("<|endoftext|>")
    expected = [e.ids + [eos] for e in tok.encode_batch(docs, add_special_tokens=False)]
    return {"docs": docs, "tokenizer": str(tok_path), "jsonl": write_jsonl(docs, root / "jsonl", files=3),
            "parquet": write_parquet(docs, root / "parquet"), "eos": eos, "expected": expected, "root": root}


def convert(capsys, src: str, dst, *extra: str) -> dict:
    assert main(["convert", src, str(dst), "--tokenize", *extra]) == 0
    assert "documents ->" in capsys.readouterr().out
    return json.loads((dst / "manifest.json").read_text())


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_convert_then_read_tokens_equals_tokenizing_directly(corpus, tmp_path, capsys, fmt):
    src = str(corpus["root"] / "jsonl" / "*.jsonl") if fmt == "jsonl" else str(corpus["parquet"])
    manifest = convert(capsys, src, tmp_path / "out", corpus["tokenizer"], "--tokens-per-shard", "3000")
    expected = corpus["expected"]
    stream = np.concatenate([np.array(d) for d in expected])
    assert manifest["tokens"] == len(stream) and manifest["documents"] == len(expected)
    assert manifest["dtype"] == "uint16" and manifest["eos_id"] == corpus["eos"]
    assert len(manifest["shards"]) > 3

    seq = 16
    tokens = naiad.read_tokens(str(tmp_path / "out"), seq_len=seq)  # the folder: the shards, not the offsets
    assert [f.layout for f in tokens.files] == ["npy"] * len(manifest["shards"])
    at, doc = 0, 0
    first_window = 0
    for i, shard in enumerate(manifest["shards"]):
        path = tmp_path / "out" / shard["file"]
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
        arr = np.load(path)
        assert arr.dtype == np.uint16 and np.array_equal(arr, stream[at:at + len(arr)])
        offsets = np.load(tmp_path / "out" / shard["offsets"])
        assert offsets[0] == 0 and offsets[-1] == len(arr) == shard["tokens"]
        for k in range(len(offsets) - 1):  # documents whole within a shard, each at its offsets
            assert arr[offsets[k]:offsets[k + 1]].tolist() == expected[doc]
            doc += 1
        n = int(tokens.windows_per_file[i])
        windows = tokens.window_tokens(np.arange(first_window, first_window + n))
        cut = np.stack([arr[w * seq:w * seq + seq + 1] for w in range(n)])
        assert np.array_equal(windows, cut)
        first_window += n
        at += len(arr)
    assert doc == len(expected) and at == len(stream)
    assert manifest["shards"][0]["tokens"] >= 3000  # cut at the first document end past the limit


@pytest.mark.timeout(180)
def test_text_mixes_once_converted_and_raw_text_is_refused_naming_the_way(corpus, tmp_path, capsys):
    """naiad.mix takes token windows; text converted with --tokenize is token windows (with its
    documents' EOS, so document ids hold), raw text (a reader, a tokenize transform, the two
    together) is a ConfigError that says how to convert it."""
    convert(capsys, str(corpus["root"] / "jsonl" / "*.jsonl"), tmp_path / "out", corpus["tokenizer"])
    eos, seq = corpus["eos"], 16
    text = naiad.read_tokens(str(tmp_path / "out"), seq_len=seq, eos_id=eos)
    stream = np.concatenate([np.array(d) for d in corpus["expected"]])
    numbers = 1000 + np.arange(40 * seq + 1)  # no eos: one long document
    np.save(tmp_path / "numbers.npy", numbers.astype(np.uint16))
    other = naiad.read_tokens(str(tmp_path / "numbers.npy"), seq_len=seq, eos_id=eos)
    m = naiad.mix([text, other], [0.5, 0.5], seed=3, length=80 * seq)
    loader = naiad.DataLoader(m, batch_size=8, shuffle=True, seed=0, num_workers=2, worker_mode="thread")
    try:
        batches = list(loader)
    finally:
        loader.close()
    inputs = np.concatenate([b["input_ids"].numpy() for b in batches])
    docs = np.concatenate([b["document_ids"].numpy() for b in batches])
    from_text = inputs[:, 0] < 1000
    assert from_text.sum() == 40 and (~from_text).sum() == 40  # the weights, to the window
    windows = {tuple(stream[k:k + seq].tolist()) for k in range(0, len(stream) - seq, seq)}
    for row, ids in zip(inputs[from_text], docs[from_text], strict=True):
        assert tuple(row.tolist()) in windows  # a window of the tokenized documents, cut as read_tokens cuts
        assert np.array_equal(ids, np.cumsum(row == eos) - (row == eos))  # documents split at the EOS
    assert (docs[~from_text] == 0).all()

    raw = naiad.read_jsonl(str(corpus["root"] / "jsonl" / "*.jsonl"))
    tok = naiad.tokenize(corpus["tokenizer"], seq_len=seq)
    for source in (raw, tok, tok.read_tokenized(raw)):
        with pytest.raises(naiad.ConfigError, match=r"is raw text .*naiad convert TEXT DEST --tokenize TOKENIZER"):
            naiad.mix([source, other], [1, 1])


def test_one_shard_by_default_and_uint32_for_a_large_vocabulary(corpus, tmp_path, capsys):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(corpus["tokenizer"])
    tok.add_tokens([f"zzq{i}zz" for i in range(66000)])  # past uint16's ids
    big = tmp_path / "big.json"
    tok.save(str(big))
    src = str(corpus["jsonl"][0])
    manifest = convert(capsys, src, tmp_path / "out", str(big))
    assert manifest["dtype"] == "uint32" and len(manifest["shards"]) == 1
    arr = np.load(tmp_path / "out" / "tokens-00000.npy")
    n_docs = len(corpus["jsonl"][0].read_text().splitlines())
    assert arr.dtype == np.uint32 and arr.tolist() == [t for d in corpus["expected"][:n_docs] for t in d]


def test_inspect_shows_tokens_documents_and_windows(corpus, tmp_path, capsys):
    manifest = convert(capsys, str(corpus["parquet"]), tmp_path / "out", corpus["tokenizer"], "--tokens-per-shard", "5000")
    assert main(["inspect", str(tmp_path / "out"), "--seq-len", "64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected_windows = sum((s["tokens"] - 1) // 64 for s in manifest["shards"])
    assert report["tokens"] == manifest["tokens"] and report["documents"] == manifest["documents"]
    assert report["dtype"] == "uint16" and report["windows"] == expected_windows and report["seq_len"] == 64
    # A nanoGPT-style flat .bin: found by its suffix; documents counted from --eos-id.
    flat = np.concatenate([np.array(d, np.uint16) for d in corpus["expected"]])
    bin_path = tmp_path / "train.bin"
    flat.tofile(bin_path)
    assert main(["inspect", str(bin_path), "--eos-id", str(corpus["eos"])]) == 0
    text = capsys.readouterr().out
    assert f"{len(flat):,} tokens of uint16" in text
    assert f"documents: {len(corpus['expected']):,} (counted end-of-document tokens" in text
    assert f"windows of seq_len=1024: {(len(flat) - 1) // 1024:,}" in text
    assert main(["inspect", str(bin_path)]) == 0
    assert "documents: unknown (pass --eos-id" in capsys.readouterr().out


def fails(capsys, *args: str) -> str:
    """Run the command line, which must fail with a message (and no traceback); the message."""
    assert main(list(args)) == 1
    return capsys.readouterr().err


def test_convert_errors_name_the_problem(corpus, tmp_path, capsys):
    src = str(corpus["jsonl"][0])
    assert "does not exist" in fails(capsys, "convert", src, str(tmp_path / "out"), "--tokenize", str(tmp_path / "m.json"))
    convert(capsys, src, tmp_path / "out", corpus["tokenizer"])
    assert "exists; pass --overwrite" in fails(capsys, "convert", src, str(tmp_path / "out"), "--tokenize", corpus["tokenizer"])
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}) for d in corpus["docs"][:30]]
    lines[11] = json.dumps({"text": None})
    bad.write_text("\n".join(lines) + "\n")
    err = fails(capsys, "convert", str(bad), str(tmp_path / "out2"), "--tokenize", corpus["tokenizer"])
    assert "bad.jsonl, line 12: `text` is NoneType None, not a string" in err
    assert not list((tmp_path / "out2").glob("tokens-*.npy"))  # nothing half-written
    err = fails(capsys, "convert", src, str(tmp_path / "out3"), "--tokenize", corpus["tokenizer"], "--text-column", "body")
    assert "column='body'" in err
    with pytest.raises(naiad.ConfigError, match="local folder"):
        from naiad.tools.convert_tokens import convert_tokens

        convert_tokens(naiad.read_jsonl(src), "s3://bucket/out/", naiad.tokenize(corpus["tokenizer"], seq_len=8))


def test_convert_with_on_bad_rows_skip_counts_the_skipped_documents(corpus, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": d}) for d in corpus["docs"][:30]]
    lines[11] = json.dumps({"text": None})
    lines[17] = "{not json"
    bad.write_text("\n".join(lines) + "\n")
    manifest = convert(capsys, str(bad), tmp_path / "out", corpus["tokenizer"], "--on-bad-rows", "skip")
    assert manifest["documents"] == 28 and manifest["bad_rows"] == 2
    assert sorted(e["line"] for e in manifest["bad_row_examples"]) == [12, 18]
    good = [t for i, d in enumerate(corpus["expected"][:30]) if i not in (11, 17) for t in d]
    assert np.load(tmp_path / "out" / "tokens-00000.npy").tolist() == good
