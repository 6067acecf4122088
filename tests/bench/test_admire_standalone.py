"""bench/admire_standalone.py: a tiny run gives its four ratios from real block means, prints the CPU model,
and leaves the process as it found it (thread count, IRE's flush guard). No timed assertions."""

import math

import flatlab.optim.ire as ire_mod


def test_a_tiny_run_reports_its_ratios_and_puts_everything_back(admire_bench, capsys):
    bench = admire_bench
    guard = ire_mod.flushed_subnormals
    out = bench.main(["--steps", "4", "--block", "2", "--sizes", "16,8,4", "--batch", "8", "--unguarded"])
    assert set(out) == {"first_ratio", "last_ratio", "admire_last_over_first", "adamw_last_over_first"}
    assert all(math.isfinite(v) and v > 0 for v in out.values())
    printed = capsys.readouterr().out
    assert printed.startswith(f"cpu: {bench.cpu_model()};") and "flush around its step: off" in printed
    assert len([line for line in printed.splitlines() if line.strip().startswith(("0 ", "1 "))]) == 2  # 2 blocks
    assert ire_mod.flushed_subnormals is guard
