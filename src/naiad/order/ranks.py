"""How an epoch's positions split across ranks and batches (NOTE [ Exactly once across ranks ]).

The order maths both pipelines share: each rank takes a contiguous range of the epoch's
positions, the ranges' sizes differ by at most one, and every rank yields the same number of
batches. ``order.elastic`` builds legs of an epoch on these; the map-style sampler and the
stream plan both ask them.
"""

from __future__ import annotations

import numpy as np

from naiad.errors import ConfigError

__all__ = ["batch_sizes", "rank_bounds"]


def rank_bounds(total_rows: int, world_size: int) -> np.ndarray:
    """Row boundaries of the ranks' contiguous ranges: sizes differ by at most one."""
    return (np.arange(world_size + 1, dtype=np.int64) * total_rows) // world_size


def batch_sizes(rows: int, num_batches: int, batch_size: int) -> np.ndarray:
    """Split ``rows`` into exactly ``num_batches`` batches of at most ``batch_size``.

    Full batches come first; the last few share what is left as evenly as possible, so no
    batch is empty unless ``rows < num_batches`` (a rank with almost no rows).

    Example:
        >>> batch_sizes(8, 3, 4).tolist()
        [4, 2, 2]
    """
    if rows > num_batches * batch_size:
        raise ConfigError(f"{rows} rows do not fit in {num_batches} batches of {batch_size}.")
    if num_batches == 0:
        return np.zeros(0, np.int64)
    if rows < num_batches:
        return (np.arange(num_batches) < rows).astype(np.int64)
    # The most full batches such that each remaining batch still gets at least one row.
    full = num_batches if batch_size == 1 else min(num_batches, (rows - num_batches) // (batch_size - 1))
    rest_batches = num_batches - full
    sizes = np.full(num_batches, batch_size, np.int64)
    if rest_batches:
        rest = rows - full * batch_size
        base, extra = divmod(rest, rest_batches)
        sizes[full:] = base
        sizes[full : full + extra] += 1
    return sizes
