"""What every reader takes besides its paths, spelled once: the bad rows policy, the storage, and
the keywords of the release before, which still work and warn.

NOTE [ Reader options ]
Each reader (``naiad.read_csv`` and the others) is its source class, and takes at most eight
keywords. Options that travel together are one value, the same for every reader that has them:

- ``on_bad_rows=``: ``"raise"`` (the default), ``"skip"``, or :class:`SkipBadRows` with the
  most rows an epoch may skip (``SkipBadRows(max_rows=100)``, or a fraction: ``0.01``);
- ``storage=``: a :class:`~naiad.sources.storage.Storage` (the filesystem's options, the retry
  policy, the local cache of remote byte ranges); a plain dict is its filesystem options;
- ``media=``: a :class:`~naiad.trust.paths.MediaAccess` (where the paths inside a table may
  reach, how large a file they may name: NOTE [ Paths inside tables ]);
- CSV's parse options: a :class:`~naiad.sources.csv.CsvFormat`.

The rest are plain keywords of the reader that has them (``columns``, ``dtypes``,
``block_bytes``, ``index_dir``, ``keep_parsed_bytes``...), documented once on
:class:`~naiad.sources.base.Source`. The keywords these values replaced (``storage_options``,
``retry``, ``cache_dir``, ``cache_bytes``, ``max_bad_rows``; CSV's ``delimiter``, ``header``,
``column_names``, ``quote_char``, ``newlines_in_values``, ``compression``) still work for a
release: a call that uses them gets what they said, with a ``DeprecationWarning`` that names
each one's new spelling (an old storage or ``max_bad_rows`` keyword given None says what leaving
it out says, and is dropped without one).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from naiad.errors import ConfigError
from naiad.sources.contract import OnBadRows
from naiad.sources.storage import Storage

__all__ = [
    "BadRows",
    "MaxBadRows",
    "SkipBadRows",
    "StorageLike",
    "bad_rows_policy",
    "check_max_bad_rows",
    "old_bad_rows",
    "old_storage",
    "refuse_unknown",
    "warn_renamed",
]

MaxBadRows = int | float | None
"""The most bad rows an epoch may skip on a rank: a count (int), a fraction (float) of the rows
the rank reads, or None (no limit)."""


def check_max_bad_rows(value: Any, name: str = "max_bad_rows") -> MaxBadRows:
    """``value`` checked as a :data:`MaxBadRows`: None, a count (int >= 0), or a fraction (0 < float < 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`{name}` must be an int count or a float fraction, got {value!r}.")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"`{name}` must be >= 0, got {value}.")
        return value
    if not 0.0 < value < 1.0:
        raise ConfigError(f"`{name}` as a fraction must be between 0 and 1, got {value}; a count is an int.")
    return float(value)


@dataclass(frozen=True)
class SkipBadRows:
    """Skip bad rows, at most so many an epoch: ``on_bad_rows=SkipBadRows(max_rows=100)``.

    A skipped row is counted and kept in the loader's ledger with its file, line or row and
    reason (docs/STREAMING.md, "Bad input"); ``on_bad_rows="skip"`` is ``SkipBadRows()``.

    Attributes:
        max_rows: the most rows an epoch may skip on a rank: a count (int), or a fraction
            (float, between 0 and 1) of the rows the rank reads in the epoch; past it, a
            :class:`~naiad.SourceError` summarises them. None: no limit.

    Example:
        >>> SkipBadRows(max_rows=0.01)
        SkipBadRows(max_rows=0.01)
    """

    max_rows: int | float | None = None

    def __post_init__(self) -> None:
        check_max_bad_rows(self.max_rows, "max_rows")


BadRows = Literal["raise", "skip"] | SkipBadRows
"""What a reader does with a bad row: ``"raise"``, ``"skip"``, or :class:`SkipBadRows`."""

StorageLike = Storage | Mapping[str, Any] | None
"""A reader's ``storage=``: a :class:`Storage`, a dict of its filesystem options, or None."""


def bad_rows_policy(value: Any) -> tuple[OnBadRows, MaxBadRows]:
    """A reader's ``on_bad_rows`` as ``("raise" | "skip", the most rows an epoch may skip)``.

    Raises:
        ConfigError: anything but "raise", "skip" or a :class:`SkipBadRows`.
    """
    if isinstance(value, SkipBadRows):
        return "skip", check_max_bad_rows(value.max_rows, "max_rows")
    if value in ("raise", "skip"):
        return value, None
    raise ConfigError(f"`on_bad_rows` must be 'raise', 'skip' or naiad.SkipBadRows(max_rows=...), got {value!r}.")


# -- the keywords of the release before ------------------------------------------------------

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_renamed(reader: str, renamed: Mapping[str, str]) -> None:
    """One ``DeprecationWarning`` for a call of ``reader`` with old keywords, each named with its
    new spelling (``{"delimiter": "csv=naiad.CsvFormat(delimiter=...)"}``), pointing at the
    caller's line outside naiad (the default filters show it there)."""
    level, frame = 1, inspect.currentframe()
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    del frame  # a frame holds its locals: let them go now
    spelled = "; ".join(f"`{old}=` is now {new}" for old, new in renamed.items())
    warnings.warn(f"naiad.{reader}: {spelled}. The old keywords work until the next release (NOTE [ Reader options ]).",
                  DeprecationWarning, stacklevel=level)


_STORAGE_KEYWORDS = ("storage_options", "retry", "cache_dir", "cache_bytes")


def old_storage(reader: str, storage: StorageLike, old: dict[str, Any]) -> StorageLike:
    """``storage`` with the old storage keywords of ``old`` (popped from it) folded in.

    Raises:
        ConfigError: both ``storage=`` and an old storage keyword.
    """
    # An old keyword given None says what leaving it out says: nothing to fold, nothing to warn.
    given = {k: v for k, v in ((k, old.pop(k)) for k in _STORAGE_KEYWORDS if k in old) if v is not None}
    if not given:
        return storage
    warn_renamed(reader, {k: f"storage=naiad.Storage({'options' if k == 'storage_options' else k}=...)" for k in given})
    options = given.get("storage_options")
    if storage is not None:
        raise ConfigError(f"naiad.{reader}: pass `storage=` alone; {sorted(given)} are its old spelling.")
    if isinstance(options, Storage):  # what naiad.read handed over before
        return options
    return Storage(options, given.get("retry"), cache_dir=given.get("cache_dir"), cache_bytes=given.get("cache_bytes"))


def old_bad_rows(reader: str, on_bad_rows: BadRows, old: dict[str, Any]) -> BadRows:
    """``on_bad_rows`` with the old ``max_bad_rows`` of ``old`` (popped from it) folded in.

    Raises:
        ConfigError: ``max_bad_rows`` with an ``on_bad_rows`` other than "skip".
    """
    limit = check_max_bad_rows(old.pop("max_bad_rows", None))
    if limit is None:  # given None, or not given: nothing to fold, nothing to warn
        return on_bad_rows
    warn_renamed(reader, {"max_bad_rows": "on_bad_rows=naiad.SkipBadRows(max_rows=...)"})
    if isinstance(on_bad_rows, SkipBadRows):
        raise ConfigError(f"naiad.{reader}: pass `on_bad_rows=SkipBadRows(max_rows=...)` alone; `max_bad_rows` is its "
                          "old spelling.")
    if on_bad_rows != "skip":
        raise ConfigError(f"`max_bad_rows` limits the rows on_bad_rows='skip' skips; got it with on_bad_rows={on_bad_rows!r}.")
    return SkipBadRows(limit)


def refuse_unknown(who: str, old: Mapping[str, Any]) -> None:
    """A TypeError, as Python raises it, for keywords that are neither new nor old spellings."""
    if old:
        raise TypeError(f"{who}() got an unexpected keyword argument {next(iter(old))!r}")
