"""The long-run step-time bench (bench/optimizer_longrun.py): its block arithmetic, flag, AdmIRE/AdamW
pairing, subnormal count and set-up; no timing is asserted."""

import sys
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(scope="module")
def longrun(longrun_bench):
    return longrun_bench


def test_blocks_drop_the_incomplete_tail_and_give_means_medians_and_drift(longrun):
    per_step = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 8.0, 3.0]  # the 3.0 does not fill a block of 4
    assert longrun.blocks(per_step, 4) == [[1.0] * 4, [2.0, 2.0, 2.0, 8.0]]
    assert longrun.block_means(per_step, 4) == [1.0, 3.5]
    assert longrun.block_medians(per_step, 4) == [1.0, 2.0]  # one slow step (a refresh) does not move the median
    assert longrun.drift(longrun.block_means(per_step, 4)) == 3.5


def test_summary_flags_a_last_to_first_ratio_above_the_limit(longrun):
    times = {
        "steady": [0.004] * 4 + [0.0045] * 4 + [0.005] * 4,  # 1.25: not flagged
        "slowing": [0.004] * 4 + [0.008] * 4 + [0.008, 0.008, 0.008, 0.016],  # means 4, 8, 10 ms: 2.5
    }
    rows = {r["optimizer"]: r for r in longrun.summarize(times, block=4, limit=1.3)}
    assert rows["steady"]["blocks"] == 3
    assert rows["steady"]["first block ms"] == pytest.approx(4.0) and rows["steady"]["last block ms"] == pytest.approx(
        5.0
    )
    assert rows["steady"]["last / first"] == pytest.approx(1.25) and not rows["steady"]["slows down"]
    assert rows["slowing"]["last / first"] == pytest.approx(2.5) and rows["slowing"]["slows down"]
    assert rows["slowing"]["last / first (medians)"] == pytest.approx(2.0)
    assert longrun.SLOWDOWN_LIMIT == 1.3


def test_admire_over_adamw_is_the_median_of_block_ratios_against_its_base(longrun):
    label, name, base = longrun.PAIRS[0]
    assert (label, name) == ("AdmIRE / AdamW", "adamw_ire")
    times = {
        name: [0.011, 0.011, 0.024, 0.024, 0.010, 0.010],
        base: [0.010, 0.010, 0.020, 0.020, 0.010, 0.010],
        "sgd": [0.001] * 6,
    }
    median, first, last = longrun.pair_ratios(times, block=2)[label]
    assert (median, first, last) == pytest.approx((1.1, 1.1, 1.0))  # block ratios 1.1, 1.2, 1.0
    assert longrun.pair_ratios({"sgd": [0.001] * 4}, block=2) == {}


def test_mlp_over_cnn_compares_admire_s_two_ratios_against_the_limit(longrun):
    label = longrun.PAIRS[0][0]
    pairs = {"mlp": {label: (1.155, 1.2, 1.1)}, "cnn": {label: (1.05, 1.0, 1.0)}}
    line = longrun.mlp_over_cnn(pairs)  # 1.155 / 1.05 = 1.1; the bound 1.1 · 1.05 = 1.155
    assert "= 1.100" in line and "mlp <= 1.155" in line and line.endswith(": met")
    pairs["mlp"][label] = (1.16, 1.2, 1.1)
    assert longrun.mlp_over_cnn(pairs).endswith("NOT met")
    assert longrun.mlp_over_cnn({"mlp": pairs["mlp"]}) == ""  # the CNN did not run
    assert longrun.MLP_OVER_CNN_LIMIT == 1.10


class _Closure:
    """Sets the true-label gradient and returns a given sampled-label gradient (the trainer closure's API)."""

    def __init__(self, param, grad, sampled):
        self.param, self.grad, self.sampled, self.sampled_calls, self.calls = param, grad, sampled, 0, 0

    def _grads(self):
        self.param.grad = self.grad.clone()
        return torch.tensor(0.5)

    def __call__(self):
        self.calls += 1
        return self._grads()

    def with_sampled_grads(self, params):
        self.sampled_calls += 1
        return self._grads(), [self.sampled.clone()]


def test_authors_anchor_marks_their_top_k_count_and_amplifies_the_masked_step(longrun):
    # h = g²; γ = 0.8 of 10 coordinates: their top-k takes the int(10·0.2) = 2 largest h and marks h ≤ the
    # 2nd largest as flat, so n − keep + 1 = 9 coordinates are flat (flatlab's ⌊γ·p⌋ would be 8)
    theta0 = torch.arange(10.0)
    p = torch.nn.Parameter(theta0.clone())
    grad = torch.linspace(-1.0, 1.0, 10)
    sampled = torch.tensor([0.3, -0.1, 0.9, 0.2, -0.8, 0.4, 0.05, -0.6, 0.7, 0.5])  # only |g| = 0.9 is sharp
    anchor = longrun.AuthorsAdmIRE(torch.optim.SGD([p], lr=0.1), kappa=2.0, gamma=0.8, mask_interval=2, beta=0.0)
    closure = _Closure(p, grad, sampled)
    anchor.step(closure)
    mask = torch.ones(10)
    mask[2] = 0.0
    step = -0.1 * grad
    assert torch.allclose(p.detach(), theta0 + step + 2.0 * mask * step, atol=1e-6)
    assert torch.equal(anchor.state[p]["mask"], mask)
    anchor.step(closure)  # within K = 2: no refresh, the same mask amplifies the second step
    assert (closure.sampled_calls, closure.calls) == (1, 1)
    assert torch.allclose(p.detach(), theta0 + 2 * (step + 2.0 * mask * step), atol=1e-6)
    anchor.step(closure)
    assert closure.sampled_calls == 2


def test_subnormals_kept_counts_state_of_every_level_and_the_parameters(longrun):
    f32 = torch.tensor([1e-40, 0.0, 1.0, float("inf"), -1e-39, float("nan")])  # two subnormals
    base = SimpleNamespace(state={0: {"exp_avg_sq": torch.tensor([1e-310, 1e-40], dtype=torch.float64)}}, base=None)
    wrapper = SimpleNamespace(state={0: {"theta": f32, "step": torch.tensor(3)}}, base=base)  # float64 1e-40 is normal
    assert longrun.subnormal_count(f32) == 2
    assert longrun.subnormals_kept(wrapper, [torch.tensor([5e-45, 2.0])]) == 2 + 1 + 1


def test_runners_cover_the_registry_and_admire_s_base_with_its_settings(longrun):
    from flatlab.optim import OPTIMIZERS

    names = ["sgd", "adamw", "adamw_ire"]
    rs = longrun.runners("cnn", names, torch.device("cpu"), batch=4)
    assert list(rs) == ["sgd", "adamw", "adamw_ire", "adamw (AdmIRE's base)", longrun.AUTHORS]
    anchor = rs[longrun.AUTHORS].opt
    assert type(anchor.base) is torch.optim.AdamW and anchor.base.param_groups[0]["betas"] == (0.9, 0.95)
    assert (anchor.kappa, anchor.gamma, anchor.mask_interval, anchor.beta) == (2.0, 0.8, 10, 0.0)
    base = rs["adamw (AdmIRE's base)"].opt
    assert type(base) is torch.optim.AdamW and base.param_groups[0]["betas"] == (0.9, 0.95)
    assert base.param_groups[0]["weight_decay"] == 0.1
    assert rs["adamw"].opt.param_groups[0]["weight_decay"] == 0.0  # the registered default
    models = [r.model for r in rs.values()]
    assert len({id(m) for m in models}) == 5  # each on its own copy of the same initial weights
    assert all(torch.equal(p, q) for m in models[1:] for p, q in zip(models[0].parameters(), m.parameters()))
    assert set(names) <= set(OPTIMIZERS.names())


def test_the_saturating_mlp_and_unknown_models(longrun):
    model, _, x, y = longrun.ob.workload("mlp", torch.device("cpu"), batch=8)
    assert sum(p.numel() for p in model.parameters()) == 3072 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert x.shape == (8, 3072) and y.shape == (8,)
    with pytest.raises(ValueError, match="unknown model 'resnet'; expected one of cnn, transformer, mlp"):
        longrun.ob.workload("resnet", torch.device("cpu"), batch=8)


def test_steps_must_fill_at_least_two_blocks(longrun, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["optimizer_longrun.py", "--steps", "30", "--block", "20"])
    with pytest.raises(SystemExit):
        longrun.main()
    assert "--steps must be a multiple of --block (20) holding at least two blocks, got 30" in capsys.readouterr().err
