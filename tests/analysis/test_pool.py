"""Tuning curves of a study's random-search pool, from a constructed sample: the pool is each arm's completed
search trials, the chosen trial's quantities and the win probabilities come from the exact estimators, and a
pool that is not i.i.d. (TPE, ASHA, pruned trials) is refused with the reason and what to run instead."""

import itertools
from fractions import Fraction

import pandas as pd
import pytest

from flatlab.analysis import pool
from flatlab.analysis.sample import Sample, StudyInfo
from flatlab.errors import ConfigError

VAL = {"sgd": [0.80, 0.85, 0.90, 0.70], "sam": [0.88, 0.86, 0.91, 0.60, 0.75]}
FLAT = {"sgd": [5.0, 4.0, 3.0, 6.0], "sam": [2.0, 2.5, 1.0, 7.0, 3.0]}


def pool_sample(searcher="random", scheduler="fifo", extra=()):
    rows = []
    for arm in VAL:
        for i, (v, f) in enumerate(zip(VAL[arm], FLAT[arm])):
            rows.append(
                {"arm": arm, "seed": i, "stage": "search", "outcome": "completed", "val/accuracy": v}
                | {"test/accuracy": v - 0.02, "flat/fisher_trace": f, "run_id": f"{arm}{i}"}
            )
    rows += list(extra)
    info = StudyInfo(name="pool", searcher=searcher, scheduler=scheduler)
    return Sample.of(pd.DataFrame(rows), info)


def brute_chosen(val, quantity, n):
    """Every subset of n trials, the validation-best one's quantity: value -> probability (exact)."""
    subsets = list(itertools.combinations(range(len(val)), n))
    out = {}
    for s in subsets:
        pick = max(s, key=lambda i: val[i])
        out[quantity[pick]] = out.get(quantity[pick], 0) + Fraction(1, len(subsets))
    return out


def test_curves_per_arm_match_brute_force_and_the_win_probability_pairs_the_two_pools():
    c = pool.pool_curves(pool_sample())
    assert c.reference == "sgd" and c.quantities == ("test/accuracy", "flat/fisher_trace")
    sam = c.arms["sam"]
    assert sam.trials == 5 and sam.curve.ns == (1, 2, 3, 4, 5)
    assert sam.expected[0] == pytest.approx(sum(VAL["sam"]) / 5) and sam.expected[-1] == pytest.approx(0.91)
    for n in range(1, 5):
        exact = brute_chosen(VAL["sam"], FLAT["sam"], n)
        got = sam.chosen["flat/fisher_trace"][n - 1]
        assert got.mean == pytest.approx(float(sum(v * p for v, p in exact.items())))
        ref = brute_chosen(VAL["sgd"], FLAT["sgd"], n)
        wins = sum(
            p * q * (1 if a < b else Fraction(1, 2) if a == b else 0) for a, p in exact.items() for b, q in ref.items()
        )
        assert sam.wins["flat/fisher_trace"][n - 1] == pytest.approx(float(wins))  # lower = flatter wins
    assert sam.wins["flat/fisher_trace"][4] != sam.wins["flat/fisher_trace"][4]  # n = 5 > sgd's pool of 4: NaN
    frame = pool.curves_frame(c, "flat/fisher_trace")
    assert list(frame.columns) == ["arm", "n", "mean", "median", "low", "high", "p_beats_sgd"] and len(frame) == 9
    band = pool.curves_frame(c, "val/accuracy")
    assert (band["lower"] <= band["median"]).all() and (band["median"] <= band["upper"]).all()


def test_csv_and_png_per_quantity(tmp_path):
    paths = pool.write_curves(pool.pool_curves(pool_sample()), tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"tuning_curve_{q}.{ext}"
        for q in ("val_accuracy", "test_accuracy", "flat_fisher_trace")
        for ext in ("csv", "png")
    )
    assert all(p.stat().st_size > 100 for p in paths) and paths[1].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "searcher, scheduler, extra, reason",
    [
        ("optuna", "fifo", (), "searcher='optuna'"),
        ("random", "asha (grace_period=1, reduction_factor=2)", (), "scheduler='asha'"),
        ("random", "fifo", ({"arm": "sgd", "seed": 9, "stage": "search", "outcome": "pruned"},), "1 pruned trials"),
    ],
)
def test_a_pool_that_is_not_iid_is_refused_with_what_to_run_instead(searcher, scheduler, extra, reason):
    with pytest.raises(ConfigError, match="need a pool of independent trials run to the end") as err:
        pool.pool_curves(pool_sample(searcher, scheduler, extra))
    assert reason in str(err.value) and "searcher='random', scheduler='fifo'" in str(err.value)
    assert "--tunings 3" in str(err.value)
