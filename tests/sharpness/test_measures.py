"""The flatness measures registry: values against closed forms and hand computations, validation,
the fixed evaluation subset, exact restore and pairing, and `flatlab measures`."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from flatlab.batch import sample_labels
from flatlab.cli.main import app
from flatlab.errors import ConfigError, UnknownNameError
from flatlab.sharpness import (
    EvalSubset,
    as_subset,
    compute_measures,
    get_measure,
    list_measures,
    measure_subset,
    resolve_measures,
)
from flatlab.workloads.base import Split

ALL = {
    "fisher_trace": {},
    "hessian_trace": {"probes": 30},
    "neighbourhood_loss": {"sigma": 0.03, "draws": 40},
    "avg_sharpness": {"rho": 0.5, "adaptive": True},
}


def _quad_run(model, kit, spec, seed=0):
    return compute_measures(model, as_subset(kit.QUAD_DATA), kit.quadratic_loss, resolve_measures(spec, "test"), seed)


# ---- values ---------------------------------------------------------------------------------------


def test_hessian_trace_of_a_diagonal_quadratic_is_exact_for_rademacher_probes(kit):
    # v^T H v = sum_i H_ii v_i^2 = tr(H) for every +-1 probe: no Monte-Carlo error at all.
    H = torch.diag(torch.tensor([0.5, 1.0, 2.0, 3.5, 4.0, 0.25, 7.0, 1.5], dtype=torch.float64))
    model = kit.Quadratic(H, torch.linspace(-1, 1, 8, dtype=torch.float64))
    out = _quad_run(model, kit, {"hessian_trace": {"probes": 5}})
    assert out["flat/hessian_trace"] == pytest.approx(19.75, abs=1e-12)
    assert out["flat/hessian_trace_stderr"] == pytest.approx(0.0, abs=1e-12)


def test_hessian_trace_of_a_dense_quadratic_within_its_stderr_of_the_closed_form(quad, kit):
    model, H, _ = quad
    out = _quad_run(model, kit, {"hessian_trace": {"probes": 2000}})
    # Rademacher Hutchinson: Var(v^T H v) = 2 * sum_{i != j} H_ij^2
    expected_se = math.sqrt(2 * float((H**2).sum() - (torch.diag(H) ** 2).sum()) / 2000)
    assert out["flat/hessian_trace_stderr"] == pytest.approx(expected_se, rel=0.1)
    assert abs(out["flat/hessian_trace"] - float(torch.trace(H))) < 4 * expected_se


def _linear_softmax(seed=0, d=4, classes=3):
    torch.manual_seed(seed)
    return nn.Linear(d, classes).double()


def _fisher_by_hand(model: nn.Linear, x: torch.Tensor, labels: torch.Tensor) -> float:
    """mean_i |grad_{W,b} CE(Wx_i + b, y_i)|^2 = mean_i |p_i - e_{y_i}|^2 (|x_i|^2 + 1)."""
    with torch.no_grad():
        p = torch.softmax(model(x), dim=-1)
    r = p - torch.nn.functional.one_hot(labels, p.shape[1]).double()
    return float(((r**2).sum(1) * ((x**2).sum(1) + 1)).mean())


def test_fisher_trace_of_a_linear_softmax_model_equals_the_hand_computation_with_the_same_labels(kit):
    model = _linear_softmax()
    ((x, y),) = kit.classification_data(n=16, batch=16)
    subset = EvalSubset(((x, y),))
    out = compute_measures(model, subset, None, resolve_measures({"fisher_trace": {}}, "test"), seed=7)
    with torch.no_grad():
        labels = sample_labels(model(x), generator=torch.Generator().manual_seed(7))  # the registry's draw
    assert out["flat/fisher_trace"] == pytest.approx(_fisher_by_hand(model, x, labels), rel=1e-10)
    assert "flat/fisher_trace_stderr" not in out  # one label draw: no standard error


def test_fisher_trace_of_a_linear_softmax_model_converges_to_the_exact_expectation(kit):
    # E_{y~p} |p - e_y|^2 = 1 - |p|^2, so tr(F) = mean_i (1 - |p_i|^2)(|x_i|^2 + 1).
    model = _linear_softmax(seed=1)
    ((x, y),) = kit.classification_data(n=16, batch=16)
    with torch.no_grad():
        p = torch.softmax(model(x), dim=-1)
    exact = float(((1 - (p**2).sum(1)) * ((x**2).sum(1) + 1)).mean())
    out = compute_measures(
        model, EvalSubset(((x, y),)), None, resolve_measures({"fisher_trace": {"samples": 400}}, "t")
    )
    assert out["flat/fisher_trace_stderr"] > 0
    assert abs(out["flat/fisher_trace"] - exact) < 4 * out["flat/fisher_trace_stderr"]
    assert out["flat/fisher_trace"] == pytest.approx(exact, rel=0.05)


def test_neighbourhood_loss_mean_and_variance_of_a_quadratic_match_the_closed_form(quad, kit):
    model, H, w = quad
    sigma = 0.1
    out = _quad_run(model, kit, {"neighbourhood_loss": {"sigma": sigma, "draws": 4000}}, seed=3)
    clean = float(0.5 * w @ H @ w)
    mean = clean + sigma**2 / 2 * float(torch.trace(H))
    var = sigma**2 * float((H @ w).pow(2).sum()) + sigma**4 / 2 * float(torch.trace(H @ H))
    assert out["flat/neighbourhood_loss_clean"] == pytest.approx(clean, rel=1e-12)
    assert abs(out["flat/neighbourhood_loss"] - mean) < 4 * out["flat/neighbourhood_loss_stderr"]
    assert out["flat/neighbourhood_loss_stderr"] == pytest.approx(math.sqrt(var / 4000), rel=0.1)
    assert out["flat/neighbourhood_loss_var"] == pytest.approx(var, rel=0.1)


def test_avg_sharpness_of_a_quadratic_matches_the_closed_form(quad, kit):
    model, H, w = quad
    rho = 0.2
    out = _quad_run(model, kit, {"avg_sharpness": {"rho": rho, "draws": 4000}}, seed=5)
    exact = rho**2 / 2 * float((H * torch.outer(w.abs(), w.abs())).sum())  # seed paper App. A
    assert abs(out["flat/avg_sharpness"] - exact) < 4 * out["flat/avg_sharpness_stderr"]
    assert out["flat/avg_sharpness"] == pytest.approx(exact, rel=0.1)
    assert out["flat/avg_sharpness_clean"] == pytest.approx(float(0.5 * w @ H @ w), rel=1e-12)


@pytest.mark.parametrize("name", list_measures())
def test_every_measure_runs_from_its_defaults_and_returns_its_declared_metrics(kit, name):
    model = kit.make_mlp()
    out = compute_measures(model, as_subset(kit.classification_data()), None, resolve_measures({name: {}}, "t"))
    declared = set(get_measure(name).metrics)
    assert f"flat/{name}" in out and set(out) - {"time/measures_s"} <= declared
    assert all(math.isfinite(v) for v in out.values())
    assert out["time/measures_s"] > 0


# ---- restore and pairing -----------------------------------------------------------------------------


def _bn_model_and_subset(kit):
    torch.manual_seed(0)
    model = kit.TinyConvNet()
    x = torch.randn(12, 3, 6, 6)
    model.train()
    model(x)  # non-trivial BatchNorm running statistics
    y = torch.randint(0, 5, (12,))
    return model, EvalSubset(((x[:8], y[:8]), (x[8:], y[8:])))


def test_compute_measures_leaves_the_model_bitwise_unchanged_and_repeats_with_the_same_seed(kit, unchanged):
    model, subset = _bn_model_and_subset(kit)
    resolved = resolve_measures(ALL, "test")
    running_mean = model.bn.running_mean.clone()
    assert model.training
    with unchanged(model):  # parameters, BN buffers (num_batches_tracked too), .grad, training flags
        first = compute_measures(model, subset, None, resolved, seed=11)
        again = compute_measures(model, subset, None, resolved, seed=11)
    assert torch.equal(model.bn.running_mean, running_mean) and model.training
    assert {k: v for k, v in first.items() if k != "time/measures_s"} == {
        k: v for k, v in again.items() if k != "time/measures_s"
    }
    assert {
        "flat/fisher_trace",
        "flat/hessian_trace",
        "flat/hessian_trace_stderr",
        "flat/neighbourhood_loss",
        "flat/neighbourhood_loss_var",
        "flat/avg_sharpness",
        "time/measures_s",
    } <= set(first)
    other = compute_measures(model, subset, None, resolved, seed=12)
    for key in ("flat/fisher_trace", "flat/hessian_trace", "flat/neighbourhood_loss", "flat/avg_sharpness"):
        assert other[key] != first[key], key  # other noise, probes and labels


def test_a_measure_that_cannot_apply_names_itself(quad, kit, unchanged):
    model, _, _ = quad  # outputs (B,), not (B, C) logits
    with (
        unchanged(model),
        pytest.raises(ConfigError, match=r"measure 'fisher_trace' cannot run on this model: .*\(B, C\) logits"),
    ):
        _quad_run(model, kit, {"fisher_trace": {}})


# ---- validation -----------------------------------------------------------------------------------------


def test_resolve_measures_fills_the_defaults():
    assert resolve_measures(ALL, "study 's'") == {
        "fisher_trace": {"samples": 1, "estimator": "per_example"},
        "hessian_trace": {"probes": 30},
        "neighbourhood_loss": {"sigma": 0.03, "draws": 40, "sigmas": None},
        "avg_sharpness": {"rho": 0.5, "draws": 20, "adaptive": True},
    }
    assert resolve_measures({"avg_sharpness": {}}, "w") == {
        "avg_sharpness": {"rho": 1.0, "draws": 20, "adaptive": True}
    }


def test_resolve_measures_reports_every_problem_at_once():
    spec = {
        "hessian_trace": {"probes": 0, "n_probes": 3},
        "neighbourhood_loss": {"sigma": -1.0},
        "avg_sharpness": {"adaptive": "yes"},
        "fisher_trace": {"estimator": "exact"},
        "sharpness": {},
    }
    every = r"(?s)n_probes .*probes=0 .*sigma=-1.0 .*adaptive='yes' .*estimator='exact' .*unknown measure 'sharpness'"
    with pytest.raises(ConfigError, match=every) as info:
        resolve_measures(spec, "study 'd', measures")
    lines = str(info.value).splitlines()
    assert len(lines) == 6
    assert all(line.startswith("study 'd', measures") for line in lines)
    text = str(info.value)
    assert "measure 'hessian_trace': probes=0 is not allowed; expected int in [1, inf)" in text
    assert "measure 'hessian_trace': unknown parameter(s) n_probes (did you mean 'probes'?); accepted: probes" in text
    assert "measure 'neighbourhood_loss': sigma=-1.0 is not allowed; expected float in (0, inf)" in text
    assert "measure 'avg_sharpness': adaptive='yes' is not allowed; expected True or False" in text
    assert "measure 'fisher_trace': estimator='exact' is not allowed; expected one of 'per_example', 'batch'" in text
    assert "unknown measure 'sharpness'" in text


def test_unknown_measure_names_list_the_valid_ones():
    valid = (
        r"valid measures: avg_sharpness, erm_objective, fisher_trace, hessian_trace, neighbourhood_loss, "
        r"sam_objective, tilted_objective"
    )
    with pytest.raises(ConfigError, match=r"^s: unknown measure 'fisher' \(did you mean 'fisher_trace'\?\); " + valid):
        resolve_measures({"fisher": {}}, "s")
    with pytest.raises(UnknownNameError, match=r"unknown measure 'zzz'; " + valid):
        get_measure("zzz")


def test_resolve_measures_rejects_non_mappings():
    with pytest.raises(
        ConfigError, match=r"^study 's': measures must be a mapping \{measure name: \{param: value\}\}.*got list"
    ):
        resolve_measures(["fisher_trace"], "study 's'")
    with pytest.raises(ConfigError, match=r"measure 'hessian_trace': parameters must be a mapping .*got int 30"):
        resolve_measures({"hessian_trace": 30}, "study 's'")


# ---- the fixed evaluation subset --------------------------------------------------------------------------


def _split(n=50):
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 3)  # row i holds i
    return Split(inputs=x, targets=torch.arange(n) % 4)


def _rows(subset):
    return torch.cat([x[:, 0] for x, _ in subset.batches]).long().tolist()


def test_measure_subset_same_rows_for_the_same_seed_and_sorted():
    a = measure_subset(_split(), 20, seed=3, batch_size=8)
    b = measure_subset(_split(), 20, seed=3, batch_size=8)
    c = measure_subset(_split(), 20, seed=4, batch_size=8)
    rows = _rows(a)
    assert rows == _rows(b) and rows != _rows(c)
    assert a.m == 20 and len(rows) == len(set(rows)) and rows == sorted(rows)
    assert [len(y) for _, y in a.batches] == [8, 8, 4]
    assert torch.cat([y for _, y in a.batches]).tolist() == [r % 4 for r in rows]  # targets follow their rows
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(3))[:20].sort().values.tolist()
    assert rows == expected


@pytest.mark.parametrize("examples", [0, 50, 80])
def test_measure_subset_zero_or_too_many_examples_takes_every_row(examples):
    assert _rows(measure_subset(_split(), examples, seed=0, batch_size=16)) == list(range(50))


def test_measure_subset_dict_inputs_are_passed_to_the_model_as_one_argument():
    ids = torch.arange(30).reshape(10, 3)
    split = Split(inputs={"input_ids": ids, "attention_mask": torch.ones(10, 3)}, targets=torch.arange(10))
    subset = measure_subset(split, 4, seed=1, batch_size=3)
    ((first, _),) = subset.batches[:1]
    assert isinstance(first, tuple) and len(first) == 1 and set(first[0]) == {"input_ids", "attention_mask"}
    chosen = torch.cat([x[0]["input_ids"][:, 0] // 3 for x, _ in subset.batches]).tolist()
    assert chosen == torch.cat([y for _, y in subset.batches]).tolist() and len(chosen) == 4


def test_measure_subset_argument_errors():
    with pytest.raises(ConfigError, match=r"examples must be an integer >= 0; got -1"):
        measure_subset(_split(), -1, seed=0)
    with pytest.raises(ConfigError, match=r"batch_size must be an integer >= 1; got 0"):
        measure_subset(_split(), 5, seed=0, batch_size=0)


# ---- CLI ----------------------------------------------------------------------------------------------------


def test_cli_lists_every_measure_with_its_parameters():
    res = CliRunner().invoke(app, ["measures"])
    assert res.exit_code == 0, res.output
    for name in ("fisher_trace", "hessian_trace", "neighbourhood_loss", "avg_sharpness"):
        assert name in res.output
    assert "probes" in res.output and "int in [1, inf)" in res.output and "Fig. 2" in res.output
    one = CliRunner().invoke(app, ["measures", "neighbourhood_loss"])
    assert one.exit_code == 0 and "sigma" in one.output and "hessian_trace" not in one.output
    bad = CliRunner().invoke(app, ["measures", "hessian"])
    assert bad.exit_code == 2 and "did you mean 'hessian_trace'" in bad.output
