"""A shuffled epoch from an S3-compatible server on loopback against the same files on local disk.

A CSV of ``--mb`` MB (8 float features and an int label) and its Parquet copy are uploaded to
moto's S3 server (``moto[server]``, in a subprocess so its Python does not share the reader's
GIL; changed to read a range request's bytes alone, not the whole object: see _RANGED_MOTO). Each run is a child process (so its peak RSS is its own) that opens the source, then
times shuffled epochs through ``naiad.DataLoader`` with the defaults (``batch_size=1024``,
``shuffle=True``, ``num_workers=0``: the loader's read-ahead threads):

- local: the file on local disk, second epoch (page cache warm): the reference;
- s3 cold: the first epoch from the server into an empty ``cache_dir`` (the newline scan of
  the CSV is done before, at open, and timed apart);
- s3 cached: the second epoch of the same source, every block from the local cache;
- s3 +20 ms cold: the first epoch through a proxy (its own subprocess) that adds 20 ms to every
  request, with the default read-ahead and with ``read_ahead=16`` threads.

Targets (issue 14): cold >= 0.5x local, cached >= 0.9x local, +20 ms >= 0.4x local; peak RSS
bounded as for local files.

    python bench/bench_remote.py --mb 1024          # the recorded run
    python bench/bench_remote.py --mb 50            # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
from bench.harness import environment, markdown_table  # noqa: E402

FEATURES = 8


def write_data(folder: str, mb: int, row_group_rows: int) -> tuple[str, str, int]:
    """A CSV of about ``mb`` MB written in chunks (bounded memory) and its Parquet copy."""
    csv_path, pq_path = os.path.join(folder, "data.csv"), os.path.join(folder, "data.parquet")
    rng = np.random.default_rng(0)
    chunk, rows = 1 << 16, 0
    with pa.OSFile(csv_path, "wb") as sink, pacsv.CSVWriter(sink, _schema()) as w:
        while sink.tell() < mb * 1_000_000:
            cols = {f"f{i}": rng.random(chunk, dtype=np.float32).round(5) for i in range(FEATURES)}
            cols["label"] = rng.integers(0, 10, chunk)
            w.write_table(pa.table(cols, schema=_schema()))
            rows += chunk
    reader = pacsv.open_csv(csv_path, convert_options=pacsv.ConvertOptions(column_types=_schema()))
    with pq.ParquetWriter(pq_path, _schema(), use_dictionary=False) as pw:
        pending: list[pa.RecordBatch] = []
        held = 0
        for batch in reader:
            pending.append(batch)
            held += batch.num_rows
            while held >= row_group_rows:
                table = pa.Table.from_batches(pending)
                pw.write_table(table.slice(0, row_group_rows), row_group_size=row_group_rows)
                rest = table.slice(row_group_rows)
                pending, held = rest.to_batches(), rest.num_rows
        if held:
            pw.write_table(pa.Table.from_batches(pending), row_group_size=row_group_rows)
    return csv_path, pq_path, rows


def _schema() -> pa.Schema:
    return pa.schema([*(pa.field(f"f{i}", pa.float32()) for i in range(FEATURES)), pa.field("label", pa.int64())])


# moto reads a whole object for every range request (about 0.6 ms per MB of the object: a
# 64 KiB range of a 1 GB object costs 0.6 s), which no real object store does; the server here
# reads the range alone, as S3 does. Only GetObject with one "bytes=a-b" range is changed.
_RANGED_MOTO = """
import re, sys, threading
from moto.s3 import models, responses
from moto.server import main

local = threading.local()
whole = models.FakeKey.value.fget

def value(self):
    wanted = getattr(local, "range", None)
    if wanted is None:
        return whole(self)
    with self.lock:
        self._value_buffer.seek(wanted[0])
        return self._value_buffer.read(wanted[1] - wanted[0] + 1)

models.FakeKey.value = property(value, models.FakeKey.value.fset)
get_object = responses.S3Response.get_object

def ranged_get_object(self):
    m = re.fullmatch(r"bytes=(\\d+)-(\\d+)", self.headers.get("range") or "")
    if not m:
        return get_object(self)
    key, _ = self._get_key()
    a, b = int(m[1]), min(int(m[2]), key.size - 1)
    if a > b:
        return get_object(self)
    local.range = (a, b)
    try:
        status, headers, body = get_object(self)
    finally:
        local.range = None
    if status != 200:
        return status, headers, body
    headers = {k: v for k, v in headers.items() if not k.lower().startswith(("x-amz-checksum-", "content-length"))}
    headers["content-range"] = f"bytes {a}-{b}/{key.size}"
    headers["content-length"] = str(len(body))
    return 206, headers, body

responses.S3Response.get_object = ranged_get_object
main(sys.argv[1:])
"""


def start_moto() -> tuple[subprocess.Popen, str]:
    from tests.s3server import BUCKET, S3Server, free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _RANGED_MOTO, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            S3Server.client_for(endpoint).create_bucket(Bucket=BUCKET)
            return proc, endpoint
        except Exception:  # noqa: BLE001 - the server is still starting
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto's server did not start")


def start_proxy(port: int, latency_s: float) -> tuple[subprocess.Popen, str]:
    """tests/s3server.py's proxy in a subprocess (its socket pumps off the reader's GIL)."""
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from tests.s3server import FaultProxy; "
            "p = FaultProxy(int(sys.argv[2]), latency_s=float(sys.argv[3])); print(p.port, flush=True); time.sleep(1e9)")
    proc = subprocess.Popen([sys.executable, "-c", code, ROOT, str(port), str(latency_s)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, f"http://127.0.0.1:{int(proc.stdout.readline())}"


def run_child(spec: dict) -> dict:
    """One run in a fresh process; its JSON result."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                         capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    if out.returncode:
        raise RuntimeError(f"run {spec['name']} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(spec: dict) -> None:
    """Open the source, then time ``spec["epochs"]`` shuffled epochs; print one JSON line."""
    import naiad
    from naiad.sources.cache import cache_stats
    from tests.s3server import KEY, SECRET

    kw: dict = {}
    if spec["endpoint"]:
        kw = {"storage": naiad.Storage({"key": KEY, "secret": SECRET, "endpoint_url": spec["endpoint"],
                                        "client_kwargs": {"region_name": "us-east-1"}}, cache_dir=spec["cache_dir"])}
    t0 = time.perf_counter()
    if spec["block_bytes"] and spec["path"].endswith(".csv"):
        kw["block_bytes"] = spec["block_bytes"]
    src = naiad.read(spec["path"], **kw)
    src.prepare()
    open_s = time.perf_counter() - t0
    loader = naiad.DataLoader(src, batch_size=1024, shuffle=True, seed=0, read_ahead=spec["read_ahead"])
    times, rows = [], 0
    for epoch in range(spec["epochs"]):
        loader.set_epoch(epoch)
        t = time.perf_counter()
        rows = sum(len(b["label"]) for b in loader)
        times.append(time.perf_counter() - t)
    stats = cache_stats(spec["cache_dir"]) if spec["cache_dir"] else None
    print(json.dumps({"open_s": open_s, "epoch_s": times, "rows": rows,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "fetched_mb": stats.bytes_fetched / 1e6 if stats else 0.0}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the CSV in MB (the Parquet copy is smaller)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="latency the proxy adds to every request")
    ap.add_argument("--row-group-rows", type=int, default=131072, help="rows per Parquet row group")
    ap.add_argument("--csv-block-bytes", type=int, default=None,
                    help="block_bytes of the CSV source (default: naiad's, about 1/4096 of the file, >= 64 KiB)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    print(environment())
    from tests.s3server import BUCKET, S3Server

    tmp = tempfile.mkdtemp(prefix="naiad-bench-remote-")
    procs: list[subprocess.Popen] = []
    try:
        t = time.perf_counter()
        csv_path, pq_path, rows = write_data(tmp, args.mb, args.row_group_rows)
        print(f"wrote {rows:,} rows: CSV {os.path.getsize(csv_path) / 1e6:.0f} MB, Parquet "
              f"{os.path.getsize(pq_path) / 1e6:.0f} MB ({time.perf_counter() - t:.0f} s)")
        server, endpoint = start_moto()
        procs.append(server)
        client = S3Server.client_for(endpoint)
        for p in (csv_path, pq_path):
            client.upload_file(p, BUCKET, os.path.basename(p))
        proxy, slow = start_proxy(int(endpoint.rsplit(":", 1)[1]), args.latency_ms / 1000)
        procs.append(proxy)

        table: list[list] = []
        for fmt, path in (("CSV", csv_path), ("Parquet", pq_path)):
            url = f"s3://{BUCKET}/{os.path.basename(path)}"
            base = {"path": path, "endpoint": None, "cache_dir": None, "read_ahead": None, "epochs": 2,
                    "block_bytes": args.csv_block_bytes}
            local = run_child({**base, "name": f"{fmt} local"})
            ref = local["rows"] / local["epoch_s"][1]
            results = [("local (2nd epoch)", local, 1)]
            cache = os.path.join(tmp, f"cache-{fmt}")
            remote = run_child({**base, "name": f"{fmt} s3", "path": url, "endpoint": endpoint, "cache_dir": cache})
            results += [("s3 cold (1st epoch)", remote, 0), ("s3 cached (2nd epoch)", remote, 1)]
            for read_ahead in (None, 16):
                shutil.rmtree(cache, ignore_errors=True)
                slowed = run_child({**base, "name": f"{fmt} slow", "path": url, "endpoint": slow, "cache_dir": cache,
                                    "read_ahead": read_ahead, "epochs": 1})
                results.append((f"s3 +{args.latency_ms:g} ms cold, read_ahead={read_ahead or 'default'}", slowed, 0))
            shutil.rmtree(cache, ignore_errors=True)
            local_total = local["open_s"] + local["epoch_s"][1]
            for name, r, k in results:
                rate = r["rows"] / r["epoch_s"][k]
                # A first epoch pays the open too (a text object's scan fetches it whole, into
                # the cache when there is one): that ratio counts it on both sides.
                with_open = f"{local_total / (r['open_s'] + r['epoch_s'][k]):.2f}x" if k == 0 else ""
                table.append([fmt, name, f"{r['open_s']:.2f}", f"{r['epoch_s'][k]:.2f}", f"{rate:,.0f}",
                              f"{rate / ref:.2f}x", with_open, f"{r['fetched_mb']:.0f}", f"{r['peak_rss_mib']:.0f}"])
        print(f"\nshuffled epoch, batch_size=1024, num_workers=0 (read-ahead threads); {rows:,} rows")
        print(markdown_table(["format", "run", "open s", "epoch s", "rows/s", "vs local", "open + epoch vs local",
                              "fetched MB", "peak RSS MiB"], table))
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
