"""naiad's exception hierarchy.

Every error naiad raises on purpose is a :class:`NaiadError`. Messages name the parameter or the
place (file, line, worker), the rule, the value found, and the fix when there is one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NaiadError", "ConfigError", "SourceError", "DecodeError", "WorkerError", "StateError", "add_note"]


def _rebuild(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    # Without calling __init__: its keyword-only arguments are not in `args`; pickle then
    # restores them (and the notes) from the instance's __dict__.
    return cls.__new__(cls, *args)


class NaiadError(Exception):
    """Base class of every error naiad raises on purpose.

    Every naiad error pickles (``pickle.loads(pickle.dumps(e))`` has the same type, message,
    attributes and notes), so it can cross a process boundary, as torch's exceptions do.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args), self.__dict__)


class ConfigError(NaiadError, ValueError):
    """A bad argument, found at construction (a ``ValueError`` too, as torch raises)."""


class SourceError(NaiadError):
    """A file could not be read or parsed.

    Attributes:
        path: the file, when known.
        line: 1-based line (text formats) or row (columnar formats), when known.
        column: the column involved, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.path = path
        self.line = line
        self.column = column


class DecodeError(SourceError):
    """Some samples of a batch did not decode (``naiad.decode_images``, ``naiad.decode_audio``).

    The message names each failed sample (its ``__key__`` or ``path``, else its key, else its row)
    and the decoder's complaint. A pipeline that skips bad samples reads the attributes instead of
    decoding the batch again.

    Attributes:
        rows: the failed rows' indices in the batch, ascending.
        keys: how each failed row was named in the message, in the same order.
        reasons: each failed row's problem, in the same order.
        kept: the transform's output without the failed rows (every per-row column filtered).
    """

    def __init__(
        self,
        message: str,
        *,
        column: str | None = None,
        rows: list[int] | None = None,
        keys: list[str] | None = None,
        reasons: list[str] | None = None,
        kept: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, column=column)
        self.rows = list(rows or [])
        self.keys = list(keys or [])
        self.reasons = list(reasons or [])
        self.kept = kept


class WorkerError(NaiadError, RuntimeError):
    """A worker died or stopped answering (a ``RuntimeError``, as torch raises).

    Attributes:
        worker_id: which worker (None when not known: rebuilt from its message alone, as
            torch's ``ExceptionWrapper`` rebuilds exceptions by type and message).
        exitcode: its exit code (negative: killed by that signal), or None if it is still alive.
        task: what it was doing, in words.
    """

    def __init__(
        self, message: str, *, worker_id: int | None = None, exitcode: int | None = None, task: str = ""
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.exitcode = exitcode
        self.task = task


class StateError(NaiadError, ValueError):
    """A state dict that does not fit this loader: shows the stored and the current value."""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where the note is stored but not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(exc, "__notes__", None) or []
        notes.append(note)
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except Exception:
            pass
