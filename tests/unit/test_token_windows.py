"""Token files as windows (naiad.read_tokens) and mixtures of them (naiad.mix), in one process:
the three layouts against their bytes, windows within files, the dropped tails, position and
document ids against a plain-Python reference, the errors, the mixture's shares and walks."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

import naiad
from naiad.dataset.fetch import choose_fetch
from naiad.errors import ConfigError, SourceError
from naiad.tokens.files import HEADER_BYTES, HEADER_MAGIC


def write_bin(path: pathlib.Path, tokens: np.ndarray, dtype=np.uint16) -> str:
    """As nanoGPT's prepare.py writes train.bin: a memmap of the flat tokens."""
    arr = np.memmap(path, dtype=dtype, mode="w+", shape=(len(tokens),))
    arr[:] = tokens
    arr.flush()
    del arr
    return str(path)


def write_shard(path: pathlib.Path, tokens: np.ndarray, *, magic=HEADER_MAGIC, version=1, count=None) -> str:
    """As modded-nanogpt's fineweb.py writes a shard: 256 int32 of header, then uint16 tokens."""
    header = np.zeros(256, np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())
    return str(path)


def windows_of(tokens: np.ndarray, seq_len: int) -> list[list[int]]:
    """The reference: every window of seq_len + 1 tokens starting at multiples of seq_len."""
    return [tokens[i : i + seq_len + 1].tolist() for i in range(0, len(tokens) - seq_len, seq_len)]


def all_windows(ds) -> list[list[int]]:
    b = ds.gather_batch(np.arange(len(ds)))
    full = torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1)
    assert torch.equal(b["labels"][:, :-1], b["input_ids"][:, 1:])
    return full.tolist()


@pytest.mark.parametrize("seq_len", [1, 7, 16])
def test_bin_npy_and_shard_give_every_window_of_each_file(tmp_path, seq_len):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50257, 1000).astype(np.uint16)
    b = rng.integers(0, 2**20, 333).astype(np.int32)
    c = rng.integers(0, 50257, 129).astype(np.uint16)
    d = rng.integers(0, 2**31, 50).astype(np.uint32)
    np.save(tmp_path / "b.npy", b)
    paths = [write_bin(tmp_path / "a.bin", a), str(tmp_path / "b.npy"), write_shard(tmp_path / "c.bin", c)]
    ds = naiad.read_tokens(paths, seq_len=seq_len)
    assert [f.layout for f in ds.files] == ["bin", "npy", "shard"]
    assert [f.tokens for f in ds.files] == [1000, 333, 129]
    expected = windows_of(a, seq_len) + windows_of(b, seq_len) + windows_of(c, seq_len)
    assert all_windows(ds) == expected  # in order, none across a file's end
    assert len(ds) == sum((n - 1) // seq_len for n in (1000, 333, 129))
    kept = [len(windows_of(x, seq_len)) * seq_len + 1 for x in (a, b, c)]
    assert ds.dropped_tokens == sum(n - k for n, k in zip((1000, 333, 129), kept, strict=True))
    u32 = naiad.read_tokens(write_bin(tmp_path / "d.bin", d, np.uint32), seq_len=seq_len, dtype=np.uint32)
    assert all_windows(u32) == windows_of(d.astype(np.int64), seq_len)


def test_a_file_shorter_than_a_window_is_dropped_and_counted(tmp_path):
    ds = naiad.read_tokens([write_bin(tmp_path / "a.bin", np.arange(9)), write_bin(tmp_path / "b.bin", np.arange(8))],
                           seq_len=8)
    assert len(ds) == 1 and ds.windows_per_file.tolist() == [1, 0]
    assert ds.dropped_tokens == 8 and ds.dropped_per_file.tolist() == [0, 8]
    assert "8 tokens dropped" in repr(ds)


def reference_ids(row: list[int], eos: int) -> tuple[list[int], list[int]]:
    pos, doc, p, d = [], [], 0, 0
    for t in row:
        pos.append(p)
        doc.append(d)
        p += 1
        if t == eos:
            p, d = 0, d + 1
    return pos, doc


def test_position_and_document_ids_match_a_plain_python_reference(tmp_path):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 6, 2000).astype(np.uint16)  # eos (0) about every 6 tokens, runs of eos too
    tokens[100:140] = 3  # a document longer than a window
    ds = naiad.read_tokens(write_bin(tmp_path / "t.bin", tokens), seq_len=32, eos_id=0)
    batch = ds.gather_batch(np.arange(len(ds)))
    assert set(batch) == {"input_ids", "labels", "position_ids", "document_ids"}
    for row, pos, doc in zip(batch["input_ids"].tolist(), batch["position_ids"].tolist(), batch["document_ids"].tolist(), strict=True):
        assert (pos, doc) == reference_ids(row, 0)
    assert all(v.dtype == torch.int64 and v.shape == (len(ds), 32) for v in batch.values())
    assert int(batch["position_ids"].max()) > 32 - 5  # the long document runs on


# A stream cut into four windows of seq_len 4 (eos 0): window 0 holds the end of a document
# and the start of the next; window 1 continues that document and ends with its eos; window 2
# starts right after it (a new document) and ends in two eos in a row; window 3 starts with an eos.
EDGE_STREAM = [5, 6, 0, 7, 8, 9, 3, 0, 4, 5, 0, 0, 0, 6, 7, 0, 2]
EDGE_IDS = {  # window: (position_ids, document_ids) of its inputs
    0: ([0, 1, 2, 0], [0, 0, 0, 1]),  # [5 6 0 | 7]
    1: ([0, 1, 2, 3], [0, 0, 0, 0]),  # [8 9 3 0]: the window's first document, counted from the window's start
    2: ([0, 1, 2, 0], [0, 0, 0, 1]),  # [4 5 0 | 0]: after an eos, a new document; a lone eos is one too
    3: ([0, 0, 1, 2], [0, 1, 1, 1]),  # [0 | 6 7 0]: a leading eos ends the document before the window
}


def test_position_and_document_ids_at_window_edges_are_pinned(tmp_path):
    """A window's first document, before any eos in it, gets positions from 0 at the window's start
    and document id 0, whether it began in an earlier window or right after an eos; each eos ends
    its document (keeping its position) and the next token starts one. The ids of a window are a
    function of its tokens alone: the same in any batch, shuffled, and through a mixture."""
    ds = naiad.read_tokens(write_bin(tmp_path / "t.bin", np.array(EDGE_STREAM)), seq_len=4, eos_id=0)
    assert len(ds) == 4
    batch = ds.gather_batch(np.array([2, 0, 3, 1]))
    for row, w in enumerate([2, 0, 3, 1]):
        assert batch["input_ids"][row].tolist() == EDGE_STREAM[4 * w : 4 * w + 4]
        assert (batch["position_ids"][row].tolist(), batch["document_ids"][row].tolist()) == EDGE_IDS[w]
    other = naiad.read_tokens(write_bin(tmp_path / "o.bin", np.arange(1, 42)), seq_len=4, eos_id=0)
    m = naiad.mix([ds, other], [1, 1], seed=0, length=64)
    source, window = m.locate(np.arange(len(m)), 0)
    mixed = m.gather_batch(np.arange(len(m)))
    for row in np.flatnonzero(source == 0).tolist():
        w = int(window[row])
        assert (mixed["position_ids"][row].tolist(), mixed["document_ids"][row].tolist()) == EDGE_IDS[w]


def test_bos_data_read_with_eos_id_splits_each_document_one_token_late(tmp_path):
    """What docs/TOKENS.md says of BOS data: given the BOS as ``eos_id``, each BOS is taken as the
    end of the document before it, so it carries that document's id, not its own document's."""
    bos = 1
    stream = [bos, 5, 6, bos, 7, 8, 9, bos, 4]  # BOS before each document
    ds = naiad.read_tokens(write_bin(tmp_path / "t.bin", np.array(stream)), seq_len=8, eos_id=bos)
    batch = ds.gather_batch(np.array([0]))
    assert batch["document_ids"][0].tolist() == [0, 1, 1, 1, 2, 2, 2, 2]  # bos | 5 6 bos | 7 8 9 bos
    assert batch["position_ids"][0].tolist() == [0, 0, 1, 2, 0, 1, 2, 3]


def test_the_loader_gathers_whole_batches_and_torch_collates_the_same(tmp_path):
    ds = naiad.read_tokens(write_bin(tmp_path / "t.bin", np.arange(500) % 7), seq_len=10, eos_id=6)
    assert choose_fetch(ds, None, True) == "gather"  # one call per batch, no per-sample collate
    assert naiad.DataLoader(ds, batch_size=8).fetch_strategy == "gather"
    ours = list(naiad.DataLoader(ds, batch_size=8, shuffle=True, seed=0))
    gen = torch.Generator()
    order = naiad.dataset.sampling.epoch_permutation(len(ds), 0, 0)
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=8, sampler=order.tolist(), generator=gen))
    assert len(ours) == len(theirs) == 7
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {k: v.tolist() for k, v in ds[3].items()} == {k: v[3].tolist() for k, v in ds.gather_batch(np.arange(4)).items()}


def test_every_window_once_per_epoch_in_an_order_of_seed_and_epoch(tmp_path):
    ds = naiad.read_tokens(write_bin(tmp_path / "t.bin", np.arange(4001)), seq_len=4)
    loader = naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=5)
    epochs = [[s for b in loader for s in b["input_ids"][:, 0].tolist()] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(0, 4000, 4))
    assert epochs[0] != epochs[1]
    again = naiad.DataLoader(ds, batch_size=64, shuffle=True, seed=5)
    assert [s for b in again for s in b["input_ids"][:, 0].tolist()] == epochs[0]


@pytest.mark.parametrize("case, message", [
    ("npy_float", "must hold integers, this .npy holds float32"),
    ("npy_2d", "must be 1-D, this .npy has shape (10, 10)"),
    ("npy_truncated", "header says 100 tokens"),
    ("npy_dtype", "`dtype` is uint16, but this .npy holds int32"),
    ("bin_odd", "101 bytes is not a whole number of uint16 tokens"),
    ("bin_uint32", "102 bytes is not a whole number of uint32 tokens"),
    ("shard_version", "version 2, expected 1"),
    ("shard_count", "says 500 tokens (1000 bytes after the 1024-byte header), the file has 200"),
    ("shard_negative", "says -1 tokens"),
])
def test_a_bad_token_file_is_a_source_error_naming_it(tmp_path, case, message):
    p = tmp_path / f"{case}.bin"
    kw = {}
    if case.startswith("npy"):
        p = tmp_path / f"{case}.npy"
        arr = {"npy_float": np.zeros(10, np.float32), "npy_2d": np.zeros((10, 10), np.uint16),
               "npy_truncated": np.zeros(100, np.uint16), "npy_dtype": np.zeros(10, np.int32)}[case]
        np.save(p, arr)
        if case == "npy_truncated":
            p.write_bytes(p.read_bytes()[:-20])
        if case == "npy_dtype":
            kw["dtype"] = np.uint16
    elif case == "bin_odd":
        p.write_bytes(b"\x01" * 101)
    elif case == "bin_uint32":
        p.write_bytes(b"\x01" * 102)
        kw["dtype"] = np.uint32
    elif case == "shard_version":
        write_shard(p, np.arange(100), version=2)
    elif case == "shard_count":
        write_shard(p, np.arange(100), count=500)
    elif case == "shard_negative":
        write_shard(p, np.arange(100), count=-1)
    with pytest.raises(SourceError) as info:
        naiad.read_tokens(str(p), seq_len=4, **kw)
    assert message in str(info.value) and str(p) in str(info.value)


def test_bad_arguments_are_config_errors(tmp_path):
    path = write_bin(tmp_path / "t.bin", np.arange(100))
    for kw, message in [({"seq_len": 0}, "`seq_len` must be an int >= 1, got 0"),
                        ({"seq_len": 4, "dtype": np.float32}, "`dtype` must be an integer dtype"),
                        ({"seq_len": 4, "eos_id": "x"}, "`eos_id` must be an int")]:
        with pytest.raises(ConfigError, match=message):
            naiad.read_tokens(path, **kw)
    with pytest.raises(SourceError, match="file not found"):
        naiad.read_tokens(str(tmp_path / "missing.bin"), seq_len=4)


def test_a_header_magic_with_a_wrong_size_is_not_read_as_flat_tokens(tmp_path):
    """The magic decides: a shard whose count does not fit is refused, not read as uint16 tokens
    of a flat file (which would train on the header's ints)."""
    p = write_shard(tmp_path / "s.bin", np.arange(64), count=63)
    with pytest.raises(SourceError, match="token shard header"):
        naiad.read_tokens(p, seq_len=8)
    ok = naiad.read_tokens(write_shard(tmp_path / "ok.bin", np.arange(64)), seq_len=8)
    assert ok.files[0].offset == HEADER_BYTES and all_windows(ok)[0] == list(range(9))


# -- mixtures ---------------------------------------------------------------------------------


def three_sources(tmp_path, sizes=(4001, 801, 20001), seq_len=4):
    return [naiad.read_tokens(write_bin(tmp_path / f"s{i}.bin", i * 21000 + np.arange(n)), seq_len=seq_len)
            for i, n in enumerate(sizes)]


def test_each_epoch_holds_each_source_s_share_exactly(tmp_path):
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs, [0.5, 0.3, 0.2], seed=3)
    assert len(m) == sum(len(s) for s in srcs) == 1000 + 200 + 5000
    assert m.windows_per_epoch.tolist() == [3100, 1860, 1240]
    for epoch in range(3):
        source, window = m.locate(np.arange(len(m)), epoch)
        assert np.bincount(source).tolist() == [3100, 1860, 1240]
        for s in range(3):
            w = window[source == s]
            assert ((w >= 0) & (w < len(srcs[s]))).all()
    st = m.stats()
    assert [round(s.share, 3) for s in st.sources] == [0.5, 0.3, 0.2]


def test_sources_walk_their_windows_across_epochs(tmp_path):
    """Source 0 (1000 windows, 3100 per epoch) is up-sampled; source 2 (5000 windows, 1240 per
    epoch) goes on where it stopped: over 5 epochs it reads each of its windows once (6200
    reads), and each of source 0's passes is a permutation."""
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs, [0.5, 0.3, 0.2], seed=3)
    reads: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for epoch in range(5):
        source, window = m.locate(np.arange(len(m)), epoch)
        for s in range(3):
            # the epoch's windows of s, in walk order (the position permutation's slot order)
            mine = np.flatnonzero(source == s)
            slots = naiad.tokens.mixture.Permutation(len(m), naiad.tokens.mixture._key(3, 0, epoch))(mine)
            reads[s] += window[mine[np.argsort(slots)]].tolist()
    for s, n in enumerate(len(x) for x in srcs):
        walk = np.array(reads[s])
        for start in range(0, len(walk) - n + 1, n):  # every whole pass is a permutation
            assert sorted(walk[start : start + n].tolist()) == list(range(n))
    assert len(reads[2]) == 6200 and len(set(reads[2][:5000])) == 5000


def test_the_mapping_is_a_pure_function_of_seed_epoch_and_position(tmp_path):
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs, [1, 1, 1], seed=9)
    a = m.locate(np.arange(len(m)), 2)
    idx = np.random.default_rng(0).permutation(len(m))[:100]
    b = naiad.mix(srcs, [1, 1, 1], seed=9).locate(idx, 2)
    assert (a[0][idx] == b[0]).all() and (a[1][idx] == b[1]).all()
    c = naiad.mix(srcs, [1, 1, 1], seed=10).locate(np.arange(len(m)), 2)
    assert not (a[0] == c[0]).all()
    assert not (a[0] == m.locate(np.arange(len(m)), 3)[0]).all()


def test_mixture_batches_hold_their_sources_windows_and_the_epoch_is_the_tasks(tmp_path):
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs, [0.6, 0.2, 0.2], seed=1, length=4000)  # 4000 tokens: 1000 windows
    assert len(m) == 1000 and m.windows_per_epoch.tolist() == [600, 200, 200]
    loader = naiad.DataLoader(m, batch_size=50, shuffle=True, seed=0)
    for epoch in range(2):
        firsts = np.array([t for b in loader for t in b["input_ids"][:, 0].tolist()])
        counts = np.bincount(firsts // 21000, minlength=3)
        assert counts.tolist() == [600, 200, 200]
        source, window = m.locate(np.arange(1000), epoch)
        starts = np.array([21000 * s for s in range(3)])[source] + window * 4
        assert sorted(firsts.tolist()) == sorted(starts.tolist())


def test_by_samples_and_length_and_bad_mixtures(tmp_path):
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs[:2], [1, 3], by="samples", length=100)
    assert m.windows_per_epoch.tolist() == [25, 75]
    assert naiad.mix(srcs[:2], [1, 3], length=400).windows_per_epoch.tolist() == [25, 75]
    other = naiad.read_tokens(srcs[0].files[0].path, seq_len=8)
    eos = naiad.read_tokens(srcs[0].files[0].path, seq_len=4, eos_id=0)
    for args, kw, message in [
        (([], []), {}, "at least one token source"),
        ((srcs[:2], [1]), {}, "one positive finite number per source"),
        ((srcs[:2], [1, 0]), {}, "one positive finite number per source"),
        ((srcs[:2], [1, float("nan")]), {}, "one positive finite number per source"),
        (([srcs[0], other], [1, 1]), {}, "same `seq_len`"),
        (([srcs[0], eos], [1, 1]), {}, "same `eos_id`"),
        ((srcs[:2], [1, 1]), {"by": "documents"}, "`by` must be"),
        ((srcs[:2], [1, 1e-9]), {}, "rounds to no window"),
        ((srcs[:2], [1, 1]), {"length": 0}, "`length` must be an int >= 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            naiad.mix(*args, **kw)


def test_mix_under_torch_s_dataloader_reads_the_epoch_set_on_it(tmp_path):
    m = naiad.mix(three_sources(tmp_path), [1, 1, 2], seed=2, length=2000)
    ours = [b["input_ids"] for b in naiad.DataLoader(m, batch_size=25)]  # epoch 0, in order
    m.set_epoch(1)
    theirs_1 = [b["input_ids"] for b in torch.utils.data.DataLoader(m, batch_size=25)]
    m.set_epoch(0)
    theirs_0 = [b["input_ids"] for b in torch.utils.data.DataLoader(m, batch_size=25)]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs_0, strict=True)) and len(ours) == len(theirs_0) == 20
    assert not all(torch.equal(a, b) for a, b in zip(ours, theirs_1, strict=True))


def test_mix_stats_refuses_a_position_it_cannot_count_from(tmp_path):
    srcs = three_sources(tmp_path)
    m = naiad.mix(srcs, [1, 1, 1], length=400)
    assert m.stats(naiad.DataLoader(m, batch_size=10, shuffle=True, seed=0)).tokens == 0
    for loader, message in [
        (naiad.DataLoader(srcs[0], batch_size=10, shuffle=True, seed=0), "a state of a dataset of 1000 positions"),
        (naiad.DataLoader(m, batch_size=10, shuffle=True), "without `seed=`"),
    ]:
        it = iter(loader)
        next(it)
        with pytest.raises(ConfigError, match=message):
            m.stats(loader)
    with pytest.raises(ConfigError, match="resumable state_dict"):
        m.stats({"epoch": 0})


def test_files_of_other_dtypes_share_a_batch(tmp_path):
    """uint64 beside int32 has no common integer dtype in NumPy (it says float64): int64."""
    np.save(tmp_path / "a.npy", np.arange(50, dtype=np.uint64))
    np.save(tmp_path / "b.npy", 100 + np.arange(50, dtype=np.int32))
    ds = naiad.read_tokens([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], seq_len=8)
    assert ds.window_tokens(np.array([0, 6])).dtype == np.int64
    assert all_windows(ds) == windows_of(np.arange(50), 8) + windows_of(100 + np.arange(50), 8)
