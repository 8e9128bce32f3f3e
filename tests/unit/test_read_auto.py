"""naiad.read: the reader chosen by suffix."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.sources import CsvSource, NpySource, ParquetSource


def test_suffix_picks_the_reader_and_options_pass_through(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.csv").write_text("x,y\n1,2\n3,4\n")
    (tmp_path / "a.tsv").write_text("x\ty\n1\t2\n")
    with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
        f.write("x,y\n5,6\n")
    pq.write_table(pa.table({"x": [1.0, 2.0]}), tmp_path / "c.parquet")
    np.save(tmp_path / "d.npy", np.zeros((3, 2), np.float32))
    assert isinstance(naiad.read(str(tmp_path / "a.csv"), columns=["y"]), CsvSource)
    assert naiad.read(str(tmp_path / "a.csv"), columns=["y"]).schema().names == ["y"]
    assert naiad.read(str(tmp_path / "a.tsv")).schema().names == ["x", "y"]  # tab implied
    assert isinstance(naiad.read(str(tmp_path / "b.csv.gz")), CsvSource)
    assert isinstance(naiad.read(str(tmp_path / "*.parquet")), ParquetSource)
    assert isinstance(naiad.read(str(tmp_path / "d.npy")), NpySource)


def test_unknown_and_mixed_formats_are_config_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "x.bin").write_bytes(b"\0")
    (tmp_path / "a.csv").write_text("x\n1\n")
    with pytest.raises(naiad.ConfigError, match="cannot read"):
        naiad.read(str(tmp_path / "x.bin"))
    with pytest.raises(naiad.ConfigError, match="mix formats"):
        naiad.read([str(tmp_path / "a.csv"), str(tmp_path / "x.bin")])
    with pytest.raises(naiad.SourceError, match="matches no file"):
        naiad.read(str(tmp_path / "*.parquet"))


def test_a_folder_reads_its_data_files_and_skips_markers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for k in range(3):
        pq.write_table(pa.table({"id": list(range(k * 10, k * 10 + 10))}), tmp_path / f"part-{k:05d}.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".part-00000.parquet.crc").write_text("x")
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "other.csv").write_text("a\n1\n")
    source = naiad.read(tmp_path)
    assert [os.path.basename(p) for p in source.paths] == [f"part-{k:05d}.parquet" for k in range(3)]
    assert sorted(int(v) for b in naiad.DataLoader(source, batch_size=7) for v in b["id"]) == list(range(30))
    assert naiad.read_parquet(str(tmp_path)).paths == source.paths
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")
    with pytest.raises(naiad.SourceError, match="holds no data file"):
        naiad.read(empty)
