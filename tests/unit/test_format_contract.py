"""A new kind of source needs only the format contract (NOTE [ Format contract ] in
sources/contract.py): a toy source of rows held in memory, three methods long, streams through
naiad.DataLoader with shuffling, workers and exact resume, the engine doing the rest."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import naiad
import naiad.sources
from naiad.sources.contract import Block, BlockData, SourceFormat
from naiad.testing import check_resume


class ToySource(naiad.Source):
    """Rows held in memory, in parts of any size, cut into blocks of ``block_rows``: the base
    initialiser and the contract's three methods, nothing else."""

    def __init__(self, parts: list[dict[str, np.ndarray]], block_rows: int) -> None:
        # No files: each part's name stands for a path (in the plan and in error messages).
        super().__init__([f"toy-part-{i}" for i in range(len(parts))], expand=False)
        self.parts = dict(zip(self.paths, parts, strict=True))
        self.block_rows = block_rows
        self.reads: Counter[Block] = Counter()  # this copy's calls of _read, per block

    def _read_schema(self) -> pa.Schema:
        first = self.parts[self.paths[0]]
        return pa.schema([(name, pa.from_numpy_dtype(col.dtype)) for name, col in first.items()])

    def _file_blocks(self, path: str) -> list[Block]:
        rows = len(next(iter(self.parts[path].values())))
        return [Block(path, lo, min(rows, lo + self.block_rows), min(rows, lo + self.block_rows) - lo, lo)
                for lo in range(0, rows, self.block_rows)]

    def _read(self, block: Block, lo: int, hi: int, use_threads: bool) -> BlockData:
        self.reads[block] += 1
        part = self.parts[block.path]
        return BlockData({name: col[block.start + lo:block.start + hi].copy() for name, col in part.items()})


def toy(sizes: list[int], block_rows: int = 17) -> ToySource:
    parts, first = [], 0
    for n in sizes:
        ids = np.arange(first, first + n, dtype=np.int64)
        parts.append({"id": ids, "x": (ids * 0.5).astype(np.float32)})
        first += n
    return ToySource(parts, block_rows)


def ids_of(loader: naiad.DataLoader) -> np.ndarray:
    return np.concatenate([b["id"].numpy() for b in loader])


def test_the_contract_is_three_methods() -> None:
    assert SourceFormat.__abstractmethods__ == {"_read_schema", "_file_blocks", "_read"}

    class NoRead(naiad.Source):
        def _read_schema(self) -> pa.Schema:
            return pa.schema([])

        def _file_blocks(self, path: str) -> list[Block]:
            return []

    with pytest.raises(TypeError, match="_read"):
        NoRead.__new__(NoRead)  # an incomplete format cannot be made


def test_a_toy_source_gets_the_engine_for_free() -> None:
    source = toy([100, 3, 58])
    assert isinstance(source, naiad.Source)
    assert len(source) == 161 and source.column_names == ["id", "x"]
    assert len(source.blocks()) == 6 + 1 + 4
    group = source.read_group([(b, 0, b.rows, None) for b in source.blocks()[5:8]])
    assert group.columns["id"].tolist() == list(range(85, 120))  # across three parts
    rows = source.read_rows_many([(source.blocks()[0], np.array([2, 9])), (source.blocks()[-1], np.array([0]))])
    assert rows.columns["id"].tolist() == [2, 9, 154]
    assert rows.columns["x"].dtype == np.float32


def test_a_toy_source_streams_shuffled_every_row_once() -> None:
    loader = naiad.DataLoader(toy([300, 1, 211]), batch_size=32, shuffle=True, seed=3, shuffle_buffer=100)
    first, second = ids_of(loader), ids_of(loader)
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(512))
    assert first.tolist() != list(range(512)) and first.tolist() != second.tolist()


def test_a_toy_source_keeps_its_blocks_when_asked() -> None:
    source = toy([200, 90])
    source.keep_parsed_bytes = 1 << 20  # kept blocks are the engine's, for any format
    loader = naiad.DataLoader(source, batch_size=50, shuffle=True, seed=0, shuffle_buffer=64)
    assert sorted(ids_of(loader).tolist()) == list(range(290))
    assert sorted(ids_of(loader).tolist()) == list(range(290))
    assert len(source.reads) == len(source.blocks())
    assert set(source.reads.values()) == {1}  # the second epoch read nothing again


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_toy_source_resumes_exactly(workers: int) -> None:
    def make() -> naiad.DataLoader:
        return naiad.DataLoader(toy([250, 7, 180]), batch_size=24, shuffle=True, seed=11, shuffle_buffer=90,
                                num_workers=workers)

    check_resume(make, epochs=2, positions=[0.0, 0.4, 1.0])


def test_sources_import_nothing_above_them() -> None:
    # The sources sit below the stream pipeline (ledger, shuffle, plan, stream, ...), the loader
    # and the CLI: what they may import from naiad is listed, so a new upward import fails here.
    allowed = {"naiad.errors", "naiad.parallel.threads", "naiad.process_state", "naiad.trust.kept", "naiad.trust.listings",
               "naiad.trust.npy_header", "naiad.trust.paths"}
    found = {}
    for path in Path(naiad.sources.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("naiad") and not name.startswith("naiad.sources") and name not in allowed:
                    found[f"{path.name}:{node.lineno}"] = name
    assert found == {}
