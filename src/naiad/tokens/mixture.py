"""A weighted mixture of token sources as one map-style dataset (:func:`mix`).

NOTE [ Token mixture ]
An epoch of the mixture is ``W`` positions (windows): ``length // seq_len`` for ``length`` tokens
(default: every source's windows once). Source ``s`` gets ``c_s`` of them, its weight's share
(the largest-remainder rounding of ``W * p_s``, every source at least one). Which source position
``p`` of epoch ``e`` reads, and which of its windows, is a pure function of ``(seed, e, p)``:

1. ``q = P_e(p)``, a keyed permutation of ``range(W)`` (order/permutation.py, a Feistel network
   evaluated at the batch's positions only, no table). The slots ``[o_s, o_s + c_s)`` of ``q``
   belong to source ``s``: position ``p`` reads source ``s`` with ``o_s <= q < o_s + c_s``, as
   its ``k = q - o_s``-th window of the epoch. So each epoch holds exactly ``c_s`` windows of each
   source, spread over the epoch at random.
2. Source ``s`` walks its own windows in passes of its own: the ``k``-th window of epoch ``e``
   is number ``g = e * c_s + k`` of its walk, which is window ``Q_{s,g // n_s}(g % n_s)`` of its
   ``n_s``, with ``Q_{s,j}`` a keyed permutation of its windows for its own pass ``j``. A source
   smaller than its share starts a new pass, in a new order, within the epoch (it is
   up-sampled); a larger one goes on next epoch where this one stopped; so over enough epochs
   every window of every source is read, each pass a permutation.

Nothing here depends on the world size, the batch size or the workers: the loader's map pipeline
(the ``seed=`` shuffle of positions, the ranks' ranges, exact and elastic resume) decides which
positions a rank delivers, and this mapping what they hold. The state is the loader's few
integers; a resume on another world size keeps the weights, because the positions still owed are
the epoch's, each already assigned. The epoch is the loader's (the task's, in naiad's workers),
or :meth:`TokenMixture.set_epoch`'s outside them (under torch's DataLoader).

What must stay the same for a resume (the seed, the weights, the sources) is the mixture's
``state_fingerprint()``, stored in the loader's state and checked when it is loaded (NOTE
[ Dataset fingerprint ] in dataset/pipeline.py).

NOTE [ Mixture table ]
Evaluated per batch, the mapping is two keyed permutations and a few lookups over ``B`` indices:
a few dozen NumPy calls, several times what reading ``B`` windows from the page cache costs. So
each process that reads computes it once per epoch, for all ``W`` positions, at the epoch's first
batch (a NumPy pass over ``W``, in chunks, with the permutations of each source's pass applied to
all its slots of the chunk at once), as a table of *global* window numbers over the sources'
files joined in order (:meth:`TokenWindows.joined`): then a batch is one index into the table
and one read, as for a single source. The tables of the last two epochs read are kept (a pass
of the epoch before may still be read); each is 4 bytes a position (8 past 2**31 windows), and
they are never pickled. Past :data:`TABLE_POSITIONS` positions (32 MB per process) the mapping is
evaluated per batch instead. Either way the windows are the same: the table is the function,
memoised.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from naiad.dataset.sampling import epoch_permutation
from naiad.errors import ConfigError, StateError
from naiad.order.elastic import Leg, epoch_sequence, iter_legs, leg_remaining, no_buffer
from naiad.order.permutation import Permutation
from naiad.parallel.context import current_epoch
from naiad.pipeline import check_fields
from naiad.process_state import ProcessLocal
from naiad.sources.base import Source
from naiad.tokens.text import Tokenize
from naiad.tokens.windows import TokenWindows, WindowSamples, window_batch

__all__ = ["TABLE_POSITIONS", "MixtureStats", "SourceStats", "TokenMixture", "mix"]

_MASK64 = (1 << 64) - 1
TABLE_POSITIONS = 1 << 23
"""The most positions per epoch whose mapping is kept as a table (NOTE [ Mixture table ])."""
_CHUNK = 1 << 20  # positions mapped at a time when a table is made: bounds its temporaries


def mix(
    sources: Sequence[TokenWindows],
    weights: Sequence[float],
    *,
    by: Literal["tokens", "samples"] = "tokens",
    seed: int | None = None,
    length: int | None = None,
) -> TokenMixture:
    """A weighted mixture of token sources (:func:`naiad.read_tokens`) as one dataset
    (NOTE [ Token mixture ]).

    Each epoch is ``length`` tokens, of which source ``i`` gives ``weights[i] / sum(weights)``;
    each source walks its own shuffled windows across epochs (a small source starts again, in a
    new order; a large one goes on where it stopped), so over epochs every window of every
    source is seen. Give it to :class:`naiad.DataLoader` as any map-style dataset
    (``shuffle=True, seed=...``): exactly once across ranks and workers, exact and elastic resume,
    and the weights held after a resume on another world size. :meth:`TokenMixture.stats` reports
    the tokens delivered per source against the weights. docs/TOKENS.md, "Mixtures".

    Args:
        sources: token sources with the same ``seq_len`` and ``eos_id``.
        weights: one positive weight per source (normalised to sum to 1).
        by: what the weights count: ``"tokens"`` (default) or ``"samples"`` (windows). Every
            window of a token file holds ``seq_len`` tokens, so the two give the same shares here.
        seed: keys which source each position reads and each source's order (None: 0). A resume
            needs the same seed, sources and weights: the loader's state carries them, and
            another value is a StateError naming both (:meth:`TokenMixture.state_fingerprint`).
        length: tokens (or samples, with ``by="samples"``) per epoch, rounded down to whole
            windows; None: all the sources' windows together, once.

    Raises:
        ConfigError: raw text (a text source or :func:`naiad.tokenize`: convert it with
            ``naiad convert --tokenize`` and mix :func:`naiad.read_tokens` of the result), no
            sources, weights that are not positive finite numbers or do not match
            the sources, sources with other ``seq_len`` or ``eos_id``, an empty source, or a
            source whose share of an epoch rounds to no window.

    Example:
        >>> web = naiad.read_tokens("web/*.bin", seq_len=1024)  # doctest: +SKIP
        >>> code = naiad.read_tokens("code/*.bin", seq_len=1024)  # doctest: +SKIP
        >>> data = naiad.mix([web, code], [0.7, 0.3], seed=0)  # doctest: +SKIP
        >>> loader = naiad.DataLoader(data, batch_size=16, shuffle=True, seed=0)  # doctest: +SKIP
    """
    return TokenMixture(sources, weights, by=by, seed=seed, length=length)


def _key(*parts: int) -> int:
    """A 64-bit key from ints (SeedSequence mixes them; none of them is lost)."""
    return int(np.random.SeedSequence([int(p) & _MASK64 for p in parts]).generate_state(1, np.uint64)[0])


@functools.lru_cache(maxsize=256)
def _permutation(n: int, *parts: int) -> Permutation:
    """The permutation of ``range(n)`` keyed by ``parts`` (kept: a batch's sources and passes
    recur batch after batch)."""
    return Permutation(n, _key(*parts))


def _by_pass(step: np.ndarray, first: int, last: int) -> list[tuple[int, np.ndarray]]:
    """Rows grouped by pass, as ``(pass, row numbers)``; ``step[j]`` is row ``j``'s pass less
    ``first``."""
    keys = step.astype(np.uint16) if last - first < 1 << 16 else step  # a stable sort of uint16 is a radix sort
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    return [(first + int(step[g[0]]), g) for g in np.split(order, cuts)]


def _apportion(total: int, shares: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``shares`` (largest remainders), as int64."""
    exact = total * shares
    counts: np.ndarray = np.floor(exact).astype(np.int64)
    rest = total - int(counts.sum())
    if rest > 0:
        order = np.argsort(-(exact - counts), kind="stable")
        counts[order[:rest]] += 1
    return counts


def _checked_sources(sources: Sequence[Any]) -> list[TokenWindows]:
    """The sources of a mixture: token windows, each with a window at least (raw text refused
    with the way to tokenize it)."""
    out = list(sources)
    if not out:
        raise ConfigError("`sources` must name at least one token source, got none.")
    for i, src in enumerate(out):
        if isinstance(src, (Source, Tokenize)):
            raise ConfigError(
                f"`sources[{i}]` is raw text ({type(src).__name__}): naiad.mix mixes token windows, which it reads "
                "at random and counts before an epoch starts, and a text source's windows exist only once its "
                "documents are tokenized and packed. Tokenize it once with `naiad convert TEXT DEST --tokenize "
                "TOKENIZER` and mix naiad.read_tokens(DEST, seq_len=..., eos_id=...) (docs/TOKENS.md, "
                "\"Mixing raw text\").")
        if not isinstance(src, TokenWindows):
            raise ConfigError(f"`sources[{i}]` must be a naiad.read_tokens(...) source, got {type(src).__name__}.")
        if len(src) == 0:
            raise ConfigError(f"`sources[{i}]` has no window of seq_len + 1 = {src.seq_len + 1} tokens "
                              f"({src!r}); drop it or use a shorter seq_len.")
    return out


class TokenMixture(WindowSamples):
    """A weighted mixture of token sources, one map-style dataset (see :func:`mix`).

    Attributes:
        sources: the sources, in order.
        weights: the weights, normalised to sum to 1.
        windows_per_epoch: each source's windows in one epoch of the mixture.
        seq_len: tokens per sequence (every source's).
        eos_id: the end-of-document token (every source's), or None.
    """

    def __init__(
        self,
        sources: Sequence[TokenWindows],
        weights: Sequence[float],
        *,
        by: Literal["tokens", "samples"] = "tokens",
        seed: int | None = None,
        length: int | None = None,
    ) -> None:
        self.sources = _checked_sources(sources)
        w = [float(x) for x in weights]
        if len(w) != len(self.sources) or not all(math.isfinite(x) and x > 0 for x in w):
            raise ConfigError(f"`weights` must be one positive finite number per source ({len(self.sources)}), got {list(weights)!r:.200}.")
        seq_lens = sorted({s.seq_len for s in self.sources})
        if len(seq_lens) > 1:
            raise ConfigError(f"every source of a mixture needs the same `seq_len`, got {seq_lens}; read them with one seq_len.")
        eos = {s.eos_id for s in self.sources}
        if len(eos) > 1:
            raise ConfigError(f"every source of a mixture needs the same `eos_id`, got {sorted(eos, key=repr)}.")
        if by not in ("tokens", "samples"):
            raise ConfigError(f"`by` must be 'tokens' or 'samples', got {by!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ConfigError(f"`seed` must be an int or None, got {seed!r}.")
        self.seq_len = seq_lens[0]
        self.eos_id = self.sources[0].eos_id
        self.by = by
        self.seed = 0 if seed is None else int(seed)
        self.epoch = 0
        self.weights = np.array(w) / sum(w)
        self.own_windows = np.array([len(s) for s in self.sources], np.int64)
        self.windows_per_epoch = self._shares(length)
        self._slot_ends = np.cumsum(self.windows_per_epoch)
        self._slot_starts = self._slot_ends - self.windows_per_epoch
        self._joined = TokenWindows.joined(self.sources)
        self._bases = np.cumsum(self.own_windows) - self.own_windows  # each source's first global window
        # Tables are plain numbers, true in a forked child too; the lock is this process's
        # (NOTE [ Per-process state ]: a thread of the parent may have held it at the fork).
        self._tables: dict[int, np.ndarray] = {}
        self._table_lock = ProcessLocal(threading.Lock, name="naiad.mix table lock")

    def _shares(self, length: int | None) -> np.ndarray:
        """Windows per source in an epoch: its share of the epoch's units (``length`` of them, or
        every window's), in its own units per window."""
        by = self.by
        unit = (np.array([s.tokens_per_window for s in self.sources], np.int64) if by == "tokens"
                else np.ones(len(self.sources), np.int64))
        if length is None:
            total = int((self.own_windows * unit).sum())
        elif isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
            raise ConfigError(f"`length` must be an int >= 1 ({by} per epoch) or None, got {length!r}.")
        else:
            total = int(length)
        per_unit = self.weights / unit
        windows = total // int(unit.max()) if by == "tokens" else total
        shares = _apportion(windows, per_unit / per_unit.sum())
        empty = np.flatnonzero(shares == 0)
        if len(empty):
            i = int(empty[0])
            raise ConfigError(f"source {i}'s share of an epoch ({self.weights[i]:.3g} of {total} {by}) rounds to no "
                              "window; raise its weight or `length`.")
        return shares

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tables"] = {}  # never pickled: each process makes its own (the lock pickles as its recipe)
        return state

    def __len__(self) -> int:
        return int(self._slot_ends[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{w:.3g}: {c} of {n} windows" for w, c, n in
                          zip(self.weights, self.windows_per_epoch.tolist(), self.own_windows.tolist()))
        return f"TokenMixture({len(self)} windows per epoch; {parts})"

    @property
    def tokens_per_window(self) -> int:
        """Training tokens per window (``seq_len``)."""
        return self.seq_len

    def state_fingerprint(self) -> dict[str, Any]:
        """What a loader's state must match to resume over this mixture (NOTE [ Dataset
        fingerprint ] in dataset/pipeline.py): its seed, ``by``, ``seq_len``, weights (normalised)
        and each source's files (their count and digest) and tokens."""
        # About 80 bytes a source with its weight: a state stays under 4 KB up to about 45 sources.
        sources = [{k: v for k, v in s.state_fingerprint().items() if k in ("files", "tokens", "digest")}
                   for s in self.sources]
        return {
            "of": "naiad.mix", "seed": self.seed, "by": self.by, "seq_len": self.seq_len,
            "weights": [round(x, 12) for x in self.weights.tolist()],  # [1, 3] and [0.25, 0.75] alike
            "sources": sources,
        }

    def set_epoch(self, epoch: int) -> None:
        """The epoch to read outside naiad's workers (torch's DataLoader, or a plain loop).
        naiad's loader needs no call: each task carries its epoch."""
        self.epoch = int(epoch)

    def _epoch_now(self) -> int:
        epoch = current_epoch()
        return self.epoch if epoch is None else int(epoch)

    # -- the mapping --------------------------------------------------------------------------

    def locate(self, indices: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and the source's window that positions ``indices`` of ``epoch`` read
        (NOTE [ Token mixture ]), as two int64 arrays."""
        idx = np.asarray(indices, np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (int(idx.min()) < -n or int(idx.max()) >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"position {int(bad)} is out of range for a mixture of {n} windows per epoch.")
        return self._locate(np.where(idx < 0, idx + n, idx), epoch)

    def _locate(self, idx: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        slots = _permutation(len(self), self.seed, 0, epoch)(idx)
        source = np.searchsorted(self._slot_ends, slots, side="right")
        window = np.empty(len(idx), np.int64)
        # Per source present (a loop over sources, not rows): its slots are steps of its walk,
        # cut into passes; one permutation per (source, pass), over all its rows at once. An epoch
        # holds one or two passes of a source unless it is up-sampled past its size.
        for s in np.flatnonzero(np.bincount(source, minlength=len(self.sources))).tolist():
            rows = np.flatnonzero(source == s)
            # step e * c_s + k of its walk (k: the slot's rank among the source's); an absurd
            # epoch (a hostile state's) wraps rather than overflow int64
            steps = slots[rows] - int(self._slot_starts[s]) + (epoch * int(self.windows_per_epoch[s])) % (1 << 62)
            passes, offsets = np.divmod(steps, int(self.own_windows[s]))
            first, last = int(passes.min()), int(passes.max())
            groups = [(first, np.arange(len(rows)))] if first == last else _by_pass(passes - first, first, last)
            for p, group in groups:
                perm = _permutation(int(self.own_windows[s]), self.seed, 1, s, p)
                window[rows[group]] = perm(offsets[group])
        return source, window

    def global_windows(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The windows positions ``indices`` of ``epoch`` read, numbered over the sources' files
        joined in order (NOTE [ Mixture table ])."""
        if len(self) <= TABLE_POSITIONS:
            try:
                return self._table(epoch)[np.asarray(indices, np.int64)]  # negatives count from the end
            except IndexError:
                pass  # locate() says which position, in the mixture's words
        source, window = self.locate(indices, epoch)
        out: np.ndarray = self._bases[source] + window
        return out

    def _table(self, epoch: int) -> np.ndarray:
        """Every position's global window in ``epoch`` (NOTE [ Mixture table ]), made once per
        process and epoch."""
        table = self._tables.get(epoch)
        if table is not None:
            return table
        with self._table_lock.get():
            table = self._tables.get(epoch)
            if table is None:
                n = len(self)
                table = np.empty(n, np.int32 if len(self._joined) < 2**31 else np.int64)
                for a in range(0, n, _CHUNK):
                    source, window = self._locate(np.arange(a, min(n, a + _CHUNK), dtype=np.int64), epoch)
                    table[a : a + len(source)] = self._bases[source] + window
                # The last epoch's table stays (its pass may still be read); the dict is swapped
                # whole, so a reader never sees a table half made.
                self._tables = {**dict(list(self._tables.items())[-1:]), epoch: table}
        return table

    def gather_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch at positions ``indices`` of the current epoch: one read over all sources."""
        windows = self.global_windows(indices, self._epoch_now())
        return window_batch(self._joined.read_windows(windows), self.eos_id)

    # -- what was delivered -------------------------------------------------------------------

    def stats(self, position: Any = None) -> MixtureStats:
        """Tokens per source against the weights.

        Args:
            position: a :class:`naiad.DataLoader` over this mixture, or its ``state_dict()``:
                the tokens delivered so far, by every rank together, are counted from it (the
                epochs before the state's one whole, this one's delivered positions exactly,
                through any elastic legs). None: one epoch's plan.

        Raises:
            ConfigError: a state of another dataset, or of a shuffle naiad did not record
                (``shuffle=True`` without ``seed=``).
        """
        per_epoch = self.windows_per_epoch * self.seq_len
        if position is None:
            return MixtureStats.of(self, 0, per_epoch, self.windows_per_epoch)
        state = position.state_dict() if hasattr(position, "state_dict") else position
        windows = self._delivered(state)
        return MixtureStats.of(self, int(state["epoch"]), windows * self.seq_len, windows)

    def _delivered(self, state: Mapping[str, Any]) -> np.ndarray:
        """Windows delivered per source up to ``state`` (whole epochs before its epoch)."""
        part = state.get("pipeline") if isinstance(state, Mapping) else None
        if not isinstance(part, Mapping) or state.get("kind") != "map" or state.get("resumable") is False:
            raise ConfigError("`position` must be a naiad.DataLoader over this mixture or its resumable state_dict().")
        if part.get("length") != len(self):
            raise ConfigError(f"`position` is a state of a dataset of {part.get('length')} positions, this mixture has {len(self)}.")
        stored = part.get("dataset")
        try:
            check_fields(stored if isinstance(stored, Mapping) else {}, self.state_fingerprint(),
                         "`position` is a state of another dataset:", "count with the mixture the loader was made with.")
        except StateError as exc:
            raise ConfigError(str(exc)) from None
        if "order" in part:
            raise ConfigError("the loader shuffles without `seed=`: its order is not a function naiad can count "
                              "from; give the loader `seed=`.")
        epoch = int(state["epoch"])
        counts = epoch * self.windows_per_epoch
        n = len(self)
        owed = leg_remaining(epoch_sequence(n, list(iter_legs(part.get("legs", []))), lambda i: no_buffer),
                             Leg.from_dict(part))
        done = np.ones(n, bool)
        done[owed.to_array()] = False
        offsets = np.flatnonzero(done)
        seed = part.get("seed")
        order = epoch_permutation(n, int(seed), epoch) if seed is not None else np.arange(n, dtype=np.int64)
        if len(offsets):
            source, _ = self.locate(order[offsets], epoch)
            counts = counts + np.bincount(source, minlength=len(self.sources))
        return counts


@dataclass(frozen=True)
class SourceStats:
    """One source of a mixture in :meth:`TokenMixture.stats`.

    Attributes:
        weight: its weight, normalised.
        windows_per_epoch: its windows in one epoch of the mixture.
        tokens: tokens counted (delivered so far, or in one epoch's plan).
        share: ``tokens`` over all sources' tokens.
        passes: how many times its windows were walked (``windows / its windows``): below 1, part
            of it not seen yet; above 1, up-sampled.
    """

    weight: float
    windows_per_epoch: int
    tokens: int
    share: float
    passes: float


@dataclass(frozen=True)
class MixtureStats:
    """What :meth:`TokenMixture.stats` reports: tokens per source against the weights.

    Attributes:
        epoch: the epoch of the position counted to (0 for the plan).
        tokens: tokens counted over every source.
        sources: one :class:`SourceStats` per source, in order.
    """

    epoch: int
    tokens: int
    sources: tuple[SourceStats, ...]

    @classmethod
    def of(cls, mixture: TokenMixture, epoch: int, tokens: np.ndarray, windows: np.ndarray) -> MixtureStats:
        """The stats of ``mixture``'s epoch ``epoch`` after ``windows`` windows (``tokens`` tokens) per source."""
        total = int(tokens.sum())
        rows = tuple(
            SourceStats(float(w), int(c), int(t), (t / total) if total else 0.0, float(k / n))
            for w, c, t, k, n in zip(mixture.weights.tolist(), mixture.windows_per_epoch.tolist(), tokens.tolist(),
                                     windows.tolist(), mixture.own_windows.tolist())
        )
        return cls(epoch, total, rows)

    def __str__(self) -> str:
        lines = [f"{'source':>6} {'weight':>8} {'share':>8} {'tokens':>14} {'passes':>8}"]
        for i, s in enumerate(self.sources):
            lines.append(f"{i:>6} {s.weight:>8.4f} {s.share:>8.4f} {s.tokens:>14,} {s.passes:>8.3f}")
        return "\n".join(lines)
