"""Reading Parquet from an S3-compatible server on loopback: naiad's range reads (fsspec/s3fs
through ``sources/storage.py``) against PyArrow's native ``S3FileSystem`` on the same URLs, and
both against the same file on local disk.

The server is moto's (``moto[server]``) in a subprocess, so its Python does not share the
reader's GIL. Every row group is read in a shuffled order, as a shuffled epoch reads them, with
the columns asked for. The question: is PyArrow's own filesystem worth a second code path?

    python bench/bench_storage.py [--mb 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench.harness import environment, median_time  # noqa: E402
from tests.s3server import BUCKET, KEY, SECRET, S3Server, free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=64, help="size of the Parquet file (float32 columns)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(environment())

    import naiad
    from naiad.sources.parquet import open_parquet

    rows = args.mb * (1 << 20) // 40
    rng = np.random.default_rng(0)
    table = pa.table({f"f{i}": rng.random(rows, dtype=np.float32) for i in range(10)})
    tmp = tempfile.mkdtemp()
    local = os.path.join(tmp, "data.parquet")
    pq.write_table(table, local, row_group_size=1 << 16, use_dictionary=False)
    size = os.path.getsize(local)

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                client = S3Server.client_for(endpoint)
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                time.sleep(0.1)
        with open(local, "rb") as f:
            client.put_object(Bucket=BUCKET, Key="data.parquet", Body=f.read())
        url = f"s3://{BUCKET}/data.parquet"
        columns = ["f0", "f1", "f2", "f3", "f4"]
        order = np.random.default_rng(1).permutation(pq.ParquetFile(local).num_row_groups)

        def epoch(pf: pq.ParquetFile) -> None:
            for i in order:
                pf.read_row_group(int(i), columns=columns)

        src = naiad.read_parquet(url, storage={"key": KEY, "secret": SECRET, "endpoint_url": endpoint})
        s3 = pafs.S3FileSystem(access_key=KEY, secret_key=SECRET, endpoint_override=endpoint, scheme="http",
                               region="us-east-1")
        results = {
            "local file (memory map)": median_time(lambda: epoch(pq.ParquetFile(local, memory_map=True)), args.repeats),
            "naiad: fsspec range reads": median_time(lambda: epoch(open_parquet(src.paths[0], src.storage)), args.repeats),
            "PyArrow S3FileSystem": median_time(
                lambda: epoch(pq.ParquetFile(f"{BUCKET}/data.parquet", filesystem=s3, pre_buffer=True)), args.repeats),
        }
    finally:
        server.terminate()
        server.wait(10)
    mb = size * len(columns) / 10 / 1e6
    base = results["naiad: fsspec range reads"]
    print(f"{size / 1e6:.0f} MB file, {len(order)} row groups, {len(columns)} of 10 columns (~{mb:.0f} MB) per epoch")
    print("| reader | epoch s | MB/s | vs naiad |")
    print("|---|---|---|---|")
    for name, t in results.items():
        print(f"| {name} | {t:.2f} | {mb / t:.0f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
