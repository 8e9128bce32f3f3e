"""The coverage check's figures on orders whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from naiad.errors import ConfigError
from naiad.tools.coverage import Topology
from naiad.tools.coverage_report import job_order, shuffle_quality_of


def test_job_order_is_step_major_then_rank():
    runs = [(np.array([0, 1, 2, 3, 4]), np.array([2, 2, 1])), (np.array([5, 6, 7, 8]), np.array([2, 1, 1]))]
    assert job_order(runs).tolist() == [0, 1, 5, 6, 2, 3, 7, 4, 8]


def test_file_order_scores_one_and_a_reversal_minus_one():
    rows = np.arange(100)
    q = shuffle_quality_of([(rows, np.full(10, 10))], 100)
    assert (q.spearman, q.pearson, q.worst_rank_spearman, q.neighbour_share) == (1, 1, 1, 1)
    assert q.batch_span == 9 / 100
    r = shuffle_quality_of([(rows[::-1].copy(), np.full(10, 10))], 100)
    assert r.spearman == pytest.approx(-1) and r.worst_rank_spearman == pytest.approx(1) and r.neighbour_share == 1


def test_a_random_permutation_scores_near_zero():
    rows = np.random.default_rng(0).permutation(100_000)
    q = shuffle_quality_of([(rows[:50_000], np.full(500, 100)), (rows[50_000:], np.full(500, 100))], 100_000)
    assert abs(q.spearman) < 0.02 and abs(q.pearson) < 0.02 and q.worst_rank_spearman < 0.02
    assert q.neighbour_share < 1e-3
    assert q.batch_span == pytest.approx(99 / 101, abs=0.02)


def test_neighbours_on_different_ranks_do_not_count():
    # Ranks take alternate rows: every file neighbour pair is split between the two ranks.
    q = shuffle_quality_of([(np.arange(0, 10, 2), np.array([5])), (np.arange(1, 10, 2), np.array([5]))], 10)
    assert q.neighbour_share == 0 and q.worst_rank_spearman == 1


@pytest.mark.parametrize("kw", [{"world_size": 0}, {"batch_size": 0}, {"num_workers": -1}, {"shuffle_buffer": 0},
                                {"world_size": True}])
def test_topology_refuses_bad_settings(kw):
    with pytest.raises(ConfigError):
        Topology(**kw)
