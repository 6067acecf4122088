"""``neighbourhood_loss`` with ``sigmas``: one key set per noise scale, the same draws at every scale
(TSAM Fig. 2's sweep), and validation of the list."""

from __future__ import annotations

import pytest

from flatlab.errors import ConfigError
from flatlab.sharpness import as_subset, compute_measures, get_measure, resolve_measures
from flatlab.sharpness.average import neighbourhood_loss
from flatlab.sharpness.measures import sigma_key

SIGMAS = [0.05, 0.1, 0.3]


def _run(model, kit, params, seed=2):
    return compute_measures(
        model,
        as_subset(kit.QUAD_DATA),
        kit.quadratic_loss,
        resolve_measures({"neighbourhood_loss": params}, "test"),
        seed,
    )


def test_every_sigma_gets_its_keys_equal_to_a_direct_estimate(quad, kit):
    model, _, _ = quad
    out = _run(model, kit, {"sigma": 0.1, "sigmas": SIGMAS, "draws": 30})
    for s in SIGMAS:
        direct = neighbourhood_loss(model, kit.QUAD_DATA, sigma=s, n_draws=30, seed=2, loss_fn=kit.quadratic_loss)
        assert out[f"flat/neighbourhood_loss/sigma_{s:g}"] == direct.mean
        assert out[f"flat/neighbourhood_loss/sigma_{s:g}_var"] == pytest.approx(direct.variance, rel=1e-12)
        assert out[f"flat/neighbourhood_loss/sigma_{s:g}_stderr"] == pytest.approx(direct.stderr, rel=1e-12)
    assert out["flat/neighbourhood_loss"] == out["flat/neighbourhood_loss/sigma_0.1"]  # sigma is one of them here
    assert (
        sigma_key(0.001) == "flat/neighbourhood_loss/sigma_0.001"
        and sigma_key(1e-5, "_var") == "flat/neighbourhood_loss/sigma_1e-05_var"
    )
    assert {k for k in out if "/sigma_" in k} == {
        sigma_key(s, stat) for s in SIGMAS for stat in ("", "_var", "_stderr")
    }
    declared = set(get_measure("neighbourhood_loss").metrics)  # with the placeholder <s> for the scale
    assert {k.replace(f"sigma_{s:g}", "sigma_<s>") for k in out for s in SIGMAS if f"sigma_{s:g}" in k} <= declared
    plain = _run(model, kit, {"sigma": 0.1, "draws": 30})
    assert not any("/sigma_" in k for k in plain)  # no sweep: the keys of before


def test_the_scales_share_their_draws(quad, kit):
    # With eps_k = s * z_k and L(w) = 1/2 w^T H w: mean_k L(w + s z_k) = L(w) + s A + s^2 B with A, B fixed by
    # the z_k. The same z_k at every s <=> (mean(s) - L(w)) / s is exactly linear in s.
    model, H, w = quad
    out = _run(model, kit, {"sigmas": SIGMAS, "draws": 5})
    clean = float(0.5 * w @ H @ w)
    y = [(out[f"flat/neighbourhood_loss/sigma_{s:g}"] - clean) / s for s in SIGMAS]
    slope = (y[1] - y[0]) / (SIGMAS[1] - SIGMAS[0])
    assert y[2] == pytest.approx(y[0] + slope * (SIGMAS[2] - SIGMAS[0]), rel=1e-9)
    assert slope > 0  # B = mean_k z_k^T H z_k / 2 > 0 for positive-definite H


def test_sigmas_must_be_a_non_empty_list_of_distinct_positive_floats():
    where = "study 's', measures"
    for bad in ([], [0.01, 0.01], "0.01", 0.01):
        with pytest.raises(
            ConfigError,
            match=r"measure 'neighbourhood_loss': sigmas=.* is not allowed; expected None or "
            r"a non-empty list of distinct floats, each in \(0, inf\)",
        ):
            resolve_measures({"neighbourhood_loss": {"sigmas": bad}}, where)
    with pytest.raises(ConfigError, match=r"sigmas\[1\]=-0.5 is not allowed; expected float in \(0, inf\)"):
        resolve_measures({"neighbourhood_loss": {"sigmas": [0.1, -0.5]}}, where)
    with pytest.raises(ConfigError, match=r"sigmas\[0\]=\[0.1\] is not allowed; expected float in \(0, inf\)"):
        resolve_measures({"neighbourhood_loss": {"sigmas": [[0.1]]}}, where)
    got = resolve_measures({"neighbourhood_loss": {"sigmas": [0.01, 1]}}, where)["neighbourhood_loss"]
    assert got["sigmas"] == (0.01, 1.0) and isinstance(got["sigmas"][1], float)
