"""Where a batch transform runs: the declared protocol and the one function that places it.

NOTE [ Transform placement ]
A loader's ``transform=`` can run in four places: the training loop's thread (after the batch
is delivered, as torch users expect), a map-style dataset's workers (right after the fetch), a
stream's reads (in the read pool's workers, before the shuffle buffer) or a stream's decode stage
(threads of the loop's process, a few batches ahead of it, after the shuffle buffer). A
transform says where it *may* run and what it needs by returning a :class:`Placement` from its
``placement()`` method (the :class:`Transform` protocol); :func:`place` turns that declaration
into where it *does* run in a given pipeline, and every part of naiad asks :func:`place`
instead of reading attributes of the transform. naiad's own ``decode_images``, ``decode_audio``,
``decode_video`` and ``tokenize`` declare themselves exactly as a user's transform would.

* ``runs="loop"`` (a plain callable, or one that declares nothing): the loop's thread, in every
  pipeline. Its ``wrap`` may still move work into a stream's reads by reading the source
  through a wrapper (``naiad.tokenize``: NOTE [ Tokenizing in the workers ] in tokens/text.py).
* ``runs="workers"``: map-style, in the workers after the fetch; stream, in the reads when every
  sample decodes to at most :data:`READ_DECODE_MAX_BYTES` (``decoded_row_bytes``: NOTE [ Small
  samples decode in the reads ] in stream/decode.py), else on the decode stage: threads of the
  loop's process, or, for a transform that declares ``holds_gil=True`` (``naiad.decode_video``),
  the loader's worker processes when it has them (NOTE [ Decode stage in the worker processes ]
  in stream/decode_workers.py), where a stream's default ``worker_mode`` is then ``"process"``.
* ``runs="reads"``: a stream's reads, whatever the size (the transform then sees a read's rows,
  before the shuffle, not the batches the loop gets); map-style, the workers, where the fetch is
  the read.
* An IterableDataset's batches have no position to key a sample by: every transform runs in the
  loop there.

A transform that runs outside the loop must be picklable (process workers get a copy) and must
not rely on state of the loop's process. Its batches carry the per-sample key column its
``key`` names (map-style: the dataset indices, added when the fetch gave none; a stream always
carries one, ``key`` or ``"__index__"``, by which it names a sample that fails) and, in a
stream, ``__epoch__``.

NOTE [ Transform lists ]
``transform=[a, b, c]`` runs the members in order on each batch. Its leading members that
declare the workers or the reads run there together, as one :class:`Compose` (so
``[naiad.decode_images(...), my_jitter]`` decodes and jitters in the workers); the rest run in
the loop, from the first member that does (a later worker-side member after it runs in the
loop too: a batch never goes back to the workers). :func:`to_tuple` ends a list with the tuple
a torchvision-style loop unpacks; it costs nothing in the loop and leaves every decode where it
was. A member that reads the source through a wrapper (``naiad.tokenize``) must come first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from naiad.errors import ConfigError

__all__ = ["READ_DECODE_MAX_BYTES", "Compose", "Placed", "Placement", "ToTuple", "Transform", "TransformLike", "place", "split",
           "to_tuple"]

Where = Literal["loop", "workers", "reads"]
"""Where a transform may run, as it declares it (NOTE [ Transform placement ])."""

Runs = Literal["loop", "workers", "stage", "reads"]
"""Where a transform does run in one pipeline: the loop's thread, a map-style dataset's
workers, a stream's decode stage or a stream's reads."""

READ_DECODE_MAX_BYTES = 4 * 1024
"""The largest decoded sample (``C * H * W`` bytes) a stream decodes in its reads (NOTE [ Small
samples decode in the reads ]): 28x28 and 32x32 RGB, 64x64 grayscale. Decoded in the reads, every
row the shuffle buffer holds is decoded before the first batch; at 64x64 RGB (12 KiB) that cost
the first batch from 1,000 fresh shards (10,000 samples in the buffer) a second more than the
stage, whose first batch decodes its own 64 images. ImageNet's 224x224 RGB (147 KiB) decodes on
the stage too, where its threads release the GIL and the buffer keeps the smaller JPEG."""

_WHERE = ("loop", "workers", "reads")


@dataclass(frozen=True)
class Placement:
    """What a transform declares: where it may run and what it needs (NOTE [ Transform placement ]).

    Attributes:
        runs: ``"loop"`` (the training loop's thread), ``"workers"`` (the workers, or a stream's
            decode stage) or ``"reads"`` (a stream's reads).
        column: the column it reads, when one (for the reader of an error; naiad needs none).
        key: the per-sample key column it reads (``"__index__"``: the sample's position, given
            by the pipeline), or None when it draws nothing per sample.
        decoded_row_bytes: bytes of one output sample when every sample has the same shape,
            else None; small ones decode in a stream's reads.
        wrap: called on a streaming :class:`~naiad.Source` to read it through a wrapper that
            does part of the work in the reads (``naiad.tokenize``); None: read as it is.
        holds_gil: whether its work is mostly Python that holds the GIL (PyAV's per-frame loop),
            so threads of one process do not run it in parallel: a stream's decode stage then
            runs it in the loader's worker processes, where it has some. False (the default):
            it releases the GIL (libjpeg-turbo, torch's kernels), and the stage's threads serve.

    Example:
        >>> Placement("workers", column="image", key="__index__")
        Placement(runs='workers', column='image', key='__index__', decoded_row_bytes=None, wrap=None, holds_gil=False)
    """

    runs: Where = "loop"
    column: str | None = None
    key: str | None = None
    decoded_row_bytes: int | None = None
    wrap: Callable[[Any], Any] | None = None
    holds_gil: bool = False

    def __post_init__(self) -> None:
        if self.runs not in _WHERE:
            raise ConfigError(f"Placement `runs` must be one of {_WHERE}, got {self.runs!r}.")
        for name in ("column", "key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"Placement `{name}` must be a column name (str) or None, got {value!r}.")
        size = self.decoded_row_bytes
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"Placement `decoded_row_bytes` must be an int >= 1 or None, got {size!r}.")
        if self.wrap is not None and not callable(self.wrap):
            raise ConfigError(f"Placement `wrap` must be callable or None, got {self.wrap!r}.")
        if not isinstance(self.holds_gil, bool):
            raise ConfigError(f"Placement `holds_gil` must be True or False, got {self.holds_gil!r}.")


@runtime_checkable
class Transform(Protocol):
    """A batch transform that declares where it runs: ``t(batch) -> batch`` and
    ``t.placement() -> Placement``. A plain callable (a function, a torchvision transform) needs
    no declaration: it runs in the training loop, as with torch.

    Example:
        >>> import os
        >>> class MarkPid:
        ...     def placement(self) -> Placement:
        ...         return Placement("workers")
        ...     def __call__(self, batch):
        ...         return {**batch, "pid": os.getpid()}
        >>> place(MarkPid(), "map").runs
        'workers'
    """

    def __call__(self, batch: Any) -> Any:
        """The batch, transformed."""
        ...

    def placement(self) -> Placement:
        """Where it may run and what it needs."""
        ...


@dataclass(frozen=True)
class Placed:
    """Where :func:`place` puts a transform in one pipeline, and what it needs there.

    Attributes:
        transform: the transform (None: none was given).
        runs: ``"loop"``, ``"workers"`` (map-style), ``"stage"`` or ``"reads"`` (stream).
        column, decoded_row_bytes, wrap, holds_gil: as declared (:class:`Placement`); ``wrap``
            only for a stream.
        key: the per-sample key column its batches carry (None: none added).
    """

    transform: Callable[[Any], Any] | None
    runs: Runs
    column: str | None = None
    key: str | None = None
    decoded_row_bytes: int | None = None
    wrap: Callable[[Any], Any] | None = None
    holds_gil: bool = False

    @property
    def stage_in_processes(self) -> bool:
        """Whether a stream's decode stage runs it in the loader's worker processes when the
        loader has some (NOTE [ Decode stage in the worker processes ]): on the stage, holding
        the GIL."""
        return self.runs == "stage" and self.holds_gil

    @property
    def by_pipeline(self) -> bool:
        """Whether the pipeline applies it (anywhere but the loop's thread)."""
        return self.runs != "loop"


def place(transform: TransformLike, pipeline: Literal["map", "stream", "iterable"]) -> Placed:
    """Where ``transform`` runs in a ``pipeline`` of this kind, and what it needs there (NOTE
    [ Transform placement ]): the one place naiad reads a transform's declaration.

    Raises:
        ConfigError: ``placement()`` returned something other than a :class:`Placement`.

    Example:
        >>> place(lambda batch: batch, "stream").runs
        'loop'
    """
    if transform is None:
        return Placed(None, "loop")
    if not callable(transform):  # a list: where its first part runs (see split)
        head, tail = split(transform)
        return place(head if head is not None else tail, pipeline)
    declared = _declared(transform)
    if declared.runs == "loop" or pipeline == "iterable":
        wrap = declared.wrap if pipeline == "stream" else None
        return Placed(transform, "loop", declared.column, declared.key, declared.decoded_row_bytes, wrap,
                      declared.holds_gil)
    runs: Runs
    key = declared.key
    if pipeline == "map":
        runs = "workers"
    else:
        small = declared.decoded_row_bytes is not None and declared.decoded_row_bytes <= READ_DECODE_MAX_BYTES
        runs = "reads" if declared.runs == "reads" or small else "stage"
        key = key or "__index__"  # a stream names a sample that fails by its key
    wrap = declared.wrap if pipeline == "stream" else None
    return Placed(transform, runs, declared.column, key, declared.decoded_row_bytes, wrap, declared.holds_gil)


TransformLike = Callable[[Any], Any] | Sequence[Callable[[Any], Any]] | None
"""A loader's ``transform=``: one transform, a list of them (:func:`split`), or None."""


class Compose:
    """Transforms run one after another as one, declared as one (NOTE [ Transform lists ]).

    Its placement is its members': the loop when the first runs there, else the reads when every
    member may run there, else the workers; the first key any member reads, the first member's column and source wrapper, and the
    last member's decoded size (the size of what it returns); it holds the GIL when any member does.
    """

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = tuple(transforms)
        for i, t in enumerate(self.transforms):
            if not callable(t):
                raise ConfigError(f"`transform[{i}]` must be callable, got {t!r:.200}.")
            if i and _declared(t).wrap is not None:
                raise ConfigError(f"`transform[{i}]` ({type(t).__name__}) reads the source through a wrapper "
                                  "(naiad.tokenize): it must come first in the list.")

    def __call__(self, batch: Any) -> Any:
        for t in self.transforms:
            batch = t(batch)
        return batch

    def placement(self) -> Placement:
        """The members' placement as one (see the class)."""
        declared = [_declared(t) for t in self.transforms]
        # A list's tail starts in the loop and stays there; its head runs in the reads only if
        # every member may (else the workers, where any member may run).
        where: Where = "workers"
        if declared[0].runs == "loop":
            where = "loop"
        elif all(d.runs == "reads" for d in declared):
            where = "reads"
        key = next((d.key for d in declared if d.key is not None), None)
        return Placement(where, column=declared[0].column, key=key,
                         decoded_row_bytes=declared[-1].decoded_row_bytes, wrap=declared[0].wrap,
                         holds_gil=any(d.holds_gil for d in declared))

    def __repr__(self) -> str:
        return f"Compose({list(self.transforms)!r})"


def split(transform: TransformLike) -> tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None]:
    """A loader's ``transform=`` as (the part the pipeline may run, the part the loop runs)
    (NOTE [ Transform lists ]): the leading members that declare the workers or the reads, run
    together, and the rest, from the first that runs in the loop on (a later worker-side one
    runs in the loop after it: a batch never goes back to the workers). One transform is its
    own part.

    Example:
        >>> head, tail = split([naiad.decode_images("jpg"), naiad.to_tuple("jpg", "cls")])  # doctest: +SKIP
    """
    if transform is None:
        return None, None
    members = list(transform) if isinstance(transform, (list, tuple)) else [transform]
    n = 0
    while n < len(members) and callable(members[n]) and _declared(members[n]).runs != "loop":
        n += 1
    return _joined(members[:n]), _joined(members[n:])


def _joined(members: list[Callable[[Any], Any]]) -> Callable[[Any], Any] | None:
    if not members:
        return None
    return members[0] if len(members) == 1 and callable(members[0]) else Compose(members)


class ToTuple:
    """The batch's columns as a tuple, in the order named: ``for image, label in loader``
    (:func:`to_tuple`). It runs in the loop: picking columns costs nothing, and the batch is a
    tuple only from here on."""

    def __init__(self, *columns: str) -> None:
        if not columns or not all(isinstance(c, str) for c in columns):
            raise ConfigError(f"naiad.to_tuple takes the column names, at least one, got {columns!r}.")
        self.columns = columns

    def placement(self) -> Placement:
        """The loop (NOTE [ Transform placement ])."""
        return Placement("loop")

    def __call__(self, batch: Any) -> tuple[Any, ...]:
        try:
            return tuple(batch[c] for c in self.columns)
        except (KeyError, TypeError):
            have = sorted(map(str, batch)) if isinstance(batch, dict) else type(batch).__name__
            raise ConfigError(f"naiad.to_tuple{self.columns!r}: the batch has no such columns "
                              f"(it has {have}).") from None

    def __repr__(self) -> str:
        return f"to_tuple{self.columns!r}"


def to_tuple(*columns: str) -> ToTuple:
    """End a list of transforms with the tuple a torchvision-style loop unpacks.

    Example:
        >>> loader = naiad.DataLoader(naiad.read_images("train"), batch_size=256, shuffle=True, seed=0,
        ...     transform=[naiad.decode_images(size=224, crop="random", flip=True),
        ...                naiad.to_tuple("image", "label")])  # doctest: +SKIP
        >>> for image, target in loader: ...  # doctest: +SKIP
    """
    return ToTuple(*columns)


def _declared(transform: Callable[[Any], Any]) -> Placement:
    """The transform's :class:`Placement`: its ``placement()``, else the attributes naiad read
    before the protocol (with a DeprecationWarning), else the loop."""
    method = getattr(transform, "placement", None)
    if callable(method):
        declared = method()
        if not isinstance(declared, Placement):
            raise ConfigError(f"`transform.placement()` must return a naiad.Placement, got {declared!r:.200} "
                              f"from {transform!r:.200}.")
        return declared
    legacy_workers = getattr(transform, "runs_in_workers", False) is True
    legacy_wrap = getattr(transform, "wrap_source", None)
    if not legacy_workers and not callable(legacy_wrap):
        return Placement()
    # The duck-typed attributes of naiad 0.x, honoured for a release: only here.
    warnings.warn(
        f"{type(transform).__name__}: `runs_in_workers`/`wrap_source`/`decoded_row_bytes` are deprecated; "
        "declare where the transform runs with a `placement()` method returning naiad.Placement.",
        DeprecationWarning, stacklevel=3,
    )
    size = getattr(transform, "decoded_row_bytes", None)
    key = getattr(transform, "key", None)
    column = getattr(transform, "column", None)
    return Placement(
        "workers" if legacy_workers else "loop",
        column=column if isinstance(column, str) else None,
        key=key if isinstance(key, str) else None,
        decoded_row_bytes=size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None,
        wrap=legacy_wrap if callable(legacy_wrap) else None,
    )
