"""A process keeps a bounded number of files open (NOTE [ Open files ] in sources/openfiles.py):
twice the soft limit on open files, as token files, tar shards or Parquet files, read whole in a
shuffled epoch, in the loop's process and in worker processes and threads.

Each case runs in a child process whose soft ``RLIMIT_NOFILE`` is lowered first, so that a
reader that keeps one descriptor per file fails with "Too many open files" (token files did:
after 16 batches of 300 files under a limit of 256)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tests.helpers import run_to_end

pytestmark = pytest.mark.timeout(240)

SOFT_LIMIT = 128
FILES = 2 * SOFT_LIMIT

CHILD = textwrap.dedent("""
    import json, os, resource, sys, tarfile, io
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    kind, folder, workers, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, hard))
    import naiad
    n = {files}
    if kind == "tokens":
        for i in range(n):
            (np.arange(65, dtype=np.uint16) + 100 * i).tofile(os.path.join(folder, f"t{{i:04d}}.bin"))
        src = naiad.read_tokens(os.path.join(folder, "t*.bin"), seq_len=16)
        key = lambda b: b["input_ids"][:, 0].tolist()
        expected = sorted(i * 100 + k for i in range(n) for k in range(0, 64, 16))
    elif kind == "shards":
        for i in range(n):
            with tarfile.open(os.path.join(folder, f"s{{i:04d}}.tar"), "w") as tar:
                for k in range(3):
                    for ext, data in (("cls", str(i * 10 + k).encode()), ("bin", b"x" * 10)):
                        info = tarfile.TarInfo(f"{{i}}_{{k}}.{{ext}}"); info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        src = naiad.read_webdataset(os.path.join(folder, "s*.tar"), index_dir=False)
        key = lambda b: b["cls"].tolist()
        expected = sorted(i * 10 + k for i in range(n) for k in range(3))
    else:
        for i in range(n):
            pq.write_table(pa.table({{"v": np.arange(3) + 10 * i}}), os.path.join(folder, f"p{{i:04d}}.parquet"))
        src = naiad.read_parquet(os.path.join(folder, "p*.parquet"))
        key = lambda b: b["v"].tolist()
        expected = sorted(i * 10 + k for i in range(n) for k in range(3))
    got = []
    extra = {{}} if kind == "tokens" else {{"shuffle_buffer": 64}}
    loader = naiad.DataLoader(src, batch_size=8, shuffle=True, seed=3, num_workers=workers, worker_mode=mode, **extra)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = [v for b in loader for v in key(b)]
        assert sorted(got) == expected, (len(got), len(expected))
    print(json.dumps({{"rows": len(got), "open": len(os.listdir("/proc/self/fd"))}}))
""").format(soft=SOFT_LIMIT, files=FILES)


@pytest.mark.parametrize("kind", ["tokens", "shards", "parquet"])
@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (2, "process"), (2, "thread")])
def test_twice_the_soft_limit_of_files_read_whole_every_epoch(tmp_path, kind: str, workers: int, mode: str) -> None:
    done = run_to_end([sys.executable, "-c", CHILD, kind, str(tmp_path), str(workers), mode], timeout_s=200)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["open"] < SOFT_LIMIT
