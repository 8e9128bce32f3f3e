"""The keyed permutation the shuffle buffer draws from: a permutation of range(n) for every n,
its inverse exact, and its draws uniform where the buffer uses it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad.order.permutation import Permutation


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), key=st.integers(0, 2**64 - 1))
def test_every_range_is_permuted_and_inverted_exactly(n, key):
    p = Permutation(n, key)
    values = p(np.arange(n))
    assert np.array_equal(np.sort(values), np.arange(n))
    assert np.array_equal(p.inverse(values), np.arange(n))


def test_big_ranges_in_pieces_match_and_invert():
    n = (1 << 20) + 12_345  # not a power of two: cycle walking; more than one piece of indices
    p = Permutation(n, 99)
    values = p(np.arange(n))
    assert np.array_equal(np.sort(values), np.arange(n))
    some = np.array([0, 5, n - 1, 77_777])
    assert np.array_equal(p(some), values[some])
    assert np.array_equal(p.inverse(values[some]), some)


@pytest.mark.parametrize("n", [3000, 1 << 16, 70_000])
def test_values_and_pairs_are_uniform_over_keys(n):
    # Chi-square over 64 cells, 20,000 keys: the first two values, their pair and their gap.
    v = np.array([Permutation(n, k)(np.arange(2)) for k in range(20_000)])
    expected = len(v) / 64
    for cells in (v[:, 0] * 64 // n, (v[:, 0] * 8 // n) * 8 + v[:, 1] * 8 // n, (v[:, 1] - v[:, 0]) % n * 64 // n):
        chi2 = (((np.bincount(cells, minlength=64) - expected) ** 2) / expected).sum()
        assert chi2 < 110  # 63 degrees of freedom: p < 0.0002


def test_position_and_value_are_uncorrelated():
    n = 1 << 18
    values = Permutation(n, 5)(np.arange(n))
    assert abs(np.corrcoef(np.arange(n), values)[0, 1]) < 0.01
    assert np.mean(np.abs(np.diff(values)) == 1) < 0.001


def test_keys_give_different_permutations_and_ranges_are_checked():
    assert not np.array_equal(Permutation(1000, 1)(np.arange(1000)), Permutation(1000, 2)(np.arange(1000)))
    with pytest.raises(ValueError):
        Permutation(0, 1)
