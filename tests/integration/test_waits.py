"""Every wait of a pass under the loader's `timeout` (docs/WORKERS.md, "Threads, processes and
waits"): a stream's decode stage (NOTE [ Stage deadline ] in naiad/parallel/ahead.py), its decode
in the reads, its read-ahead threads, tokenizing reads; and a decoder stuck for good holds neither
the pass's close nor the process's exit (NOTE [ Daemon threads ] in naiad/parallel/threads.py).

Real loaders over real files: tar shards written with `tarfile`, a folder of PNGs written with
Pillow, JSONL text. A transform that blocks waits on a gate (a file this test creates when it
ends), so no thread it started outlives it, whatever the test's outcome.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import naiad
from naiad.errors import DecodeError
from naiad.media.rows import run_rows
from naiad.sources.contract import Block, BlockData
from naiad.tokens.text import Tokenize
from tests.helpers import run_to_end

Image = pytest.importorskip("PIL.Image", reason="the decode tests write images with Pillow (pip install 'naiad[test]')")

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 1
BLOCK_S = 4.0  # a blocking call's length: well past the timeout, short enough to wait out
SAMPLES = 24
TIMED_OUT = re.compile(rf"^DataLoader timed out after {TIMEOUT_S} seconds")
OURS = ("naiad-decode", "naiad-worker-")  # threads a pass here starts (the stage's: naiad-decode-stage)


def png(k: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8), k % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def write_shards(folder: Path, shards: int = 3) -> str:
    """``shards`` tar shards of SAMPLES samples in all, each a PNG and its class, by `tarfile`."""
    folder.mkdir(parents=True, exist_ok=True)
    per = SAMPLES // shards
    for s in range(shards):
        with tarfile.open(folder / f"part-{s:04d}.tar", "w") as tar:
            for k in range(s * per, (s + 1) * per):
                for ext, data in (("png", png(k)), ("cls", str(k).encode())):
                    info = tarfile.TarInfo(f"s{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(folder / f"part-{{0000..{shards - 1:04d}}}.tar")


def write_folder(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(SAMPLES):
        (folder / f"{k:04d}.png").write_bytes(png(k))
    return str(folder)


class Gate:
    """A path whose file, once made, releases every blocked call, and the loaders a test made."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.loaders: list[naiad.DataLoader] = []

    def loader(self, source: Any, **kwargs: Any) -> naiad.DataLoader:
        """A ``naiad.DataLoader`` closed when the test ends, however it ends."""
        made = naiad.DataLoader(source, **kwargs)
        self.loaders.append(made)
        return made


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Gate]:
    """Opened when the test ends, its loaders closed; then every thread the test started must
    end (a failed test's traceback may still hold a pass: closing the loader ends it)."""
    made = Gate(str(tmp_path / "gate"))
    before = set(threading.enumerate())
    try:
        yield made
    finally:
        Path(made.path).touch()
        for loader in made.loaders:
            loader.close()
        made.loaders.clear()
        deadline = time.monotonic() + 10 * BLOCK_S
        while time.monotonic() < deadline and _started(before):
            time.sleep(0.05)
        assert not _started(before), f"threads left behind: {_started(before)}"


def _started(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in set(threading.enumerate()) - before if t.name.startswith(OURS))


def wait_at(gate: str, seconds: float) -> None:
    """Block until ``gate`` exists or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


class Blocking:
    """A worker-side transform (NOTE [ Decode in the workers ]) whose decode of the samples named
    in ``block`` (``__key__`` values; None: every sample) in epoch ``epoch`` blocks for
    ``seconds``, on the decode threads (``run_rows``), unless the gate opens: a decoder hung on
    hostile files. Decoded size ``decoded_row_bytes``: 16 decodes in the reads, None on the
    stage. Picklable."""

    def __init__(self, gate: str, *, column: str = "png", decoded_row_bytes: int | None = None,
                 block: set[str] | None = None, epoch: int = 0, seconds: float = BLOCK_S) -> None:
        self.gate = gate
        self.column = column
        self.decoded_row_bytes = decoded_row_bytes
        self.block = block
        self.epoch = epoch
        self.seconds = seconds

    def placement(self) -> naiad.Placement:
        return naiad.Placement("workers", column=self.column, key="__index__",
                               decoded_row_bytes=self.decoded_row_bytes)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        values, names = batch[self.column], batch.get("__key__", batch.get("path"))
        this_epoch = int(batch.get("__epoch__", 0)) == self.epoch
        out = torch.zeros((len(values), 4, 4), dtype=torch.uint8)

        def work(i: int) -> None:
            if this_epoch and (self.block is None or str(names[i]) in self.block):
                wait_at(self.gate, self.seconds)
            out[i] = len(values[i]) % 256

        run_rows(work, len(values), 2)
        return {**batch, self.column: out}

    def __repr__(self) -> str:
        return "Blocking()"


def keys(numbers: range | list[int]) -> set[str]:
    return {f"s{k:04d}" for k in numbers}


def pass_raises(loader: naiad.DataLoader, match: str = "") -> tuple[naiad.WorkerError, float]:
    t0 = time.monotonic()
    with pytest.raises(naiad.WorkerError, match=TIMED_OUT) as info:
        for _ in loader:
            pass
    assert match in str(info.value), str(info.value)
    return info.value, time.monotonic() - t0


def sources(tmp_path: Path) -> dict[str, Any]:
    return {
        "webdataset": lambda: naiad.read_webdataset(write_shards(tmp_path / "shards"), index_dir=str(tmp_path / "index")),
        "images": lambda: naiad.read_images(write_folder(tmp_path / "folder")),
    }


# -- a stream's decode stage ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["webdataset", "images"])
def test_a_decode_on_the_stage_that_blocks_past_timeout_raises_the_timeout_error(tmp_path: Path, gate: Gate,
                                                                                  kind: str) -> None:
    source = sources(tmp_path)[kind]()
    column = "png" if kind == "webdataset" else "image"
    loader = gate.loader(source, batch_size=4, transform=Blocking(gate.path, column=column), timeout=TIMEOUT_S)
    error, took = pass_raises(loader, "the decode of batch 0 of epoch 0 by Blocking()")
    assert "naiad-decode-stage" in str(error)
    assert took < BLOCK_S - 1, f"raised after {took:.1f} s: the stage waited for the decode"


def test_the_stage_timeout_names_the_batch_and_epoch_it_waited_for(tmp_path: Path, gate: Gate) -> None:
    # Epoch 0 goes through; in epoch 1 the batch holding sample 9 (batch 2 of 6, in order) blocks.
    source = sources(tmp_path)["webdataset"]()
    loader = gate.loader(source, batch_size=4, timeout=TIMEOUT_S, transform=Blocking(gate.path, block=keys([9]), epoch=1))
    assert sum(len(b["png"]) for b in loader) == SAMPLES
    delivered: list[int] = []
    with pytest.raises(naiad.WorkerError, match=TIMED_OUT) as info:
        for batch in loader:
            delivered.append(len(batch["png"]))
    assert "the decode of batch 2 of epoch 1" in str(info.value)
    assert delivered == [4, 4]
    assert info.value.task == "waiting for the decode of batch 2 of epoch 1 by Blocking()"


def test_a_slow_decode_within_the_timeout_is_waited_for(tmp_path: Path, gate: Gate) -> None:
    source = sources(tmp_path)["webdataset"]()
    slow = Blocking(gate.path, block=keys([5]), seconds=0.3)
    loader = gate.loader(source, batch_size=4, timeout=TIMEOUT_S, transform=slow)
    assert sum(len(b["png"]) for b in loader) == SAMPLES


def test_a_break_while_a_decode_is_stuck_closes_within_the_timeout(tmp_path: Path, gate: Gate) -> None:
    # A sample of every batch after the second blocks (one decode thread each, so the batches
    # before them go through on the other); the loop breaks after the second, when the next two
    # are decoding: the pass's close waits for them no longer than the timeout, not until they end.
    source = sources(tmp_path)["webdataset"]()
    loader = gate.loader(source, batch_size=4, timeout=TIMEOUT_S,
                         transform=Blocking(gate.path, block=keys(range(8, SAMPLES, 4)), seconds=3 * BLOCK_S))
    it = iter(loader)
    next(it)
    next(it)
    t0 = time.monotonic()
    del it  # the pass closes (as at a `break`)
    took = time.monotonic() - t0
    assert 0.5 < took < TIMEOUT_S + 2, f"the close took {took:.1f} s"


# -- a stream's decode in its reads -----------------------------------------------------------


@pytest.mark.parametrize("workers", [
    pytest.param({"read_ahead": 2}, id="read-ahead-threads"),
    pytest.param({"num_workers": 1}, id="process-worker"),
])
def test_a_decode_in_the_reads_that_blocks_past_timeout_raises_the_timeout_error(tmp_path: Path, gate: Gate,
                                                                                 workers: dict[str, int]) -> None:
    # decoded_row_bytes <= 4 KiB: the decode runs in the read tasks (NOTE [ Small samples decode
    # in the reads ]), under the pool's deadline.
    source = sources(tmp_path)["webdataset"]()
    loader = gate.loader(source, batch_size=4, timeout=TIMEOUT_S,
                         transform=Blocking(gate.path, decoded_row_bytes=16), **workers)
    assert loader._pipeline.decode_in_reads  # type: ignore[attr-defined]
    error, took = pass_raises(loader, "no result from naiad worker 0 while loading")
    assert took < BLOCK_S - 1, f"raised after {took:.1f} s"
    del loader, error


# -- a stream's read-ahead threads and tokenizing reads ------------------------------------------


class GatedSource(naiad.Source):
    """Rows held in memory (the format contract's three methods), whose read of any block but
    the first blocks until the gate opens."""

    def __init__(self, gate: str, rows: int = 400, block_rows: int = 50) -> None:
        self.paths = ["gated-part-0"]
        self.on_bad_rows = "raise"
        self.gate = gate
        self.rows = rows
        self.block_rows = block_rows

    def _read_schema(self) -> pa.Schema:
        return pa.schema([("id", pa.int64())])

    def _file_blocks(self, path: str) -> list[Block]:
        return [Block(path, lo, min(self.rows, lo + self.block_rows), min(self.rows, lo + self.block_rows) - lo, lo)
                for lo in range(0, self.rows, self.block_rows)]

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        if block.start > 0:
            wait_at(self.gate, BLOCK_S)
        return BlockData({"id": np.arange(block.start + lo, block.start + hi, dtype=np.int64)})


def test_a_read_on_the_read_ahead_threads_that_blocks_past_timeout_raises(gate: Gate) -> None:
    loader = gate.loader(GatedSource(gate.path), batch_size=25, read_ahead=2, timeout=TIMEOUT_S)
    assert loader.read_ahead_threads() == 2
    error, took = pass_raises(loader, "no result from naiad worker")
    assert "gated-part-0" in str(error)
    assert took < BLOCK_S - 1, f"raised after {took:.1f} s"


class BlockingTokenize(Tokenize):
    """naiad.tokenize whose tokenizer blocks on a read with documents of any file but the first
    (small files may be read as one group: its last document is of the last file)."""

    gate = ""

    def documents(self, texts: Any, where: Any = None) -> list[bytes]:
        if where is not None and len(texts) and not where(len(texts) - 1)[0].endswith("part-0.jsonl"):
            wait_at(self.gate, BLOCK_S)
        return super().documents(texts, where)


def test_a_tokenizing_read_that_blocks_past_timeout_raises(tmp_path: Path, gate: Gate) -> None:
    pytest.importorskip("tokenizers", reason="naiad.tokenize needs tokenizers (pip install 'naiad[text]')")
    from tests.integration.tokenizer_data import make_documents, train_tokenizer

    docs = make_documents(60)
    paths = []
    for part in range(3):
        path = tmp_path / f"part-{part}.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[part::3]))
        paths.append(str(path))
    made = naiad.tokenize(str(train_tokenizer(docs, tmp_path / "tokenizer.json")), seq_len=16)
    transform = BlockingTokenize(made.tokenizer, made.column, made.seq_len, made.pack, made.eos_id)
    transform.gate = gate.path
    loader = gate.loader(naiad.read_jsonl(paths), batch_size=10, read_ahead=2, timeout=TIMEOUT_S,
                              transform=transform)
    error, took = pass_raises(loader, "no result from naiad worker")
    assert "part-1.jsonl" in str(error) or "part-2.jsonl" in str(error)
    assert took < BLOCK_S - 1, f"raised after {took:.1f} s"


# -- the decode threads end with the pass, and never hold the exit ------------------------------


def _decode_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("naiad-decode"))


@pytest.mark.parametrize("end", ["epoch", "break", "error"])
def test_the_decode_threads_end_with_the_pass(tmp_path: Path, gate: Gate, end: str) -> None:
    source = naiad.read_webdataset(write_shards(tmp_path / "shards"), index_dir=str(tmp_path / "index"))
    if end == "error":
        with tarfile.open(tmp_path / "shards" / "part-0002.tar", "a") as tar:
            for name, data in (("s9999.png", b"nopng"), ("s9999.cls", b"99")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        source = naiad.read_webdataset(str(tmp_path / "shards" / "part-{0000..0002}.tar"), index_dir=str(tmp_path / "i2"))
    decode = naiad.decode_images("png", mode="L")  # each image its own size: on the stage
    loader = gate.loader(source, batch_size=4, transform=decode, timeout=10)
    it = iter(loader)
    next(it)
    assert _decode_threads(), "the decode ran on no naiad-decode thread"
    if end == "epoch":
        assert sum(1 for _ in it) == SAMPLES // 4 - 1
    elif end == "break":
        del it
    else:
        with pytest.raises(DecodeError, match="s9999"):
            list(it)
    deadline = time.monotonic() + 5
    while _decode_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _decode_threads() == [], "decode threads outlived their pass"


CHILD = textwrap.dedent("""
    import sys, threading, time
    import naiad
    from naiad.media.rows import run_rows

    class Stuck:
        # A decoder stuck for good on every sample, on the decode threads.
        def __init__(self, decoded_row_bytes):
            self.decoded_row_bytes = decoded_row_bytes

        def placement(self):
            return naiad.Placement("workers", column="png", key="__index__",
                                   decoded_row_bytes=self.decoded_row_bytes)

        def __call__(self, batch):
            run_rows(lambda i: threading.Event().wait(), len(batch["png"]), 2)
            return batch

    pattern, index, in_reads = sys.argv[1], sys.argv[2], sys.argv[3] == "reads"
    source = naiad.read_webdataset(pattern, index_dir=index)
    loader = naiad.DataLoader(source, batch_size=4, timeout=1, read_ahead=2,
                              transform=Stuck(16 if in_reads else None))
    try:
        next(iter(loader))
    except naiad.WorkerError as exc:
        print("raised:", exc, flush=True)
    print("ended at", time.time(), flush=True)
""")


@pytest.mark.parametrize("where", [
    # In the reads the decode's caller is a read-ahead thread, stuck too, and the read-ahead
    # threads' join at exit (thread_backend.py) allows them 10 s.
    pytest.param("reads", id="in-the-reads"),
    pytest.param("stage", id="on-the-stage"),
])
def test_a_decoder_stuck_for_good_raises_and_the_process_exits(tmp_path: Path, where: str) -> None:
    pattern = write_shards(tmp_path / "shards")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = run_to_end([sys.executable, str(script), pattern, str(tmp_path / "index"), where], timeout_s=60)
    exited = time.time()
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^raised: DataLoader timed out after 1 seconds", out.stdout, re.M), out.stdout + out.stderr[-3000:]
    ended = float(re.search(r"ended at ([0-9.]+)", out.stdout).group(1))  # type: ignore[union-attr]
    bound = 20 if where == "reads" else 6
    assert exited - ended < bound, f"the exit took {exited - ended:.1f} s after the script's end"
