"""A stream's state nested by stage (NOTE [ Stream state layout ] in naiad/stream/state.py): checked
by a pure function without making a pass, and the previous release's flat layout still resumed
exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import naiad
from naiad.errors import StateError
from naiad.order.elastic import Leg
from naiad.stream import batches
from naiad.stream.state import (
    STREAM_STATE_VERSION,
    StreamFacts,
    check_stream_state,
    nested_state,
    stream_state,
)

pytestmark = pytest.mark.timeout(120)

# A loader's state as naiad wrote it before the state was nested (stream state version 7), after
# 20 batches of the loader below, one bad row skipped (the ledger's file is the CSV's path).
V7_STATE = {
    "version": 2, "kind": "stream", "epoch": 0, "batches_yielded": 20, "base_seed": 3,
    "pipeline": {
        "version": 7, "epoch": 0, "batches_yielded": 20, "bad_rows": 1,
        "bad_row_ledger": {"total": 1, "counts": [["{path}", "a conversion error", 1]],
                           "entries": [{"file": "{path}", "line": 39, "column": "id", "reason": "a conversion error",
                                        "epoch": 0}]},
        "seed": 3, "shuffle": True, "files": 1, "total_rows": 300, "columns": 2, "blocks": 11,
        "digest": "2c0dae9e5e617529", "rank": 0, "world_size": 1, "batch_size": 8, "drop_last": False,
        "buffer_rows": 40, "legs": [],
    },
}


def _csv(tmp_path: Path) -> str:
    path = tmp_path / "rows.csv"
    lines = ["id,x"] + [f"{i},{i * 0.5}" if i != 37 else "oops,1" for i in range(300)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _loader(path: str) -> naiad.DataLoader:
    return naiad.DataLoader(naiad.read_csv(path, block_bytes=256, on_bad_rows="skip"), batch_size=8, shuffle=True,
                            seed=3, shuffle_buffer=40)


def _ids(batches: Any) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def _v7(path: str) -> dict[str, Any]:
    return json.loads(json.dumps(V7_STATE).replace("{path}", path))


def test_a_state_of_the_previous_release_resumes_exactly(tmp_path: Path) -> None:
    path = _csv(tmp_path)
    whole = _ids(_loader(path))
    resumed = _loader(path)
    resumed.load_state_dict(_v7(path))
    assert _ids(resumed) == whole[20:]
    assert sum(resumed.bad_rows.values()) == 1  # the ledger came with it


def test_the_previous_layout_nests_as_this_release_writes_it(tmp_path: Path) -> None:
    path = _csv(tmp_path)
    loader = _loader(path)
    it = iter(loader)
    for _ in range(20):
        next(it)
    now = json.loads(json.dumps(loader.state_dict()))["pipeline"]
    old = nested_state(_v7(path)["pipeline"])
    assert now["version"] == old["version"] == STREAM_STATE_VERSION
    for part in ("plan", "source", "shuffle", "batches"):
        assert old[part] == now[part], part
    assert old["bad_rows"]["skipped"] == now["bad_rows"]["skipped"] == 1
    assert old["bad_rows"]["ledger"]["total"] == now["bad_rows"]["ledger"]["total"] == 1
    # and the nested state, saved again, resumes as the old one did
    again = _loader(path)
    again.load_state_dict(loader.state_dict())
    assert _ids(again) == _ids(it)


def test_a_state_resumed_from_the_previous_layout_is_saved_in_this_one(tmp_path: Path) -> None:
    path = _csv(tmp_path)
    resumed = _loader(path)
    resumed.load_state_dict(_v7(path))
    it = iter(resumed)
    next(it)
    part = resumed.state_dict()["pipeline"]
    assert part["version"] == STREAM_STATE_VERSION and part["batches"]["yielded"] == 21


def test_check_state_makes_no_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _csv(tmp_path)
    loader = _loader(path)
    state = _v7(path)

    def no_stream(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a BatchStream was made to check a state")

    monkeypatch.setattr(batches.BatchStream, "__init__", no_stream)
    loader._pipeline.check_state(state["pipeline"], 0)  # type: ignore[attr-defined]
    bad = {**state["pipeline"], "seed": 4}
    with pytest.raises(StateError, match="'seed': stored 4, current 3"):
        loader._pipeline.check_state(bad, 0)  # type: ignore[attr-defined]


# -- the pure check, over hand-made facts ------------------------------------------------------


def _facts(**kw: Any) -> StreamFacts:
    source = {"files": 1, "total_rows": 300, "columns": 2, "blocks": 11, "digest": "2c0dae9e5e617529"}
    values: dict[str, Any] = {"epoch": 0, "seed": 3, "shuffle": True, "source": source,
                              "num_batches": lambda leg, legs: 38}
    return StreamFacts(**{**values, **kw})


def _state(**kw: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "epoch": 0, "seed": 3, "shuffle": True, "rank": 0, "leg": Leg(1, 8, False, 40, 20), "legs": [],
        "source": _facts().source, "bad_rows": 0, "ledger": {"total": 0, "counts": [], "entries": []},
    }
    return stream_state(**{**values, **kw})


def test_the_pure_check_returns_the_position() -> None:
    at = check_stream_state(_state(), _facts())
    assert at.saved == Leg(1, 8, False, 40, 20) and at.legs == [] and at.num_batches == 38 and not at.ended
    assert check_stream_state(_state(leg=Leg(1, 8, False, 40, 38)), _facts()).ended


@pytest.mark.parametrize(("facts", "match"), [
    ({"seed": 4}, "'seed': stored 3, current 4"),
    ({"shuffle": False}, "'shuffle': stored True, current False"),
    ({"epoch": 1}, "epoch: stored 0, current 1"),
    ({"source": {"files": 1, "total_rows": 299, "columns": 2, "blocks": 11, "digest": "2c0dae9e5e617529"}},
     "'total_rows': stored 300, current 299"),
    ({"num_batches": lambda leg, legs: 19}, "batches_yielded: stored 20, its plan has 19"),
])
def test_the_pure_check_names_the_key_and_both_values(facts: dict[str, Any], match: str) -> None:
    with pytest.raises(StateError, match=match):
        check_stream_state(_state(), _facts(**facts))


@pytest.mark.parametrize("mutate", [
    lambda s: s.update(version=6),
    lambda s: s.update(plan="x"),
    lambda s: s.pop("bad_rows"),
    lambda s: s["batches"].update(yielded=-1),
    lambda s: s["batches"].update(yielded=math.inf),
    lambda s: s["batches"].update(batch_size=2**63),
    lambda s: s["batches"].pop("drop_last"),
    lambda s: s["plan"].update(world_size=10**18),
    lambda s: s["plan"].update(legs=[{"world_size": 1}] * 1_000_000),
    lambda s: s["shuffle"].update(buffer_rows=-1),
    lambda s: s["bad_rows"].update(skipped=True),
    lambda s: s["bad_rows"].update(ledger={"counts": [["f", "r", math.inf]]}),
    lambda s: s["source"].update(digest="x" * 10_000_000),
])
def test_a_hostile_state_is_a_state_error_before_any_plan(mutate: Any) -> None:
    state = _state()
    mutate(state)

    def no_plan(leg: Leg, legs: Any) -> int:
        raise AssertionError("planned for a hostile state")

    with pytest.raises(StateError) as info:
        check_stream_state(state, _facts(num_batches=no_plan))
    assert len(str(info.value)) < 1000


def test_a_flat_state_of_a_source_whose_plan_changed_is_refused_mid_epoch_only(tmp_path: Path) -> None:
    flat = _v7("rows.csv")["pipeline"]
    why = "TokenizedSource over WebDatasetSource permutes single blocks since version 8"
    with pytest.raises(StateError, match="stored 7, current 8; TokenizedSource over WebDatasetSource"):
        check_stream_state(flat, _facts(flat_refused=why))
    ended = {**flat, "batches_yielded": 38}  # the epoch was over: the next one plans afresh
    assert check_stream_state(ended, _facts(flat_refused=why)).ended
    assert not check_stream_state(flat, _facts()).ended  # any other source: resumed


def test_a_wrapper_over_tar_shards_refuses_flat_states() -> None:
    from naiad.sources.wrapper import FormatWrapper
    from naiad.stream.batches import _flat_refused

    class Tar:  # what the check asks of the inner source: its traits
        traits = naiad.sources.SourceTraits(early_cut=True, reads_before_count=True)

    class Wrapped(FormatWrapper):
        def __init__(self) -> None:
            self.inner = Tar()  # type: ignore[assignment]

    assert "permutes single blocks" in (_flat_refused(Wrapped()) or "")
    assert _flat_refused(naiad.read_csv.__new__(naiad.read_csv)) is None
