"""Hostile loader states: any JSON value a checkpoint file can hold, put anywhere in a real state,
is either a state that resumes or a StateError, quickly (never another exception, a hang, a huge
allocation, or code run). The states are real: a map-style loader over tensors (seeded, and
torch's own shuffle without `seed=`, with and without `generator=`: their states carry the
recorded draw, `order`), a CSV stream, and a stream and a map-style loader after an elastic
resume (their states carry legs), a map-style loader with in_order=False whose first batch was
overtaken (its state holds runs beyond the prefix), the same after an elastic resume (its leg
holds them), and an IterableDataset's (its workers' counts)."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import naiad
from naiad.errors import StateError

LoaderFactory = Callable[[], naiad.DataLoader]


def _map_loader(world_size: int = 1) -> naiad.DataLoader:
    ds = TensorDataset(torch.arange(100))
    return naiad.DataLoader(ds, batch_size=7, shuffle=True, seed=3, rank=0, world_size=world_size)


def _drawn_loader() -> naiad.DataLoader:
    """torch's own shuffle, no `seed=`: the state records the seed torch drew for the epoch."""
    return naiad.DataLoader(TensorDataset(torch.arange(100)), batch_size=7, shuffle=True)


def _generator_loader() -> naiad.DataLoader:
    """torch's shuffle from a given generator: the state records that generator's state."""
    return naiad.DataLoader(TensorDataset(torch.arange(100)), batch_size=7, shuffle=True,
                            generator=torch.Generator().manual_seed(11))


class SlowAt(Dataset):
    """100 integers; reading sample ``slow`` takes half a second."""

    def __init__(self, slow: int | None = None) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> int:
        if i == self.slow:
            time.sleep(0.5)
        return i


def _unordered_loader(batch_size: int = 7, slow: int | None = None) -> naiad.DataLoader:
    return naiad.DataLoader(SlowAt(slow), batch_size=batch_size, shuffle=True, seed=3, num_workers=2,
                            worker_mode="thread", in_order=False)


class Numbers(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(60))


def _iterable_loader() -> naiad.DataLoader:
    return naiad.DataLoader(Numbers(), batch_size=3)


def _stream_loader(path: Path, world_size: int = 1) -> naiad.DataLoader:
    return naiad.DataLoader(naiad.read_csv(str(path)), batch_size=8, shuffle=True, seed=5, shuffle_buffer=20,
                            rank=0, world_size=world_size)


def _state_after(loader: naiad.DataLoader, batches: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    return state


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[LoaderFactory, dict[str, Any]]]:
    path = tmp_path_factory.mktemp("hostile") / "rows.csv"
    path.write_text("id,x\n" + "".join(f"{i},{i * 0.25}\n" for i in range(150)))
    out: dict[str, tuple[LoaderFactory, dict[str, Any]]] = {
        "map": (_map_loader, _state_after(_map_loader(), 4)),
        "csv": (lambda: _stream_loader(path), _state_after(_stream_loader(path), 3)),
        "map-drawn": (_drawn_loader, _state_after(_drawn_loader(), 4)),
        "map-generator": (_generator_loader, _state_after(_generator_loader(), 4)),
    }
    assert set(out["map-drawn"][1]["pipeline"]["order"]) == {"seed"}
    assert set(out["map-generator"][1]["pipeline"]["order"]) == {"generator_state"}
    # After an elastic resume (2 ranks -> 1), the state holds the finished leg.
    for name, make in (("map-elastic", _map_loader), ("csv-elastic", lambda world_size=1: _stream_loader(path, world_size))):
        resumed = make()
        resumed.load_state_dict(_state_after(make(world_size=2), 2))  # type: ignore[call-arg]
        state = _state_after(resumed, 2)
        assert _get(state, _at(state["pipeline"], "legs")), name
        out[name] = (make, state)
    # in_order=False, the plan's first batch slow: the batches after it overtake it.
    first = int(next(iter(naiad.DataLoader(SlowAt(), batch_size=7, shuffle=True, seed=3)))[0])
    slowed = _unordered_loader(slow=first)
    state = _state_after(slowed, 4)
    slowed.close()
    assert state["pipeline"]["beyond"]
    out["map-unordered"] = (_unordered_loader, state)
    resumed = _unordered_loader(batch_size=5)  # elastic: the finished leg keeps the runs
    resumed.load_state_dict(state)
    elastic = _state_after(resumed, 2)
    resumed.close()
    assert elastic["pipeline"]["legs"][0]["beyond"]
    out["map-unordered-elastic"] = (lambda: _unordered_loader(batch_size=5), elastic)
    out["iterable"] = (_iterable_loader, _state_after(_iterable_loader(), 4))
    # A mixture of token files: its state carries the mixture's fingerprint (seed, weights, sources).
    folder = tmp_path_factory.mktemp("mixture")
    for name, n in (("a", 900), ("b", 500)):
        (torch.arange(n, dtype=torch.int16)).numpy().tofile(folder / f"{name}.bin")

    def mixture_loader() -> naiad.DataLoader:
        sources = [naiad.read_tokens(str(folder / f"{name}.bin"), seq_len=8) for name in ("a", "b")]
        return naiad.DataLoader(naiad.mix(sources, [2, 1], seed=6), batch_size=7, shuffle=True, seed=3)

    out["mixture"] = (mixture_loader, _state_after(mixture_loader(), 4))
    assert out["mixture"][1]["pipeline"]["dataset"]["of"] == "naiad.mix"
    return out


# What a JSON checkpoint can hold (json.loads gives NaN and Infinity as floats, and ints up to
# 4,300 digits), weighted towards the values that break arithmetic, loops and allocations.
EDGE_INTS = [-1, 0, 1, 2**31, 2**63 - 1, 2**63, -(2**63), 2**64, 10**18, 10**30, 10**4000]
scalars = st.one_of(
    st.sampled_from(EDGE_INTS), st.integers(), st.booleans(), st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 0.5]), st.floats(),
    st.text(max_size=20), st.just("x" * 1_000_000),
)
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# Where a stream's state (nested by stage: NOTE [ Stream state layout ]) keeps what a map-style
# state keeps at the top of its part.
_STREAM_KEYS = {"world_size": ("plan", "world_size"), "legs": ("plan", "legs"), "rank": ("plan", "rank"),
                "batch_size": ("batches", "batch_size"), "drop_last": ("batches", "drop_last"),
                "batches_yielded": ("batches", "yielded"), "buffer_rows": ("shuffle", "buffer_rows"),
                "bad_row_ledger": ("bad_rows", "ledger")}


def _at(part: dict[str, Any], key: str) -> tuple[str, ...]:
    """The path to ``key`` in a pipeline's part: nested by stage in a stream's."""
    return ("pipeline", *_STREAM_KEYS[key]) if "plan" in part and key in _STREAM_KEYS else ("pipeline", key)


def _has(part: dict[str, Any], key: str) -> bool:
    try:
        _get({"pipeline": part}, _at(part, key))
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _long_legs(state: dict[str, Any]) -> list[Any]:
    """A `legs` list of a million copies of the state's own leg (each valid on its own)."""
    part = state["pipeline"]
    keys = ("world_size", "batch_size", "drop_last", "buffer_rows")
    return [{**{k: _get(state, _at(part, k)) for k in keys}, "batches": 1}] * 1_000_000


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``value`` a mutation can hit: dict keys and list items, nested."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _get(state: dict[str, Any], path: tuple[Any, ...]) -> Any:
    for key in path:
        state = state[key]
    return state


def _mutate(state: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> Any:
    if not path:
        return value if how == "set" else state
    copy = json.loads(json.dumps(state))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "set":
        parent[last] = value
    elif how == "add" and isinstance(parent[last], dict):
        parent[last]["extra"] = value
    elif how == "add" and isinstance(parent[last], list):
        parent[last].append(value)
    else:
        parent[last] = value
    return copy


def _check(make: LoaderFactory, state: Any) -> None:
    """Loading ``state`` either fails with StateError or gives a loader that runs its first batches."""
    loader = make()
    try:
        loader.load_state_dict(state)
    except StateError:
        return
    it = iter(loader)
    for _ in range(3):
        if next(it, None) is None:
            break
    json.dumps(loader.state_dict())  # and its state is still JSON
    del it
    loader.close()


CASES = ["map", "csv", "map-elastic", "csv-elastic", "map-drawn", "map-generator", "map-unordered",
         "map-unordered-elastic", "iterable", "mixture"]


@pytest.mark.timeout(600)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), data=st.data(), how=st.sampled_from(["set", "set", "delete", "add"]),
       value=json_values)
def test_a_mutated_state_resumes_or_is_a_state_error(cases: dict[str, tuple[LoaderFactory, dict[str, Any]]], case: str,
                                                     data: st.DataObject, how: str, value: Any) -> None:
    make, state = cases[case]
    path = data.draw(st.sampled_from(_paths(state)), label="path")
    _check(make, _mutate(state, path, how, value))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_hostile_shapes_are_state_errors(cases: dict[str, tuple[LoaderFactory, dict[str, Any]]], case: str) -> None:
    make, state = cases[case]
    must_fail, may_pass = hostile_states(state)
    for bad in must_fail:
        with pytest.raises(StateError):
            make().load_state_dict(bad)  # type: ignore[arg-type]
    for bad in may_pass:
        _check(make, bad)


def hostile_states(state: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """Hand-made hostile variants of ``state``: those that must be refused, and those that may
    load (unknown keys are ignored, a far epoch is an epoch) but must not fail otherwise."""
    part = state["pipeline"]
    legs_key = _at(part, "legs")
    must_fail = [
        _mutate(state, ("batches_yielded",), "set", -1),
        _mutate(state, ("base_seed",), "set", 10**30),
        [state],
        "x" * 10_000_000,
    ]
    if _has(part, "world_size"):
        must_fail += [
            _mutate(state, legs_key, "set", _long_legs(state)),  # LONG
            _mutate(state, _at(part, "world_size"), "set", 10**18),
            _mutate(state, _at(part, "batch_size"), "set", 0),
            _mutate(state, _at(part, "batch_size"), "set", -3),
            _mutate(state, _at(part, "batch_size"), "set", 2**63),  # past an int64
            _mutate(state, _at(part, "world_size"), "set", math.inf),
            _mutate(state, _at(part, "drop_last"), "set", "no"),
        ]
    if _has(part, "legs") and _get(state, legs_key):
        must_fail += [
            _mutate(state, (*legs_key, 0, "world_size"), "set", 10**12),
            _mutate(state, (*legs_key, 0, "batches"), "set", math.inf),
            _mutate(state, (*legs_key, 0, "batches"), "set", math.nan),
            _mutate(state, (*legs_key, 0, "batch_size"), "set", "7"),
            _mutate(state, (*legs_key, 0, "batch_size"), "set", 2**63),
            _mutate(state, (*legs_key, 0, "batches"), "set", 1.5),
            _mutate(state, (*legs_key, 0, "drop_last"), "set", "no"),
            _mutate(state, (*legs_key, 0), "set", {"world_size": 1}),
        ]
    for where in [("pipeline",)] + [("pipeline", "legs", i) for i, leg in enumerate(part.get("legs", [])) if "beyond" in leg]:
        runs = _get(state, where)
        if "beyond" not in runs:
            continue
        prefix, key = runs["batches"], (*where, "beyond")
        must_fail += [  # runs beyond a prefix: ints, ascending and apart, after the prefix, within the plan
            _mutate(state, key, "set", [[prefix, prefix + 1]]),
            _mutate(state, key, "set", [[prefix + 3, prefix + 2]]),
            _mutate(state, key, "set", [[prefix + 1, 10**18]]),
            _mutate(state, key, "set", [[prefix + 1, prefix + 3], [prefix + 3, prefix + 4]]),
            _mutate(state, key, "set", [[prefix + 1.5, prefix + 3]]),
            _mutate(state, key, "set", [[prefix + 1, prefix + 2, prefix + 3]]),
            _mutate(state, key, "set", "runs"),
            _mutate(state, key, "set", [[prefix + 1 + 2 * i, prefix + 2 + 2 * i] for i in range(70_000)]),
        ]
    if "in_order" in part:
        must_fail += [
            _mutate(state, ("pipeline", "in_order"), "set", True),
            _mutate(state, ("pipeline", "rank"), "set", part["world_size"]),
            _mutate(state, ("pipeline", "rank"), "set", -1),
            _mutate(state, ("pipeline", "rank"), "delete", None),
        ]
    if "workers" in part:  # an IterableDataset's batches per worker
        must_fail += [
            _mutate(state, ("pipeline", "workers"), "set", [10**18]),
            _mutate(state, ("pipeline", "workers"), "set", [-1]),
            _mutate(state, ("pipeline", "workers"), "set", [part["batches"], 0]),
            _mutate(state, ("pipeline", "workers"), "set", [1] * 1_000_000),
            _mutate(state, ("pipeline", "workers"), "set", "x"),
            _mutate(state, ("pipeline", "batches"), "set", part["batches"] + 1),
            _mutate(state, ("pipeline", "num_workers"), "set", 2),
        ]
    if _has(part, "batches_yielded"):  # a stream's own count
        must_fail.append(_mutate(state, _at(part, "batches_yielded"), "set", 10**18))
    if _has(part, "buffer_rows"):
        must_fail.append(_mutate(state, _at(part, "buffer_rows"), "set", -1))
    if "plan" in part:  # a stream's state, nested by stage: each stage's part a dict
        must_fail += [_mutate(state, ("pipeline", stage), how, "x" * 1_000_000)
                      for stage in ("plan", "source", "shuffle", "batches", "bad_rows") for how in ("set", "delete")]
        must_fail += [
            _mutate(state, ("pipeline", "version"), "set", 6),
            _mutate(state, ("pipeline", "batches", "yielded"), "set", -1),
            _mutate(state, ("pipeline", "bad_rows", "skipped"), "set", math.inf),
            _mutate(state, ("pipeline", "source", "digest"), "set", "x" * 10_000_000),
        ]
    if "order" in part:
        must_fail += [_mutate(state, ("pipeline", "order"), "set", order) for order in hostile_orders(part["order"])]
    may_pass = [
        _mutate(state, ("epoch",), "set", 10**18),
        _mutate(state, ("batches_yielded",), "set", 10**18),
        _mutate(state, ("extra",), "set", _deep(900)),
        _mutate(state, ("pipeline", "extra"), "set", _deep(900)),
    ]
    if _has(part, "world_size"):
        may_pass += [
            _mutate(state, _at(part, "buffer_rows"), "set", 10**18),
            _mutate(state, _at(part, "batch_size"), "set", 10**18),
        ]
    if "beyond" in part:  # the runs forgotten: a state of the prefix alone
        may_pass.append(_mutate(state, ("pipeline", "beyond"), "delete", None))
    if "workers" in part:  # as naiad wrote it before counting per worker
        may_pass.append(_mutate(state, ("pipeline", "workers"), "delete", None))
    if _has(part, "bad_row_ledger"):
        ledger = _at(part, "bad_row_ledger")
        must_fail.append(_mutate(state, (*ledger, "counts"), "set", [["f.csv", "r", math.inf]]))
        may_pass += [
            _mutate(state, (*ledger, "counts"), "set", [["f.csv", "r", 10**18]] * 100_000),
            _mutate(state, (*ledger, "entries"), "set", [{"file": "f.csv", "line": 1}] * 1_000_000),
        ]
    if "dataset" in part:  # a dataset's fingerprint (naiad.mix): every field must match
        fingerprint = ("pipeline", "dataset")
        must_fail += [
            _mutate(state, fingerprint, "delete", None),
            _mutate(state, fingerprint, "set", "x" * 1_000_000),
            _mutate(state, fingerprint, "set", []),
            _mutate(state, fingerprint, "set", {}),
            _mutate(state, (*fingerprint, "seed"), "set", 10**4000),
            _mutate(state, (*fingerprint, "weights"), "set", [0.5, 0.5]),
            _mutate(state, (*fingerprint, "weights", 0), "set", math.nan),
            _mutate(state, (*fingerprint, "sources"), "set", [{}] * 1_000_000),
            _mutate(state, (*fingerprint, "sources", 0, "tokens"), "set", -1),
            _mutate(state, (*fingerprint, "sources", 0), "set", _deep(900)),
        ]
        may_pass.append(_mutate(state, (*fingerprint, "extra"), "set", _deep(900)))
    return must_fail, may_pass


def hostile_orders(order: dict[str, Any]) -> list[Any]:
    """Recorded draws (`order`) that must be refused at load, each of which, unchecked, failed
    at the first batch (ValueError, binascii.Error, RuntimeError, KeyError) or drew another order."""
    state = torch.Generator().get_state().numpy().tobytes()  # a real one, to cut and pad

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return [
        {}, [], "x", 5, [order],
        {"seed": "x"}, {"seed": 10**30}, {"seed": -1}, {"seed": 2**64}, {"seed": True}, {"seed": 1.5},
        {"seed": None}, {"seed": math.nan}, {"seed": [1]},
        {"generator_state": "not base64!"}, {"generator_state": "QUJD="}, {"generator_state": 5},
        {"generator_state": b64(state[:100])},  # short
        {"generator_state": b64(state + b"\0")},  # long
        {"generator_state": b64(bytes(len(state)))},  # the right size, not a generator's state
        {"generator_state": "A" * 10_000_000},
        {"seed": 1, "generator_state": b64(state)},  # both
        {**order, "extra": 1},
        {"Seed": 1},
    ]


@pytest.mark.parametrize("case", ["map-drawn", "map-generator"])
def test_a_recorded_draw_is_checked_at_load_naming_the_field(cases: dict[str, tuple[LoaderFactory, dict[str, Any]]],
                                                             case: str) -> None:
    make, state = cases[case]
    for order in hostile_orders(state["pipeline"]["order"]):
        with pytest.raises(StateError, match="loader state order"):
            make().load_state_dict(_mutate(state, ("pipeline", "order"), "set", order))


def test_a_recorded_draw_is_refused_by_a_loader_whose_order_is_not_drawn(
        cases: dict[str, tuple[LoaderFactory, dict[str, Any]]]) -> None:
    _, state = cases["map-drawn"]
    unshuffled = naiad.DataLoader(TensorDataset(torch.arange(100)), batch_size=7)
    with pytest.raises(StateError, match="loader state order: stored a recorded shuffle"):
        unshuffled.load_state_dict(state)
