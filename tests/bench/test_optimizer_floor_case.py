"""The optimizer-overhead bench's "IRE's floor" row: SGD alone, its closure adding IRE's sampled-label
pass to every n-th step (bench/optimizer_overhead.py, SampledEvery)."""

import torch
import torch.nn.functional as F

from flatlab.train.closure import BatchClosure


def test_sampled_pass_runs_on_every_nth_step_and_leaves_the_true_gradient(optimizer_bench):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    inner = BatchClosure(model, F.cross_entropy, x, y)
    step, sampled_at = 0, []
    real = inner.with_sampled_grads

    def spy(params):
        sampled_at.append(step)
        return real(params)

    inner.with_sampled_grads = spy
    closure = optimizer_bench.SampledEvery(inner, list(model.parameters()), 3)
    for step in range(1, 8):  # noqa: B007 -- spy reads ``step`` when the closure samples
        loss = closure()
        # the step's gradient is the true-label one whichever pass ran
        want = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
        for p, g in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, g)
        torch.testing.assert_close(loss, F.cross_entropy(model(x), y))
    assert sampled_at == [3, 6]  # the 3rd and 6th of 7 steps


def test_floor_cases_are_the_ire_bases_at_k_10_timed_in_ire_blocks_without_a_target(optimizer_bench):
    floors = [c for c in optimizer_bench.CASES if c.sampled_every is not None]
    # blocks of --ire-steps (10) steps hold exactly one sampled pass, as the IRE rows hold one refresh
    assert [(c.name, c.sampled_every, c.refreshes, c.target_time, c.timing_only) for c in floors] == [
        ("sgd", 10, True, None, True),
        ("adamw", 10, True, None, True),
    ]
    assert all("ire" in c.label.lower() for c in floors)  # selected by --only IRE, next to the IRE rows
