"""A wrapper plans as the source it wraps (NOTE [ Format wrappers ] in sources/wrapper.py).

Every wrapper (the base ``FormatWrapper``, which transforms nothing, and ``TokenizedSource``) is
asked every question the planner asks, over CSV, JSON Lines, text, Parquet and tar shards, and
must answer as a fresh, unwrapped source of the same files does: its traits, its early blocks
and their rows, its blocks, rows, bytes and keys, its plan (the same blocks in the same order),
its schema and reads where it keeps the inner's columns. And every public method of a source is
either answered by ``FormatWrapper`` or derived from what is, so a method added to the engine
cannot go unasked.

The decode in the reads (stream/decode.py) wraps a read handler, not a source: its reads depend
on the pass (the epoch and seed a random crop draws from), which a source's reads never do.
"""

from __future__ import annotations

import inspect
import io
import json
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.sources import FormatWrapper, Source
from naiad.sources.engine import BlockEngine
from naiad.stream.batches import StreamOptions, default_buffer_rows, plan_for, run_for
from naiad.stream.early import may_read_early
from naiad.stream.reads import row_keys

WORDS = ["alpha", "beta", "gamma", "delta", "river", "token", "window", "naiad"]
DOCS = 1500


def documents(n: int = DOCS) -> list[str]:
    rng = np.random.default_rng(7)
    return [f"doc{i} " + " ".join(rng.choice(WORDS, int(rng.integers(1, 12))).tolist()) for i in range(n)]


def write_formats(folder: Path) -> dict[str, Callable[[], Source]]:
    """The same documents in five formats, each a maker of a fresh source (small blocks, so each
    format has many)."""
    docs = documents()
    halves = [docs[: DOCS // 2], docs[DOCS // 2:]]
    for i, part in enumerate(halves):
        (folder / f"d{i}.csv").write_text("id,text\n" + "".join(f"{j},{t}\n" for j, t in enumerate(part)))
        (folder / f"d{i}.jsonl").write_text("".join(json.dumps({"id": j, "text": t}) + "\n" for j, t in enumerate(part)))
        (folder / f"d{i}.txt").write_text("".join(t + "\n" for t in part))
        pq.write_table(pa.table({"id": np.arange(len(part)), "text": part}), folder / f"d{i}.parquet", row_group_size=61)
        with tarfile.open(folder / f"d{i}.tar", "w") as tar:
            for j, t in enumerate(part):
                for ext, data in (("txt", t.encode()), ("cls", str(j % 10).encode())):
                    info = tarfile.TarInfo(f"s{j:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    files = {ext: [str(folder / f"d{i}.{ext}") for i in range(2)] for ext in ("csv", "jsonl", "txt", "parquet", "tar")}
    index = folder / "index"
    return {
        "csv": lambda: naiad.read_csv(files["csv"], block_bytes=1024, index_dir=index),
        "jsonl": lambda: naiad.read_jsonl(files["jsonl"], block_bytes=1024, index_dir=index),
        "text": lambda: naiad.read_text(files["txt"], block_bytes=1024, index_dir=index),
        "parquet": lambda: naiad.read_parquet(files["parquet"]),
        "tar": lambda: naiad.read_webdataset(files["tar"], block_bytes=16384, index_dir=index),
    }


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], Source]]:
    return write_formats(tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tokenizers")
    from tests.integration.tokenizer_data import train_tokenizer

    return train_tokenizer(documents(), tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=300)


FORMATS = ["csv", "jsonl", "text", "parquet", "tar"]
CASES = [(fmt, kind) for fmt in FORMATS for kind in ("identity", "tokenized")]
IDS = [f"{fmt}-{kind}" for fmt, kind in CASES]


def text_column(source: Source) -> str:
    return "txt" if "txt" in source.column_names else "text"  # a tar shard's text member is .txt


def tokenized(inner: Source, tokenizer_json: Path) -> naiad.tokens.TokenizedSource:
    return naiad.tokens.TokenizedSource(inner, naiad.tokenize(tokenizer_json, column=text_column(inner), seq_len=16))


@pytest.fixture
def pair(request: pytest.FixtureRequest, formats: dict[str, Callable[[], Source]]) -> tuple[Source, FormatWrapper]:
    """A fresh source and a wrapper over another fresh source of the same files: the wrapper's
    answers are worked out apart from the source it is compared with."""
    fmt, kind = request.param
    make = formats[fmt]
    if kind == "identity":
        return make(), FormatWrapper(make())
    return make(), tokenized(make(), request.getfixturevalue("tokenizer_json"))


@pytest.mark.parametrize("pair", CASES, ids=IDS, indirect=True)
def test_a_wrapper_answers_the_planners_questions_as_its_inner_source(pair: tuple[Source, FormatWrapper]) -> None:
    inner, wrapped = pair
    assert wrapped.traits == inner.traits
    assert wrapped.paths == inner.paths
    assert (wrapped.on_bad_rows, wrapped.max_bad_rows) == (inner.on_bad_rows, inner.max_bad_rows)
    assert wrapped.known_rows() == inner.known_rows()  # before the count: None, or a footer's
    assert may_read_early(wrapped) == may_read_early(inner)
    # The early cut, before anything is counted, and each early block counted alone.
    early = inner.early_blocks()
    assert wrapped.early_blocks() == early
    if early is not None:
        assert [wrapped.early_block(b) for b in early[:5]] == [inner.early_block(b) for b in early[:5]]
        assert [wrapped.early_rows(b) for b in early[:5]] == [inner.early_rows(b) for b in early[:5]]
        assert not wrapped.counted()
    # The count, once, in the inner source.
    assert wrapped.blocks() == inner.blocks()
    assert wrapped.counted() and wrapped.inner.counted()
    assert len(wrapped) == len(inner) == DOCS
    assert wrapped.known_rows() == inner.known_rows() == DOCS
    assert wrapped.local_bytes() == inner.local_bytes()
    assert wrapped.sample_bytes() == inner.sample_bytes()
    assert wrapped.parsed_bytes() == inner.parsed_bytes()
    assert wrapped.count_threads() == inner.count_threads()


@pytest.mark.parametrize("pair", CASES, ids=IDS, indirect=True)
def test_a_wrapper_plans_the_same_blocks_in_the_same_order_keyed_alike(pair: tuple[Source, FormatWrapper]) -> None:
    inner, wrapped = pair
    # A buffer that holds most rows: a source counted before its reads plans runs of blocks,
    # one that reads before its count (tar shards) single blocks; the wrapper plans as its inner.
    options = StreamOptions(batch_size=32, shuffle=True, seed=5, shuffle_buffer=1200)
    assert run_for(wrapped, 1200, 1) == run_for(inner, 1200, 1)
    for epoch in (0, 1):
        a, b = plan_for(inner, options, epoch), plan_for(wrapped, options, epoch)
        assert a.tasks == b.tasks and a.batch_sizes.tolist() == b.batch_sizes.tolist()
    keys_a, keys_b = row_keys(inner), row_keys(wrapped)
    assert type(keys_a) is type(keys_b)
    tasks = plan_for(inner, options, 0).tasks[:6]
    for task in tasks:
        assert keys_a.of(task).tolist() == keys_b.of(task).tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_identity_wrapper_keeps_schema_buffer_and_reads(fmt: str, formats: dict[str, Callable[[], Source]]) -> None:
    inner, wrapped = formats[fmt](), FormatWrapper(formats[fmt]())
    assert wrapped.schema() == inner.schema() and wrapped.column_names == inner.column_names
    assert default_buffer_rows(wrapped) == default_buffer_rows(inner)
    assert {k: np.asarray(v).shape for k, v in wrapped.empty_columns().items()} == \
        {k: np.asarray(v).shape for k, v in inner.empty_columns().items()}
    blocks = [b for b in inner.blocks() if b.rows >= 4]
    parts = [(b, 0, b.rows, None) for b in blocks[2:5]] + [(blocks[6], 1, 3, None), (blocks[7], 0, 4, np.array([0, 2]))]
    scattered = [(blocks[1], np.array([0, 3])), (blocks[-1], np.array([1]))]
    again = pickle.loads(pickle.dumps(wrapped))  # as a worker gets it
    for source in (wrapped, again):
        for got, want in ((source.read_block(blocks[0]), inner.read_block(blocks[0])),
                          (source.read_block(blocks[3], 1, 4), inner.read_block(blocks[3], 1, 4)),
                          (source.read_group(parts), inner.read_group(parts)),
                          (source.read_rows_many(scattered), inner.read_rows_many(scattered)),
                          (source.read_rows(blocks[1], np.array([1, 2])), inner.read_rows(blocks[1], np.array([1, 2])))):
            assert got.bad == want.bad
            assert {k: np.asarray(v).tolist() for k, v in got.columns.items()} == \
                {k: np.asarray(v).tolist() for k, v in want.columns.items()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tokenized_source_reads_the_inners_documents_as_tokens(fmt: str, formats: dict[str, Callable[[], Source]],
                                                                tokenizer_json: Path) -> None:
    from naiad.tokens.text import TOKENS_COLUMN

    inner = formats[fmt]()
    wrapped = tokenized(formats[fmt](), tokenizer_json)
    column = text_column(inner)
    assert wrapped.column_names == [TOKENS_COLUMN]
    assert wrapped.empty_columns() == {TOKENS_COLUMN: []}
    blocks = inner.blocks()
    parts = [(b, 0, b.rows, None) for b in blocks[2:4]]
    for got, want in ((wrapped.read_block(blocks[0]), inner.read_block(blocks[0])),
                      (wrapped.read_group(parts), inner.read_group(parts)),
                      (wrapped.read_rows_many([(blocks[1], np.array([0, 2]))]), inner.read_rows_many([(blocks[1], np.array([0, 2]))]))):
        assert got.columns[TOKENS_COLUMN] == wrapped.tokenize.documents(want.columns[column])


# Public names of a source that a wrapper derives from what it answers (or shares as they are).
DERIVED = {"schema", "column_names", "read_rows", "bad_rows", "traits", "reader_name", "max_bad_rows",
           "keep_parsed_bytes"}


def test_every_public_method_of_a_source_is_answered_or_derived() -> None:
    public = {name for name in dir(Source) if not name.startswith("_")} | {"__len__"}
    answered = {name for name, _ in inspect.getmembers(FormatWrapper)
                if name in FormatWrapper.__dict__ and (not name.startswith("_") or name == "__len__")}
    missing = sorted(public - answered - DERIVED)
    assert missing == [], f"a Source method FormatWrapper neither answers nor derives: {missing}"
    # The engine's own planner interface, name by name, is in one of the two.
    engine = {name for name in vars(BlockEngine) if not name.startswith("_")}
    assert engine <= answered | DERIVED
