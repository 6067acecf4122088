"""IRE's threshold select on the CPU (flatlab.optim._select._bracketed_select): a sampled bracket, one
counting pass and an introselect over the few entries inside it. Its answer must be torch.kthvalue's
(value and count) in every case; the sample only decides whether it answers or hands over to the radix
select. The cases below make it answer, miss on either side, overflow its bracket, and answer a tie
without gathering."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _optim_testlib import closure_for, mlp, vector_batch

import flatlab.optim._select as flat_mod
from flatlab.optim.ire import IRE, flat_count


@pytest.fixture
def radix_calls(monkeypatch):
    """How many times the radix select answered (the bracket gave up), per call of the public select."""
    calls = []
    radix = flat_mod._radix_select
    monkeypatch.setattr(flat_mod, "_radix_select", lambda *a: calls.append(1) or radix(*a))
    return calls


def _expected(parts, k):
    every = torch.cat([(p.view(torch.float32) if p.dtype == torch.int32 else p).reshape(-1).abs() for p in parts])
    value = torch.kthvalue(every, k).values
    return value, int((every <= value).sum())


def _check(parts, k):
    value, count = flat_mod.kth_smallest_with_count(parts, k)
    expected, expected_count = _expected(parts, k)
    assert int(value.view(torch.int32)) == int(expected.view(torch.int32)), k
    assert count == expected_count >= k


def test_bracket_answers_over_several_tensors_without_the_radix_select(monkeypatch, radix_calls):
    # 3 tensors of 8,000 entries, ranked together through a sample of 1,024: squares with exact zeros, a
    # block of ties, subnormals, -0.0 and +inf, one tensor given as int32 bit patterns (IRE's |g| keys)
    monkeypatch.setattr(flat_mod, "_WHOLE", 1000)
    monkeypatch.setattr(flat_mod, "_SAMPLE", 1024)
    g = torch.Generator().manual_seed(0)
    parts = [
        torch.randn(80, 50, generator=g).square(),
        torch.randn(4000, generator=g).square(),
        torch.randn(4000, generator=g),
    ]
    parts[0][:10, :] = 0.0
    parts[0][10:20, :] = -0.0
    parts[1][::5] = 0.75
    parts[1][:7] = 3e-40
    parts[1][-1] = float("inf")
    parts[2] = parts[2].abs().view(torch.int32)
    n = 12_000
    ks = [1, 2, 999, 1000, 1001, 3000, 6000, 9000, flat_count(0.8, n), 11_999, n]
    for k in ks:
        _check(parts, k)
    assert radix_calls == []  # every one answered by the bracket


def test_bracket_gives_up_when_the_sample_misses_and_the_radix_select_answers(monkeypatch, radix_calls):
    # the sampled positions hold the largest values, every other entry is smaller: the sample's bracket lies
    # above the true k-th (and, for k near n, the true k-th above the bracket's low end only)
    monkeypatch.setattr(flat_mod, "_WHOLE", 100)
    monkeypatch.setattr(flat_mod, "_SAMPLE", 256)
    n = 20_000
    values = torch.rand(n, generator=torch.Generator().manual_seed(1))
    picked = torch.from_numpy(flat_mod._spread_positions(n, 256))
    values[picked] = 10.0 + torch.arange(256, dtype=torch.float32)
    k = n // 2
    assert flat_mod._bracketed_select([values], k, n) is None
    _check([values], k)
    assert radix_calls == [1]
    # and missing upwards: the sampled entries the smallest ones
    values[picked] = 1e-6 * torch.arange(1, 257, dtype=torch.float32)
    assert flat_mod._bracketed_select([values], n - 10, n) is None
    _check([values], n - 10)
    assert radix_calls == [1, 1]


def test_bracket_gives_up_when_a_tie_overfills_it(monkeypatch, radix_calls):
    # 70 % of the entries tie at 1.0 and the k-th lies just above them: the bracket runs from 1.0 into the
    # spread values, holds every tied entry (more than 4x what the sample predicts) and is not gathered
    monkeypatch.setattr(flat_mod, "_WHOLE", 100)
    monkeypatch.setattr(flat_mod, "_SAMPLE", 1024)
    n, tied = 20_000, 14_000
    values = torch.cat([torch.ones(tied), 1.0 + torch.rand(n - tied, generator=torch.Generator().manual_seed(2))])
    values = values[torch.randperm(n, generator=torch.Generator().manual_seed(3))]
    k = tied + 100
    assert flat_mod._bracketed_select([values], k, n) is None
    _check([values], k)
    assert radix_calls == [1]


def test_bracket_answers_a_tie_over_most_entries_without_gathering(monkeypatch, radix_calls):
    # 90 % exact zeros (dead units, unused rows) and k = 80 %: the bracket is [0, 0], the answer 0 with
    # every zero counted; numpy's introselect over such ties is 30-50x slower, so none is run
    monkeypatch.setattr(flat_mod, "_WHOLE", 100)
    n = 200_000
    values = torch.rand(n, generator=torch.Generator().manual_seed(4))
    values[torch.rand(n, generator=torch.Generator().manual_seed(5)) < 0.9] = 0.0
    joined = []  # np.concatenate: the sample's pieces, and the gathered candidates were there any
    concatenate = np.concatenate
    monkeypatch.setattr(
        flat_mod.np, "concatenate", lambda arrays, **kw: joined.append(len(arrays)) or concatenate(arrays, **kw)
    )
    found = flat_mod._bracketed_select([values], flat_count(0.8, n), n)
    assert joined == [1]  # the sample of the one tensor only
    assert found is not None
    assert float(found[0]) == 0.0 and found[1] == int((values == 0).sum())
    _check([values], flat_count(0.8, n))
    assert radix_calls == []


def test_int32_keys_must_be_non_negative_on_both_paths():
    keys = torch.arange(300_000, dtype=torch.int32)
    keys[123_456] = -5
    for part in (keys[123_450:123_460], keys):  # from a copy, and through the bracket
        with pytest.raises(RuntimeError, match="non-negative"):
            flat_mod.kth_smallest_with_count(part, 3)


def test_sample_grows_with_the_number_of_entries_and_large_counts_go_to_the_radix_select(monkeypatch, radix_calls):
    # the bracket gathers about n·5/√m entries: the sample grows to keep that under a quarter of a piece
    assert flat_mod._sample_size(1_841_162) == 1 << 15  # the issue-26 MLP
    assert flat_mod._sample_size(10_000_000) == 1 << 18
    assert flat_mod._sample_size(13_000_000) == 1 << 18
    assert flat_mod._sample_size(14_000_000) is None  # the radix select, in bounded pieces
    monkeypatch.setattr(flat_mod, "_WHOLE", 100)
    monkeypatch.setattr(flat_mod, "_SAMPLE", 1 << 12)
    monkeypatch.setattr(flat_mod, "_MAX_SAMPLE", 1 << 14)
    monkeypatch.setattr(flat_mod, "SELECT_CHUNK", 1 << 11)  # 20,000·5/√2^14 = 781 > 2,048/4: up front to the radix
    assert flat_mod._sample_size(5_000) == 1 << 12 and flat_mod._sample_size(12_000) == 1 << 14
    assert flat_mod._sample_size(20_000) is None
    values = torch.rand(20_000, generator=torch.Generator().manual_seed(6))
    assert flat_mod._bracketed_select([values], 777, 20_000) is None
    _check([values], 777)
    assert radix_calls == [1]


def test_the_select_draws_no_random_numbers():
    values = torch.rand(300_000, generator=torch.Generator().manual_seed(7))
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    flat_mod.kth_smallest_with_count(values, 1234)
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], np_state)


def test_admire_mask_over_the_bracket_is_the_authors_kthvalue_mask(monkeypatch):
    # 155,004 coordinates (above the copy's 2^17): each refresh ranks the sampled-label gradient through
    # the bracket, and the mask equals the authors' h <= kthvalue(h) with h = g² in float32
    answered = []
    bracketed = flat_mod._bracketed_select
    monkeypatch.setattr(flat_mod, "_bracketed_select", lambda *a: answered.append(bracketed(*a)) or answered[-1])
    model = mlp(d_in=512, hidden=300)
    batch = vector_batch(d_in=512, n=64)
    opt = IRE(torch.optim.AdamW(model.parameters(), lr=1e-3), kappa=2.0, gamma=0.8, mask_interval=2)
    params = list(model.parameters())
    closure = closure_for(model, batch)
    sampled_copies = []
    inner = closure.with_sampled_grads

    def keeping_a_copy(ps):
        loss, sampled = inner(ps)
        sampled_copies.append([g.clone() for g in sampled])
        return loss, sampled

    closure.with_sampled_grads = keeping_a_copy
    for _ in range(5):  # refreshes on steps 1, 3 and 5
        opt.step(closure)
        if len(sampled_copies) == len(answered) and answered:
            h = torch.cat([g.reshape(-1) * g.reshape(-1) for g in sampled_copies[-1]])
            threshold = torch.kthvalue(h, flat_count(0.8, h.numel())).values
            mask = torch.cat([opt.state[p]["mask"].reshape(-1) for p in params])
            assert torch.equal(mask, h <= threshold)
    assert len(answered) == 3 and all(a is not None for a in answered)
