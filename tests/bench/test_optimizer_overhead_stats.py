"""The optimizer-overhead bench's interval for its median block ratio (bench/optimizer_overhead.py)."""

import math
import random

import pytest


@pytest.fixture(scope="module")
def median_interval(optimizer_bench):
    return optimizer_bench.median_interval


def test_interval_is_the_order_statistics_with_binomial_coverage(median_interval):
    # n = 7: [x(2), x(6)] covers with 1 - 2·(1 + 7)/128 = 0.875 < 0.9, so the full range (1 - 2/128) is returned
    assert median_interval([7, 1, 6, 2, 5, 3, 4]) == (1, 7, 1 - 2 / 128)
    # n = 9: [x(2), x(8)] covers with 1 - 2·(1 + 9)/512 = 0.9609; [x(3), x(7)] with 1 - 2·(1 + 9 + 36)/512 = 0.8203
    assert median_interval(list(range(9, 0, -1))) == (2, 8, 1 - 20 / 512)
    # a lower level allows the narrower pair
    assert median_interval(list(range(1, 10)), level=0.8) == (3, 7, 1 - 92 / 512)
    assert median_interval([2.5]) == (2.5, 2.5, 0.0)


def test_interval_covers_the_true_median_as_often_as_it_says(median_interval):
    rng = random.Random(0)
    true_median = math.log(2.0)  # of the unit exponential
    trials, hits = 4000, 0
    for _ in range(trials):
        lo, hi, coverage = median_interval([rng.expovariate(1.0) for _ in range(9)])
        hits += lo <= true_median <= hi
    # binomial standard error at p = 0.961 over 4000 trials is 0.003
    assert abs(hits / trials - (1 - 20 / 512)) < 0.012
