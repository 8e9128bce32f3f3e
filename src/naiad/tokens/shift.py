"""Moving window boundaries: where an epoch's windows start (``read_tokens(..., shift=True)``).

NOTE [ Moving window boundaries ]
Without a shift, window ``i`` of a file starts at token ``i * seq_len`` in every epoch, so a token
that begins a window in one epoch begins one in every epoch, and the first token of every window
is never a label within its window. nanoGPT's ``get_batch`` draws each window's start at random
instead (with replacement, so it covers about 63% of the tokens per epoch's worth of batches).
A shift keeps naiad's exactly-once cut and moves it: epoch ``e``'s windows of a file start at
``o_e + i * seq_len``, with one offset ``o_e`` in ``[0, seq_len)`` per epoch, the same for every
file.

``o_e`` is a pure function of ``(seed, e)`` (:func:`epoch_offset`: a SeedSequence, never the
clock, never the rank, the worker or the batch), so every process that reads a window of epoch
``e`` computes the same cut without being told it, and nothing is added to the loader's state:

* ``e`` is the epoch of the task the naiad worker runs (``current_epoch()``: process and thread
  workers, and the loop's own thread with ``num_workers=0``, since the pool carries every task's
  epoch); outside naiad's workers (torch's DataLoader, a plain loop) the dataset's own epoch,
  :meth:`TokenWindows.set_epoch`.
* ``seed`` is ``read_tokens(seed=...)`` when given; else the naiad worker's base seed, the
  loader's ``seed=`` (or the seed it drew, which its state keeps, so an exact or elastic resume
  draws the same offsets); else 0. A shifted dataset on several ranks needs the same base seed on
  every rank: the loader's ``seed=`` (which a shuffle on several ranks needs anyway) or the
  dataset's.

So that the dataset's length does not change with the offset, every file keeps the windows that
fit whatever the offset: ``n // seq_len - 1`` of a file of ``n`` tokens, one fewer than without a
shift unless ``n`` is a multiple of ``seq_len`` (the last partial window is reserved: it costs at
most one window per file). Epoch ``e`` covers tokens ``[o_e, o_e + W * seq_len + 1)`` of each
file exactly once (its ``W`` windows sharing one token each, as without a shift); the tokens
before ``o_e`` and after the last window are that epoch's dropped tokens.

A shifted batch costs what an unshifted one does: the offset is two thread-local reads and a
cached lookup per batch, and the windows are read at their unshifted starts through a reader
whose files begin ``o_e`` tokens later (``TokenWindows._reader_at``: made once per process and
epoch), so no array is added to per batch.
"""

from __future__ import annotations

import functools

import numpy as np

from naiad.parallel.context import current_epoch, get_worker_context

__all__ = ["epoch_offset", "offset_now"]

_MASK64 = (1 << 64) - 1
_TAG = 0x5348494654  # "SHIFT": keeps these draws apart from every other SeedSequence of (seed, epoch)


@functools.lru_cache(maxsize=64)
def epoch_offset(seed: int, epoch: int, seq_len: int) -> int:
    """The first token of epoch ``epoch``'s first window in every file, in ``[0, seq_len)``
    (NOTE [ Moving window boundaries ]). Cached: a batch asks for it, and a SeedSequence costs
    about 10 µs, a tenth of a batch's read."""
    word = np.random.SeedSequence([int(seed) & _MASK64, int(epoch) & _MASK64, _TAG]).generate_state(1, np.uint64)[0]
    return int(word) % seq_len  # modulo bias below seq_len / 2**64: none worth a thought


def offset_now(seed: int | None, epoch: int, seq_len: int) -> int:
    """The offset of a shifted read in the calling thread: :func:`epoch_offset` keyed by the
    dataset's ``seed`` or else the naiad worker's base seed (else 0), and by the epoch of the
    task the naiad worker runs or else ``epoch`` (the dataset's own, from ``set_epoch``).

    Called once per batch, so kept to two thread-local reads and one cache lookup."""
    task_epoch = current_epoch()
    if seed is None:
        context = get_worker_context()
        seed = 0 if context is None else context.base_seed
    return epoch_offset(seed, epoch if task_epoch is None else task_epoch, seq_len)
