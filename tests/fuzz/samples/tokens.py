"""Token files for the sample fuzzers: the seeds (an ``.npy``, a modded-nanogpt shard with its
256-int header, a flat ``.bin``), the damage done to their headers and sizes, the windows NumPy
reads in them (the reference), naiad's read of them, and :func:`token_case`.
"""

from __future__ import annotations

import functools
import io
import os
import warnings

import numpy as np

import naiad
from naiad.errors import SourceError
from tests.fuzz.formats import assert_named
from tests.fuzz.samples.damage import Field, mutated, npy_with_header, set_number, write_file
from tests.fuzz.samples.rules import Pick, settled, within_case_time

TOKENS = 200
SHARD_MAGIC = 20240520
TOKEN_COUNTS = (0, 1, 8, 9, TOKENS - 1, TOKENS + 1, 2**31 - 1, -1, -(2**31), 2**30)
NPY_HEADERS = (
    "{'descr': '<u2', 'fortran_order': False, 'shape': (99999999999,), }",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (-1,), }",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (100, 2), }",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (), }",
    "{'descr': '<u4', 'fortran_order': False, 'shape': (100,), }",
    "{'descr': '<i1', 'fortran_order': False, 'shape': (400,), }",
    "{'descr': '<f2', 'fortran_order': False, 'shape': (200,), }",
    "{'descr': '|O', 'fortran_order': False, 'shape': (200,), }",
    "{'descr': '>u2', 'fortran_order': False, 'shape': (200,), }",
    "{'descr': '<u2', 'fortran_order': True, 'shape': (200,), }",
    "{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (200,), }",
    "{'descr': '<V2', 'fortran_order': False, 'shape': (200,), }",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (200,), 'extra': 1}",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (2" + "0" * 400 + ",), }",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (" + "(" * 200 + ")" * 200 + ",), }",
    "__import__('os').system('echo pwned')",
    "{'descr': '<u2', 'fortran_order': False, 'shape': (200.0,), }",
    "{'descr': '<u2', 'fortran_order': False}",
    "[1, 2, 3]",
)


@functools.cache
def token_seed(layout: str) -> bytes:
    """A valid token file of ``TOKENS`` uint16 tokens: ``npy`` (``np.save``), ``shard``
    (modded-nanogpt's: 256 int32 of header, then the tokens) or ``bin`` (the tokens alone)."""
    tokens = (np.arange(TOKENS) * 7 % 50_000).astype(np.uint16)
    if layout == "npy":
        out = io.BytesIO()
        np.save(out, tokens)
        return out.getvalue()
    if layout == "shard":
        header = np.zeros(256, np.int32)
        header[:3] = SHARD_MAGIC, 1, TOKENS
        return header.tobytes() + tokens.tobytes()
    return tokens.tobytes()


def read_windows(path: str, *, num_workers: int = 0) -> np.ndarray | None:
    """Every window of ``read_tokens(path, seq_len=8)`` as ``[windows, 9]`` tokens in order, or
    None for a SourceError naming the file; any other exception fails."""
    try:
        loader = naiad.DataLoader(naiad.read_tokens(path, seq_len=8), batch_size=4, num_workers=num_workers,
                                  worker_mode="process", timeout=60 if num_workers else 0)
        rows = [np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()[:, -1:]], 1) for b in loader]
    except SourceError as exc:
        assert_named(exc, path)
        return None
    return np.concatenate(rows) if rows else np.zeros((0, 9), np.int64)


def reference_windows(data: bytes) -> np.ndarray | None:
    """The windows a token file holds as NumPy reads it (``np.load``; a shard's header; flat
    uint16), or None where it holds no 1-D integer array that fits its size."""
    if data.startswith(b"\x93NUMPY"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception:  # noqa: BLE001 - whatever NumPy refuses, naiad must refuse
            return None
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            return None
    elif len(data) >= 1024 and int(np.frombuffer(data, "<i4", count=1)[0]) == SHARD_MAGIC:
        version, count = np.frombuffer(data, "<i4", count=3)[1:].tolist()
        if version != 1 or count < 0 or len(data) != 1024 + 2 * count:
            return None
        arr = np.frombuffer(data, "<u2", offset=1024)
    elif len(data) % 2:
        return None
    else:
        arr = np.frombuffer(data, "<u2")
    n = (len(arr) - 1) // 8 if len(arr) > 8 else 0
    return np.stack([arr[i * 8:i * 8 + 9] for i in range(n)]).astype(np.int64) if n else np.zeros((0, 9), np.int64)


def token_case(pick: Pick, folder: str, *, workers: bool = False) -> None:
    """A token file whose header (a shard's version and count, a ``.npy`` header) or size is
    damaged gives the windows NumPy reads in it, or a SourceError naming it; by 2 process
    workers, the same."""
    layout = pick.choice(("npy", "shard", "bin"))
    data, what = token_seed(layout), f"{layout}:"
    how = pick.choice(("header", "header", "cut", "bytes"))
    if how == "header" and layout == "shard":
        field = pick.choice((Field("magic", 0, 4, "little"), Field("version", 4, 4, "little"), Field("count", 8, 4, "little")))
        value = pick.choice(TOKEN_COUNTS + (2, SHARD_MAGIC))
        data, what = set_number(data, field, value), f"{what} {field.name}={value}"
    elif how == "header" and layout == "npy":
        header, version = pick.choice(NPY_HEADERS), pick.choice((1, 2, 3))
        data, what = npy_with_header(header, data[128:], version), f"{what} v{version} header {header[:80]!r}"
    elif how in ("header", "cut"):
        at = pick.randrange(0, len(data) + 1)
        data, what = data[:at], f"{what} cut at {at}"
    else:
        data, damage = mutated(pick, data, reach=0.3)
        what = f"{what} {damage}"
    path = write_file(os.path.join(folder, "tokens" + (".npy" if layout == "npy" else ".bin")), data)
    with within_case_time(what):
        got = read_windows(path)
        expected = reference_windows(data)
        assert got is None or (expected is not None and np.array_equal(got, expected)), f"{what}: other windows than NumPy's"
        if workers:
            from tests.helpers import child_pids, shm_entries

            pids, shm = child_pids(), shm_entries()
            by_workers = read_windows(path, num_workers=2)
            assert (got is None and by_workers is None) or np.array_equal(got, by_workers), f"{what}: workers read otherwise"
            settled(pids, shm)

