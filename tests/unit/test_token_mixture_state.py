"""A mixture's resume checks (naiad.mix): a loader state carries the mixture's seed, weights and
sources, and a state saved over another mixture (or another dataset) is a StateError naming both
values; the per-epoch table gives the windows the per-batch mapping gives. In one process, real
token files."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.errors import ConfigError, StateError
from naiad.tokens import mixture as mixture_module

SPACING = 21000  # file k holds k * SPACING + 0, 1, 2, ...: a window's first token names it


def write_bin(path: pathlib.Path, tokens: np.ndarray) -> str:
    np.asarray(tokens, np.uint16).tofile(path)
    return str(path)


def sources(folder: pathlib.Path, sizes=(1201, 801), names=("web", "code")) -> list[naiad.tokens.TokenWindows]:
    return [naiad.read_tokens(write_bin(folder / f"{name}.bin", k * SPACING + np.arange(n)), seq_len=8)
            for k, (name, n) in enumerate(zip(names, sizes, strict=True))]


def saved_state(mixture: Any, batches: int = 3) -> dict[str, Any]:
    loader = naiad.DataLoader(mixture, batch_size=10, shuffle=True, seed=1)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def loader_over(dataset: Any) -> naiad.DataLoader:
    return naiad.DataLoader(dataset, batch_size=10, shuffle=True, seed=1)


def test_a_mixture_state_carries_its_seed_weights_and_sources(tmp_path):
    m = naiad.mix(sources(tmp_path), [3, 1], seed=4, length=800)
    part = saved_state(m)["pipeline"]
    assert part["dataset"] == m.state_fingerprint()
    assert part["dataset"]["of"] == "naiad.mix" and part["dataset"]["seed"] == 4
    assert part["dataset"]["weights"] == [0.75, 0.25]
    assert [s["tokens"] for s in part["dataset"]["sources"]] == [1201, 801]


@pytest.mark.parametrize("change, key", [
    ({"weights": [1, 1]}, "weights"),
    ({"seed": 5}, "seed"),
    ({"names": ("web", "books")}, "sources"),  # the same sizes, another file
    ({"sizes": (1201, 809)}, "sources"),  # one more window in source 1: as many in the epoch
])
def test_a_state_of_another_mixture_is_a_state_error_naming_both_values(tmp_path, change, key):
    """The epoch's length is 100 windows either way (``length=800``), so the length check alone
    let each of these through: the resume read other windows than the run had planned."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    m = naiad.mix(sources(tmp_path / "a"), [3, 1], seed=4, length=800)
    state = saved_state(m)
    other = naiad.mix(sources(tmp_path / "b", sizes=change.get("sizes", (1201, 801)),
                              names=change.get("names", ("web", "code"))),
                      change.get("weights", [3, 1]), seed=change.get("seed", 4), length=800)
    assert len(other) == len(m)
    with pytest.raises(StateError, match=f"loader state dataset '{key}': stored ") as info:
        loader_over(other).load_state_dict(state)
    message = str(info.value)
    assert f"stored {m.state_fingerprint()[key]!r}, current {other.state_fingerprint()[key]!r}" in message
    assert "make the dataset (naiad.mix) as it was" in message


def test_the_same_mixture_made_again_resumes_with_weights_written_otherwise(tmp_path):
    srcs = sources(tmp_path)
    m = naiad.mix(srcs, [3, 1], seed=4, length=800)
    state = saved_state(m, batches=4)
    rest = [b["input_ids"] for b in loader_over(m)][4:]  # the uninterrupted epoch's rest
    mounted = tmp_path / "elsewhere"  # the same files at another path, as another job mounts them
    mounted.mkdir()
    for folder in (tmp_path, mounted):
        again = naiad.mix(sources(folder), [0.75, 0.25], seed=4, length=800)  # weights normalised alike
        resumed = loader_over(again)
        resumed.load_state_dict(state)
        got = [b["input_ids"] for b in resumed]
        assert len(got) == len(rest) and all(torch.equal(a, b) for a, b in zip(got, rest, strict=True))


def test_states_of_other_datasets_of_the_same_length_are_refused(tmp_path):
    srcs = sources(tmp_path)
    m = naiad.mix(srcs, [1, 1], seed=0, length=8 * len(srcs[0]))  # as many positions as source 0 has windows
    assert len(m) == len(srcs[0]) == 150
    plain = torch.utils.data.TensorDataset(torch.arange(len(m)))
    for saved_over, loaded_over, message in [
        (srcs[0], m, "loader state dataset 'of': stored 'naiad.read_tokens', current 'naiad.mix'"),
        (m, srcs[0], "loader state dataset 'of': stored 'naiad.mix', current 'naiad.read_tokens'"),
        (m, plain, "loader state dataset: stored {'of': 'naiad.mix'"),
        (plain, m, "loader state dataset: stored None, current a naiad.mix dataset"),
    ]:
        with pytest.raises(StateError, match=message.replace("(", r"\(").replace("[", r"\[")):
            loader_over(loaded_over).load_state_dict(saved_state(saved_over))


@pytest.mark.parametrize("value", ["x", [], 5, None, {"of": "naiad.mix"}, {"of": "naiad.mix", "seed": "4"}])
def test_a_hostile_fingerprint_is_a_state_error(tmp_path, value):
    m = naiad.mix(sources(tmp_path), [3, 1], seed=4, length=800)
    state = saved_state(m)
    state["pipeline"]["dataset"] = value
    with pytest.raises(StateError, match="loader state dataset"):
        loader_over(m).load_state_dict(state)
    del state["pipeline"]["dataset"]
    with pytest.raises(StateError, match="loader state dataset: stored None"):
        loader_over(m).load_state_dict(state)


def test_a_huge_stored_value_is_cut_in_the_message(tmp_path):
    m = naiad.mix(sources(tmp_path), [3, 1], seed=4, length=800)
    state = saved_state(m)
    state["pipeline"]["dataset"]["weights"] = ["x" * 1_000_000]
    with pytest.raises(StateError, match="'weights': stored") as info:
        loader_over(m).load_state_dict(state)
    assert len(str(info.value)) < 3000 and "characters)" in str(info.value)


def test_stats_refuses_a_state_of_another_mixture(tmp_path):
    m = naiad.mix(sources(tmp_path), [3, 1], seed=4, length=800)
    state = saved_state(m)
    assert m.stats(state).tokens == 3 * 10 * 8
    with pytest.raises(ConfigError, match="'seed': stored 4, current 9"):
        naiad.mix(m.sources, [3, 1], seed=9, length=800).stats(state)


# -- the table is the function, memoised ----------------------------------------------------


def test_the_epoch_table_gives_the_windows_of_the_per_batch_mapping(tmp_path, monkeypatch):
    """Source 1 (3 windows, 60 per epoch) is up-sampled 20 times an epoch: a batch holds many of
    its passes, each a permutation of its own."""
    srcs = sources(tmp_path, sizes=(1601, 25))
    m = naiad.mix(srcs, [2, 1], seed=7, length=1440)  # 180 windows: 120 of source 0, 60 of source 1
    assert m.windows_per_epoch.tolist() == [120, 60] and len(srcs[1]) == 3
    firsts = np.array([0, SPACING])
    for epoch in (0, 3):
        source, window = m.locate(np.arange(len(m)), epoch)
        # the reference, one position at a time: slot, source, step of its walk, pass, window
        slots = mixture_module.Permutation(len(m), mixture_module._key(7, 0, epoch))(np.arange(len(m)))
        for p in range(len(m)):
            s = int(np.searchsorted(np.cumsum(m.windows_per_epoch), slots[p], side="right"))
            walk = epoch * int(m.windows_per_epoch[s]) + int(slots[p] - (np.cumsum(m.windows_per_epoch) - m.windows_per_epoch)[s])
            n = len(srcs[s])
            w = int(mixture_module.Permutation(n, mixture_module._key(7, 1, s, walk // n))(np.array([walk % n]))[0])
            assert (int(source[p]), int(window[p])) == (s, w)
        expected = firsts[source] + window * 8
        m.set_epoch(epoch)
        by_table = m.gather_batch(np.arange(len(m)))["input_ids"][:, 0].numpy()
        assert (by_table == expected).all()
        monkeypatch.setattr(mixture_module, "TABLE_POSITIONS", 0)  # the per-batch mapping
        shuffled = np.random.default_rng(epoch).permutation(len(m))
        by_function = m.gather_batch(shuffled)["input_ids"][:, 0].numpy()
        monkeypatch.undo()
        assert (by_function == expected[shuffled]).all()
        assert (m.gather_batch(np.array([-1, 0]))["input_ids"][:, 0].numpy() == expected[[-1, 0]]).all()
    with pytest.raises(IndexError, match="position 180 is out of range for a mixture of 180"):
        m.gather_batch(np.array([3, 180]))


def test_the_table_is_not_pickled_and_keeps_two_epochs(tmp_path):
    import pickle

    m = naiad.mix(sources(tmp_path), [1, 1], seed=0)
    for epoch in range(3):
        m.set_epoch(epoch)
        m.gather_batch(np.arange(4))
    assert sorted(m._tables) == [1, 2] and m._tables[2].dtype == np.int32 and len(m._tables[2]) == len(m)
    copy = pickle.loads(pickle.dumps(m))
    assert copy._tables == {}
    copy.set_epoch(2)
    assert torch.equal(copy.gather_batch(np.arange(len(m)))["input_ids"], m.gather_batch(np.arange(len(m)))["input_ids"])
