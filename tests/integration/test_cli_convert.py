"""``naiad convert``: real files in every input format to Parquet and Arrow shards, read back with
naiad's readers; the seeded shuffle, the manifest's checksums, bad rows, atomic output, and a
destination on a real S3 server on loopback."""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import naiad
from naiad.cli import main
from naiad.tools.convert import default_row_group_rows
from naiad.tools.convert_shuffle import row_keys, seed_state
from naiad.tools.progress import Progress
from tests.conftest_stream import FORMATS, write_numbered

N = 20_000


def write_csv(path, n=N, bad_line: int | None = None) -> str:
    """Columns id (int), x (float), name (str); ``bad_line`` (1-based, header = line 1) has a
    text in the integer column."""
    with open(path, "w") as f:
        f.write("id,x,name\n")
        for i in range(n):
            if bad_line is not None and i + 2 == bad_line:
                f.write("oops,1.0,bad\n")
            else:
                f.write(f"{i},{i * 0.25},n{i % 13}\n")
    return str(path)


def read_back(pattern: str, **kw) -> dict[str, np.ndarray | list]:
    """Every row of the shards, in file order, through naiad's reader of their format."""
    src = naiad.read(pattern, **kw)
    parts = [src.read_block(b).columns for b in src.blocks()]
    return {k: (np.concatenate([p[k] for p in parts]) if isinstance(parts[0][k], np.ndarray)
                else [v for p in parts for v in p[k]]) for k in parts[0]}


def convert(*args: str) -> int:
    return main(["convert", *args])


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_csv_to_parquet_round_trip_keeps_every_row_once_with_equal_values(tmp_path, capsys):
    src = write_csv(tmp_path / "train.csv")
    assert convert(src, str(tmp_path / "out" / "train.parquet"), "--rows-per-shard", "6000") == 0
    out = capsys.readouterr()
    assert out.out.startswith("naiad convert: 20,000 rows -> 4 shard(s)") and out.err == ""
    assert sorted(os.listdir(tmp_path / "out")) == [f"train-0000{i}.parquet" for i in range(4)] + ["train.manifest.json"]
    cols = read_back(str(tmp_path / "out" / "train-*.parquet"))
    assert cols["id"].tolist() == list(range(N))  # every row once, in input order without --shuffle
    np.testing.assert_array_equal(cols["x"], np.arange(N) * 0.25)
    assert cols["name"] == [f"n{i % 13}" for i in range(N)]
    assert cols["id"].dtype == np.int64 and cols["x"].dtype == np.float64


def test_row_groups_are_sized_for_block_shuffling_and_floats_have_no_dictionary(tmp_path):
    n = 300_000  # 1/4096 of the rows: 73, so the 1,024-row floor applies
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": np.arange(n), "x": np.arange(n) * 0.5, "s": [f"k{i % 5}" for i in range(n)]}),
                   tmp_path / "in.parquet", row_group_size=1 << 20)
    assert convert(str(tmp_path / "in.parquet"), str(path)) == 0
    meta = pq.ParquetFile(path).metadata
    assert default_row_group_rows(n) == 1024
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [1024] * (n // 1024) + [n % 1024]
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(3)}
    assert not columns["x"].has_dictionary_page
    assert columns["s"].has_dictionary_page  # other columns keep the dictionary
    assert default_row_group_rows(1_000_000_000) == 1 << 16 and default_row_group_rows(10_000_000) == 2441


def test_manifest_lists_each_shard_with_its_rows_and_sha256(tmp_path):
    src = write_csv(tmp_path / "a.csv")
    assert convert(src, str(tmp_path / "out") + "/", "--rows-per-shard", "7000", "--row-group-rows", "2000") == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["rows"] == N and manifest["bad_rows"] == 0 and manifest["format"] == "parquet"
    assert [s["rows"] for s in manifest["shards"]] == [7000, 7000, 6000]
    for shard in manifest["shards"]:
        path = str(tmp_path / "out" / shard["file"])
        assert shard["sha256"] == sha256(path) and shard["bytes"] == os.path.getsize(path)
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == shard["rows"] and meta.num_row_groups == shard["row_groups"]
        assert meta.row_group(0).num_rows == 2000
    assert manifest["source"] == {"paths": [src], "rows": N}
    assert manifest["options"]["row_group_rows"] == 2000 and "storage_options" not in manifest["options"]


def test_shuffle_writes_a_seeded_permutation_independent_of_memory(tmp_path):
    src = write_csv(tmp_path / "a.csv")
    orders = {}
    for name, seed, memory in (("a", 1, "1MiB"), ("b", 1, "1GiB"), ("c", 2, "1MiB")):
        assert convert(src, str(tmp_path / name) + "/", "--shuffle", "--seed", str(seed), "--memory", memory,
                       "--rows-per-shard", "5000") == 0
        orders[name] = read_back(str(tmp_path / name / "part-*.parquet"))
    ids = orders["a"]["id"]
    assert sorted(ids.tolist()) == list(range(N))  # a permutation: every row exactly once
    assert abs(np.corrcoef(ids, np.arange(N))[0, 1]) < 0.05  # far from the input order
    np.testing.assert_array_equal(orders["b"]["id"], ids)  # one bucket or many: the same order
    assert not np.array_equal(orders["c"]["id"], ids)  # another seed, another order
    np.testing.assert_array_equal(orders["a"]["x"], ids * 0.25)  # rows move whole
    assert [orders["a"]["name"][i] for i in range(5)] == [f"n{i % 13}" for i in ids[:5].tolist()]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["buckets"] > 1
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["options"]["buckets"] == 1
    # The order is the rows sorted by their seeded keys (NOTE [ External shuffle ]).
    np.testing.assert_array_equal(ids, np.argsort(row_keys(np.arange(N), seed_state(1))))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".naiad-convert-")]  # buckets removed


def test_a_bad_row_fails_naming_file_and_line_and_leaves_no_shard(tmp_path, capsys):
    src = write_csv(tmp_path / "a.csv", bad_line=18_500)  # after several shards were complete
    out = tmp_path / "out"
    assert convert(src, str(out) + "/", "--rows-per-shard", "3000") == 1
    err = capsys.readouterr().err
    assert f"{src}, line 18500" in err and "oops" in err
    assert os.listdir(out) == []  # no shard, whole or half, no temporary file, no manifest


def test_skip_bad_rows_writes_the_rest_and_counts_them(tmp_path, capsys):
    src = write_csv(tmp_path / "a.csv", bad_line=101)
    assert convert(src, str(tmp_path / "o.parquet"), "--on-bad-rows", "skip", "--shuffle") == 0
    assert "1 bad row(s) skipped" in capsys.readouterr().out
    ids = read_back(str(tmp_path / "o.parquet"))["id"]
    assert sorted(ids.tolist()) == [i for i in range(N) if i != 99]
    manifest = json.loads((tmp_path / "o.manifest.json").read_text())
    assert manifest["rows"] == N - 1 and manifest["bad_rows"] == 1
    assert manifest["bad_row_examples"][0]["line"] == 101 and manifest["bad_row_examples"][0]["file"] == src


def test_columns_and_dtypes_shape_the_output(tmp_path):
    src = write_csv(tmp_path / "a.csv", n=100)
    assert convert(src, str(tmp_path / "o.arrow"), "--columns", "x,id", "--dtypes", "x=float32") == 0
    schema = naiad.read_arrow(str(tmp_path / "o.arrow")).schema()
    assert schema.names == ["id", "x"] and schema.field("x").type == pa.float32()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_input_format_converts_to_parquet(tmp_path, fmt):
    paths = write_numbered(str(tmp_path), fmt, [40, 0, 25])
    if fmt == "text":  # naiad.read knows text files by .txt
        for p in paths:
            os.rename(p, p[: -len(".text")] + ".txt")
    pattern = str(tmp_path / f"part-*.{'txt' if fmt == 'text' else fmt}")
    assert convert(pattern, str(tmp_path / "out.parquet"), "--shuffle", "--seed", "4") == 0
    cols = read_back(str(tmp_path / "out.parquet"))
    key = "text" if fmt == "text" else ("x" if fmt == "npy" else "id")
    assert sorted(int(v) for v in cols[key]) == list(range(65)), paths


@pytest.mark.parametrize("suffix", ["arrow", "parquet"])
def test_npy_arrays_become_fixed_size_lists_that_read_back_in_their_shape(tmp_path, suffix):
    arr = np.arange(120, dtype=np.float32).reshape(20, 2, 3)
    np.save(tmp_path / "m.npy", arr)
    out = str(tmp_path / f"m.{suffix}")
    assert convert(str(tmp_path / "m.npy"), out) == 0
    source = naiad.read(out)
    field = source.schema().field("x")
    assert field.type.list_size == 6 and json.loads(field.metadata[b"naiad.shape"]) == [2, 3]
    assert source.empty_columns()["x"].shape == (0, 2, 3)
    np.testing.assert_array_equal(read_back(out)["x"], arr)
    # Converted again, the shape stays in the metadata.
    assert convert(out, str(tmp_path / "again.parquet")) == 0
    np.testing.assert_array_equal(read_back(str(tmp_path / "again.parquet"))["x"], arr)


def test_existing_output_needs_overwrite_and_overwrite_removes_stale_shards(tmp_path, capsys):
    src = write_csv(tmp_path / "a.csv", n=1000)
    dst = str(tmp_path / "out") + "/"
    assert convert(src, dst, "--rows-per-shard", "300") == 0
    assert convert(src, dst, "--rows-per-shard", "600") == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert convert(src, dst, "--rows-per-shard", "600", "--overwrite") == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["manifest.json", "part-00000.parquet", "part-00001.parquet"]


def test_progress_is_drawn_on_a_terminal_only(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    bar = Progress(term, enabled=True, labels={"convert": "converting"})
    bar("convert", 500, 1000, 2048)
    bar("convert", 1000, 1000, 4096)
    bar.close()
    text = term.getvalue()
    assert "converting [" in text and "1,000/1,000 rows" in text and "4.0 KiB" in text and "rows/s" in text
    assert "ETA" in text and text.endswith("\r\033[K")
    assert Progress(io.StringIO()).enabled is False  # not a terminal: nothing drawn


@pytest.mark.timeout(120)
def test_convert_to_and_from_an_s3_url(s3, tmp_path):
    from tests.s3server import BUCKET

    src = write_csv(tmp_path / "a.csv", n=5000)
    options = json.dumps(s3.options())
    dst = f"s3://{BUCKET}/converted/"
    assert convert(src, dst, "--shuffle", "--seed", "3", "--rows-per-shard", "2000", "--storage-options", options) == 0
    keys = sorted(o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix="converted/")["Contents"])
    assert keys == ["converted/manifest.json"] + [f"converted/part-0000{i}.parquet" for i in range(3)]  # no .tmp left
    manifest = json.loads(s3.client.get_object(Bucket=BUCKET, Key="converted/manifest.json")["Body"].read())
    for shard in manifest["shards"]:
        body = s3.client.get_object(Bucket=BUCKET, Key=f"converted/{shard['file']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == shard["sha256"] and len(body) == shard["bytes"]
    cols = read_back(f"{dst}part-*.parquet", storage=s3.options())
    assert sorted(cols["id"].tolist()) == list(range(5000))
    # ... and from the URL back to a local Arrow file, in the same order.
    assert convert(f"{dst}part-*.parquet", str(tmp_path / "back.arrow"), "--storage-options", options) == 0
    np.testing.assert_array_equal(read_back(str(tmp_path / "back.arrow"))["id"], cols["id"])


@pytest.mark.timeout(120)
def test_a_missing_destination_bucket_is_an_error_naming_it(s3, tmp_path, capsys):
    src = write_csv(tmp_path / "a.csv", n=10)
    assert convert(src, "s3://no-such-bucket-here/out/", "--storage-options", json.dumps(s3.options())) == 1
    assert "s3://no-such-bucket-here/out/" in capsys.readouterr().err.split("not found")[0]
