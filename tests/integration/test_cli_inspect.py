"""``naiad inspect``: what it reports of real CSV, Parquet and .npy files and of an s3:// glob on a
real S3 server on loopback, as text and as JSON for scripts."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.cli import main


def inspect_json(capsys, *args: str) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def write_csv(path, n: int) -> str:
    with open(path, "w") as f:
        f.write("id,x,name\n")
        f.writelines(f"{i},{i * 0.5},n{i}\n" for i in range(n))
    return str(path)


def test_csv_report_has_files_schema_rows_blocks_head_and_an_epoch_estimate(tmp_path, capsys):
    path = write_csv(tmp_path / "a.csv", 50_000)
    report = inspect_json(capsys, path, "--rows", "3")
    assert report["files"] == [{"path": path, "bytes": os.path.getsize(path)}]
    assert report["format"] == "csv" and report["reader"] == "read_csv" and report["rows"] == 50_000
    assert [(c["name"], c["dtype"], c["batch"]) for c in report["columns"]] == [
        ("id", "int64", "tensor"), ("x", "float64", "tensor"), ("name", "str", "list")]
    blocks = naiad.read_csv(path).blocks()
    assert report["blocks"]["count"] == len(blocks) > 1
    rows = sorted(b.rows for b in blocks)
    assert report["blocks"]["rows"] == {"min": rows[0], "median": int(np.median(rows)), "max": rows[-1]}
    assert report["blocks"]["bytes"]["max"] <= 4 << 20
    assert report["head"] == [{"id": i, "x": i * 0.5, "name": f"n{i}"} for i in range(3)]
    epoch = report["epoch"]
    assert epoch["blocks_read"] >= 1 and epoch["rows_read"] > 0 and epoch["rows_per_s"] > 0
    assert epoch["epoch_s"] == pytest.approx(50_000 / epoch["rows_per_s"])


def test_parquet_report_advises_on_big_groups_and_dictionary_floats_until_converted(tmp_path, capsys):
    n = 200_000
    table = pa.table({"id": np.arange(n), "x": np.arange(n) % 100 * 0.5})
    pq.write_table(table, tmp_path / "raw.parquet", row_group_size=100_000)  # dictionary pages by default
    report = inspect_json(capsys, str(tmp_path / "raw.parquet"))
    assert report["rows"] == n and report["blocks"]["count"] == 2
    assert report["blocks"]["rows"] == {"min": 100_000, "median": 100_000, "max": 100_000}
    notes = " ".join(report["notes"])
    assert "dictionary-encoded" in notes and "'x'" in notes and "only 2 block(s)" in notes and "up to 100,000 rows" in notes
    assert main(["convert", str(tmp_path / "raw.parquet"), str(tmp_path / "good.parquet"), "--quiet"]) == 0
    good = inspect_json(capsys, str(tmp_path / "good.parquet"))
    assert good["notes"] == [] and good["blocks"]["count"] == n // 1024 + 1


def test_npy_report_gives_the_batch_shape(tmp_path, capsys):
    np.save(tmp_path / "f.npy", np.zeros((3000, 4, 2), np.float32))
    report = inspect_json(capsys, str(tmp_path / "f.npy"), "--rows", "1")
    assert report["columns"] == [{"name": "x", "arrow_type": "float", "dtype": "float32", "shape": "(n, 4, 2)",
                                  "batch": "tensor"}]
    assert report["rows"] == 3000 and report["blocks"]["count"] == 3 and report["blocks"]["bytes"] is None
    assert report["head"] == [{"x": [[0.0, 0.0]] * 4}]


def test_text_summary_reads_as_words(tmp_path, capsys):
    path = write_csv(tmp_path / "a.csv", 100)
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: 1 file(s)") and "rows: 100 " in out and "first 5 row(s):" in out
    assert "a shuffled epoch reads in about" in out


def test_a_missing_file_is_an_error_naming_it(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none.csv")]) == 1
    assert f"{tmp_path / 'none.csv'}: file not found" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_an_s3_glob_is_inspected_through_the_url(tmp_path, capsys):
    pytest.importorskip("moto.server", reason="needs moto[server] (pip install 'naiad[test]')")
    pytest.importorskip("s3fs", reason="needs s3fs (pip install 'naiad[s3]')")
    from tests.s3server import BUCKET, S3Server

    server = S3Server()
    try:
        for k in range(2):
            buf = pa.BufferOutputStream()
            pq.write_table(pa.table({"id": np.arange(k * 500, (k + 1) * 500)}), buf, row_group_size=100)
            server.put(f"inspect/part-{k}.parquet", buf.getvalue().to_pybytes())
        url = f"s3://{BUCKET}/inspect/part-*.parquet"
        report = inspect_json(capsys, url, "--storage-options", json.dumps(server.options()), "--rows", "2")
    finally:
        server.stop()
    assert [f["path"] for f in report["files"]] == [f"s3://{BUCKET}/inspect/part-{k}.parquet" for k in range(2)]
    assert all(f["bytes"] > 0 for f in report["files"])
    assert report["rows"] == 1000 and report["blocks"]["count"] == 10 and report["head"] == [{"id": 0}, {"id": 1}]
    assert report["epoch"]["rows_read"] > 0
