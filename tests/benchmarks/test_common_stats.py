"""The statistics of benchmarks/_common.py that the README's figures rest on, against scipy computed
directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, t, wilcoxon

from benchmarks._common import mean_ci, paired_comparison


def test_mean_ci_is_the_student_t_interval():
    x = [0.3, 1.2, -0.4, 2.2, 0.9]
    mean, half, n = mean_ci(x)
    assert n == 5 and mean == pytest.approx(np.mean(x))
    assert half == pytest.approx(t.ppf(0.975, 4) * np.std(x, ddof=1) / math.sqrt(5))
    assert math.isnan(mean_ci([1.0])[1]) and mean_ci([float("nan"), 2.0, 4.0])[2] == 2


def test_paired_comparison_pairs_by_key_and_counts_wins_for_lower():
    a = {0: 1.0, 1: 2.0, 2: 0.5, 3: 4.0, 9: 7.0}
    b = {0: 2.0, 1: 2.5, 2: 0.5, 3: 3.0, 8: 0.0}
    r = paired_comparison(a, b)
    diff = np.array([-1.0, -0.5, 0.0, 1.0])
    assert r["n"] == 4 and r["mean_diff"] == pytest.approx(diff.mean())
    assert (r["wins"], r["ties"]) == (0.5, 0.25)
    assert r["p_sign"] == pytest.approx(binomtest(2, 3).pvalue)
    assert r["p_wilcoxon"] == pytest.approx(wilcoxon(diff).pvalue)


def test_a_nan_on_either_side_drops_the_pair_from_every_statistic():
    """`mean_ci` and Wilcoxon see the same differences, NaN included, so n and p agree."""
    with_nan = paired_comparison({0: 1.0, 1: float("nan"), 2: 3.0, 3: 0.5}, {0: 2.0, 1: 1.0, 2: 1.0, 3: 0.7})
    without = paired_comparison({0: 1.0, 2: 3.0, 3: 0.5}, {0: 2.0, 2: 1.0, 3: 0.7})
    assert with_nan["n"] == 3 and not math.isnan(with_nan["p_wilcoxon"])
    for key in without:
        assert with_nan[key] == pytest.approx(without[key], nan_ok=True), key
