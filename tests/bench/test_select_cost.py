"""bench/select_cost.py: its harder cases are what they say, and one short run in which every select gives
torch.kthvalue's value on every case. No timed assertions."""

import torch


def test_the_harder_cases(select_bench):
    cases = select_bench.synthetic(10_000)
    zeros, k = cases["90 % zeros, k = 80 %"]
    assert 0.88 < float((zeros == 0).float().mean()) < 0.92 and k == 8_000  # k lies among the zeros
    ties, k = cases["70 % tied, k just above"]
    assert int((ties == 1.0).sum()) == 7_000 and k == 7_100 and float(torch.kthvalue(ties, k).values) > 1.0
    values, _ = cases["sorted, k = 80 %"]
    assert torch.equal(values, torch.sort(values).values)


def test_a_short_run_agrees_with_kthvalue(select_bench):
    rows = select_bench.main(["--steps", "2", "--repeats", "1"])
    assert len(rows) == 4 and rows[0]["case"].startswith("issue-26 MLP keys (1,841,162)")
    assert all(row["same"] for row in rows)
    assert all(row[key] > 0 for row in rows for key in ("bracket ms", "radix ms", "kthvalue ms"))
