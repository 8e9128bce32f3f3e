"""A stream's state, nested by stage, and the pure check of a stored one against the current loader.

NOTE [ Stream state layout ]
A stream's state (what ``BatchStream.get_state`` returns, the ``pipeline`` part of a loader's
state) names each stage's inputs under that stage's key (NOTE [ Stream stages ] in stages.py):

    {"version": 8, "epoch": 3,
     "plan":     {"seed": 0, "shuffle": true, "rank": 0, "world_size": 8, "legs": []},
     "source":   {"files": 12, "total_rows": 1000000, "columns": 9, "blocks": 4096, "digest": "3f2a..."},
     "shuffle":  {"buffer_rows": 131072},
     "batches":  {"batch_size": 1024, "drop_last": false, "yielded": 517},
     "bad_rows": {"skipped": 0, "ledger": {"total": 0, "counts": [], "entries": []}}}

Version 7 (the release before) held the same values side by side at the top (``batches_yielded``
for ``batches.yielded``, ``bad_rows`` and ``bad_row_ledger`` for ``bad_rows``' two): the epoch's
order is the same, so such a state is read into this layout (:func:`nested_state`) and resumes
exactly. Older versions, whose order differs, are refused.

:func:`check_stream_state` checks a stored state against what the current loader knows (its
epoch, seed, shuffle, the data's fingerprint and how many batches a leg's plan has:
:class:`StreamFacts`) without making a pass, and returns where it stood (:class:`StreamPosition`)
or raises a :class:`~naiad.errors.StateError` naming the key and the stored and current values.
A hostile state costs no more than its checks: every count is an int within bounds before it is
used (``order.elastic.state_int``, ``Leg.from_dict``, ``BadRowLedger.load``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from naiad.errors import StateError
from naiad.order.elastic import Leg, iter_legs
from naiad.stream.ledger import BadRowLedger

__all__ = [
    "FLAT_STATE_VERSION",
    "STREAM_STATE_VERSION",
    "StreamFacts",
    "StreamPosition",
    "check_stream_state",
    "nested_state",
    "stream_state",
]

STREAM_STATE_VERSION = 8
"""Version 2 added the data's fingerprint and the epoch's legs (elastic resume); version 3 the
read groups (NOTE [ Read groups ]), which change the shuffle buffer's chunks; version 4 the keyed
permutation big buffers draw from (NOTE [ Keyed permutation ]), which changes their order;
version 5 read groups of half the buffer, not a quarter (``plan.group_rows``), and the stratified
block order (NOTE [ Stratified block order ]); version 6 the runs of blocks a buffer that holds
most of the rows permutes (NOTE [ Block runs ]); version 7 tar shards of any size permute single
blocks (their first reads come before the count: ``early.may_read_early``) and key their samples
by shard and sample (``reads.FileRowKeys``), which changes their order and their crops; version
8 nests the same values by stage (NOTE [ Stream state layout ]): the order is version 7's."""

FLAT_STATE_VERSION = 7
"""The previous release's layout: the same order, its values side by side (read by :func:`nested_state`)."""

SOURCE_KEYS = ("files", "total_rows", "columns", "blocks", "digest")
"""The data's fingerprint (``planning.source_fingerprint``)."""

_PARTS = ("plan", "source", "shuffle", "batches", "bad_rows")


@dataclass(frozen=True)
class StreamFacts:
    """What a stored stream state is checked against: the current loader's, no pass needed.

    Attributes:
        epoch: the epoch the state must be of.
        seed, shuffle: the loader's.
        source: the data's fingerprint now (``planning.source_fingerprint``).
        num_batches: the batches of the plan of a leg (its topology) after the finished legs
            (``planning.plan_for``): a stored position must be within it.
        flat_refused: why a version 7 state cannot resume this source mid-epoch (its plan
            changed in version 8), or None.
    """

    epoch: int
    seed: int
    shuffle: bool
    source: Mapping[str, Any]
    num_batches: Callable[[Leg, Sequence[Leg]], int]
    flat_refused: str | None = None


@dataclass(frozen=True)
class StreamPosition:
    """Where a checked state stood.

    Attributes:
        legs: the epoch's finished legs (NOTE [ Elastic resume ]).
        saved: the leg the state was taken in, its batches the batches yielded.
        num_batches: the batches of ``saved``'s plan.
        bad_rows: rows of the epoch skipped before the position.
        ledger: the skipped rows so far (the saving rank's ledger).
        state: the state in this version's layout.
    """

    legs: list[Leg]
    saved: Leg
    num_batches: int
    bad_rows: int
    ledger: BadRowLedger
    state: dict[str, Any]

    @property
    def ended(self) -> bool:
        """Whether the saved leg had yielded its last batch."""
        return self.saved.batches >= self.num_batches


def stream_state(*, epoch: int, seed: int, shuffle: bool, rank: int, leg: Leg, legs: Sequence[Leg],
                 source: Mapping[str, Any], bad_rows: int, ledger: Mapping[str, Any]) -> dict[str, Any]:
    """A state in this version's layout (NOTE [ Stream state layout ]); ``leg.batches`` is the
    number of batches yielded."""
    return {
        "version": STREAM_STATE_VERSION, "epoch": epoch,
        "plan": {"seed": seed, "shuffle": shuffle, "rank": rank, "world_size": leg.world_size,
                 "legs": [x.as_dict() for x in legs]},
        "source": dict(source),
        "shuffle": {"buffer_rows": leg.buffer_rows},
        "batches": {"batch_size": leg.batch_size, "drop_last": leg.drop_last, "yielded": leg.batches},
        "bad_rows": {"skipped": bad_rows, "ledger": dict(ledger)},
    }


def nested_state(state: Any) -> dict[str, Any]:
    """``state`` in this version's layout: a copy of a version 8 state, a version 7 state's values
    moved under their stages' keys.

    Raises:
        StateError: not a dict of version 7 or 8, or a part that is not a dict.
    """
    version = state.get("version") if isinstance(state, Mapping) else state
    if version == STREAM_STATE_VERSION:
        for part in _PARTS:
            if not isinstance(state.get(part), Mapping):
                raise StateError(f"stream state {part!r}: stored {type(state.get(part)).__name__}, expected a dict.")
        return {**state, **{part: dict(state[part]) for part in _PARTS}}
    if version == FLAT_STATE_VERSION:
        return _from_flat(state)
    raise StateError(
        f"stream state version: stored {version!r:.80}, current {STREAM_STATE_VERSION}; a state saved by "
        "another version of naiad cannot resume mid-epoch (its shuffle or plan differ): start the "
        "epoch again, e.g. a fresh loader with `set_epoch(epoch)`."
    )


def _from_flat(state: Mapping[str, Any]) -> dict[str, Any]:
    """A version 7 state (its values side by side) nested by stage; a key it lacks stays absent,
    so the check names it."""

    def pick(*pairs: tuple[str, str]) -> dict[str, Any]:
        return {new: state[old] for old, new in pairs if old in state}

    return {
        "version": STREAM_STATE_VERSION, "epoch": state.get("epoch"),
        "plan": pick(("seed", "seed"), ("shuffle", "shuffle"), ("rank", "rank"), ("world_size", "world_size"),
                     ("legs", "legs")),
        "source": pick(*((k, k) for k in SOURCE_KEYS)),
        "shuffle": pick(("buffer_rows", "buffer_rows")),
        "batches": pick(("batch_size", "batch_size"), ("drop_last", "drop_last"), ("batches_yielded", "yielded")),
        "bad_rows": pick(("bad_rows", "skipped"), ("bad_row_ledger", "ledger")),
    }


def check_stream_state(state: Any, facts: StreamFacts) -> StreamPosition:
    """Check a stored stream state against ``facts``, without making a pass.

    Raises:
        StateError: naming the key, the stored and the current value, and what to change.
    """
    nested = nested_state(state)
    if nested.get("epoch") != facts.epoch:
        raise StateError(f"stream state epoch: stored {nested.get('epoch')!r:.80}, current {facts.epoch}.")
    _check_same(nested, facts)
    legs = list(iter_legs(nested["plan"].get("legs", [])))
    saved = Leg.from_dict(_leg_fields(nested), batches_key="batches_yielded")
    part = nested["bad_rows"]
    skipped = part.get("skipped", 0)
    if not isinstance(skipped, int) or isinstance(skipped, bool) or skipped < 0:
        raise StateError(f"stream state bad_rows: stored {skipped!r:.80}, expected an int >= 0.")
    ledger = BadRowLedger()
    if "ledger" in part:  # states of naiad before the ledger have none
        ledger.load(part["ledger"])
    n = facts.num_batches(saved, legs)
    if not 0 <= saved.batches <= n:
        raise StateError(f"stream state batches_yielded: stored {saved.batches!r}, its plan has {n}.")
    if facts.flat_refused and state.get("version") == FLAT_STATE_VERSION and (legs or 0 < saved.batches < n):
        raise StateError(f"stream state version: stored {FLAT_STATE_VERSION}, current {STREAM_STATE_VERSION}; "
                         f"{facts.flat_refused}: resume from a state taken between epochs, or with the "
                         "naiad that saved it.")
    return StreamPosition(legs, saved, n, skipped, ledger, nested)


def _check_same(nested: Mapping[str, Any], facts: StreamFacts) -> None:
    """The plan's inputs and the data must be the current ones."""
    current = [("plan", "seed", facts.seed), ("plan", "shuffle", facts.shuffle)]
    current += [("source", key, value) for key, value in facts.source.items()]
    for part, key, value in current:
        stored = nested[part]
        if key == "blocks" and key not in stored:
            continue  # saved before states named their block count
        if stored.get(key) != value:
            raise StateError(
                f"stream state {key!r}: stored {stored.get(key)!r:.80}, current {value!r}; a mid-epoch "
                "resume needs the same files (rows, columns), blocks (`block_bytes`, `block_rows`) "
                "and the same seed and shuffle; make the loader as it was, or resume at an epoch boundary."
            )


def _leg_fields(nested: Mapping[str, Any]) -> dict[str, Any]:
    """The saved leg's values, from the stages that hold them (absent ones stay absent)."""
    where = (("plan", "world_size", "world_size"), ("batches", "batch_size", "batch_size"),
             ("batches", "drop_last", "drop_last"), ("shuffle", "buffer_rows", "buffer_rows"),
             ("batches", "yielded", "batches_yielded"))
    return {name: nested[part][key] for part, key, name in where if key in nested[part]}
