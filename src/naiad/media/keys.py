"""Randomness keyed per sample: the same sample in the same epoch draws the same numbers, whatever
batch it travels in and whichever worker or thread decodes it.

NOTE [ Keyed sample randomness ]
A sample's random numbers (its crop, its flip, its audio offset) are the raw output of
``numpy.random.Philox(key=[seed, epoch], counter=[0, 0, 0, sample_key])``: a counter-based
generator, so constructing one per sample costs about 16 µs and no state is carried from one
sample to the next. The sample key sits in the counter's top word, so the streams of different
samples never overlap (each draws fewer than 2**64 blocks). The raw 64-bit words are turned
into uniforms here (``(word >> 11) * 2**-53``) rather than through ``Generator`` methods, whose
streams NumPy does not promise to keep across versions; Philox's raw output is fixed by the
algorithm, so a checkpoint resumed under another NumPy draws the same crops.

Where the three numbers come from, for a batch:

* ``sample_key``: the batch's int64 key column (``key=``, by default ``"__index__"``): the
  sample's position in the epoch (or any stable per-sample id). A pipeline adds it per batch,
  as one array; the transform never counts samples itself, so batch composition and worker
  assignment cannot change a sample's draws.
* ``epoch``: the batch's ``epoch_key`` field (by default ``"__epoch__"``: an int, or an array
  whose values are all equal) when present; else the epoch of the task that naiad's worker is
  running (``naiad.parallel.context.current_epoch``); else the transform's ``epoch`` attribute
  (``set_epoch``), 0 unless set. Keys that already differ per epoch need none of them.
* ``seed``: the transform's ``seed`` when given; else the base seed of the naiad worker running
  it (the loader's ``seed``, kept in its state dict, so a resumed run draws the same crops); else
  0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from naiad.errors import ConfigError
from naiad.parallel.context import current_epoch, get_worker_context
from naiad.transforms import Placement

__all__ = ["KeyedBatchTransform", "batch_epoch", "batch_keys", "batch_uniforms", "effective_seed", "sample_uniforms"]

_MASK64 = (1 << 64) - 1


def sample_uniforms(seed: int, epoch: int, sample_key: int, count: int) -> np.ndarray:
    """``count`` float64 uniforms in [0, 1) for one sample (NOTE [ Keyed sample randomness ])."""
    bits = np.random.Philox(key=[seed & _MASK64, epoch & _MASK64], counter=[0, 0, 0, sample_key & _MASK64])
    raw = bits.random_raw(count)
    return (raw >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def batch_uniforms(batch: Mapping[str, Any], count: int, *, key: str = "__index__", seed: int | None = None,
                   epoch_key: str = "__epoch__") -> np.ndarray:
    """``count`` uniforms in [0, 1) for each sample of ``batch``, a ``(rows, count)`` float64
    array: the sample's own, keyed by (seed, epoch, the sample's key) (NOTE [ Keyed sample
    randomness ]), so a transform's random augmentation is the same whatever batch, worker or
    worker count the sample meets, and after a resume or an elastic resume.

    Call it in a transform that runs in the workers (``Placement("workers")``): its batches carry
    the sample keys (``key``, ``"__index__"`` by default, a pipeline adds it) and the epoch
    (``"__epoch__"`` in a stream; else the epoch of the naiad worker's task); ``seed`` is the
    loader's base seed unless given.

    Raises:
        ConfigError: the batch has no ``key`` column of one integer per sample.

    Example:
        >>> class Erase:  # a user's random erasing, in the workers
        ...     def placement(self):
        ...         return naiad.Placement("workers", column="image", key="__index__")
        ...     def __call__(self, batch):
        ...         u = naiad.batch_uniforms(batch, 3)  # erase?, where across, where down
        ...         ...  # doctest: +SKIP
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"`count` must be an int >= 1, got {count!r}.")
    column = batch.get(key) if isinstance(batch, Mapping) else None
    rows = len(column) if column is not None and hasattr(column, "__len__") else 0
    keys = batch_keys(batch, key, rows, why="naiad.batch_uniforms")
    base, epoch = effective_seed(seed), batch_epoch(batch, epoch_key, 0)
    out = np.empty((len(keys), count), np.float64)
    for i, k in enumerate(keys.tolist()):  # one counter-based generator a sample: about 16 µs
        out[i] = sample_uniforms(base, epoch, k, count)
    return out


def batch_keys(batch: Mapping[str, Any], key: str, rows: int, *, why: str) -> np.ndarray:
    """The batch's per-sample keys as int64, checked: one per row."""
    if key not in batch:
        raise ConfigError(
            f"{why} draws each sample's randomness from its key, but the batch has no column "
            f"{key!r} (columns: {sorted(map(str, batch))}). Give `key=` the name of an integer "
            "column holding each sample's position in the epoch (or another stable per-sample id)."
        )
    values = batch[key]
    if hasattr(values, "numpy"):  # a torch tensor
        values = values.detach().cpu().numpy()
    keys = np.asarray(values)
    if keys.ndim != 1 or len(keys) != rows or not np.issubdtype(keys.dtype, np.integer):
        raise ConfigError(
            f"`key` column {key!r} must hold one integer per sample ({rows} rows); "
            f"got dtype {keys.dtype} with shape {keys.shape}."
        )
    return keys.astype(np.int64, copy=False)


def batch_epoch(batch: Mapping[str, Any], epoch_key: str | None, fallback: int) -> int:
    """The epoch the batch belongs to (NOTE [ Keyed sample randomness ])."""
    if epoch_key is not None and epoch_key in batch:
        value = batch[epoch_key]
        if hasattr(value, "numpy"):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if arr.size == 0 or not np.issubdtype(arr.dtype, np.integer) or (arr != arr.flat[0]).any():
            raise ConfigError(
                f"`epoch_key` field {epoch_key!r} must be one integer (or an array of one repeated "
                f"integer); got {value!r}."
            )
        return int(arr.flat[0])
    epoch = current_epoch()
    return fallback if epoch is None else int(epoch)


def effective_seed(seed: int | None) -> int:
    """The seed a transform draws with (NOTE [ Keyed sample randomness ])."""
    if seed is not None:
        return int(seed)
    context = get_worker_context()
    return 0 if context is None else int(context.base_seed)


class KeyedBatchTransform:
    """What the decode transforms share: the column they decode, their options, where their
    random draws come from (``seed``, the ``key`` column, the ``epoch_key`` field, else
    :meth:`set_epoch`), their threads, and that they run in the workers (:meth:`placement`).
    Picklable."""

    def __init__(
        self,
        column: str,
        options: Any,
        *,
        seed: int | None = None,
        key: str = "__index__",
        epoch_key: str | None = "__epoch__",
        threads: int | None = None,
    ) -> None:
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"`threads` must be None or an int >= 1, got {threads!r}.")
        if seed is not None and not isinstance(seed, int):
            raise ConfigError(f"`seed` must be None or an int, got {seed!r}.")
        self.column = column
        self.options = options
        self.seed = seed
        self.key = key
        self.epoch_key = epoch_key
        self.threads = threads
        self.epoch = 0

    @property
    def keyed(self) -> bool:
        """Whether it draws per-sample randomness from the key column: its options' ``random``
        (a random crop, flip or clip), unless the transform says otherwise."""
        return bool(self.options.random)

    def placement(self) -> Placement:
        """A worker-side transform (NOTE [ Transform placement ] in transforms.py): given as the
        loader's ``transform=``, it runs in the workers (map-style) or in a stream's reads or
        decode stage, never on the training loop's thread; it reads :attr:`column` and the
        samples' keys (:attr:`key`)."""
        return Placement("workers", column=self.column, key=self.key)

    def set_epoch(self, epoch: int) -> None:
        """The epoch random draws use when the batch carries none and no naiad worker runs this."""
        self.epoch = int(epoch)

    def draw_keys(self, batch: Mapping[str, Any], rows: int, why: str) -> tuple[np.ndarray, int, int] | None:
        """The batch's sample keys, the seed and the epoch its draws are keyed by (None when it
        draws nothing); ``why`` names the setting that needs the key column, for the error."""
        if not self.keyed:
            return None
        keys = batch_keys(batch, self.key, rows, why=why)
        return keys, effective_seed(self.seed), batch_epoch(batch, self.epoch_key, self.epoch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.column!r}, {self.options}, seed={self.seed}, key={self.key!r})"

