"""bench/platform_overhead.py: its log parsing and verdicts, and (slow) one tiny run end to end that
prints the ratio and the platform's milliseconds per epoch. No timed assertions."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def test_tune_span_is_the_time_between_the_two_log_lines(platform_bench):
    log = (
        "2026-12-01 18:17:45,658 INFO flatlab: starting Tune (24.0 s)\n"
        "2026-12-01 18:18:43,566 INFO ray.tune.tune: Wrote the latest version of all result files\n"
        "2026-12-01 18:18:43,617 INFO flatlab: Tune done (82.5 s)\n"
    )
    assert platform_bench.tune_span(log) == pytest.approx(58.5)


def test_verdicts_use_the_target_of_the_checkpoint_setting(platform_bench):
    assert platform_bench.verdict(4.9, None).endswith("PASS") and "<= 5 ms (default" in platform_bench.verdict(
        4.9, None
    )
    assert platform_bench.verdict(5.1, None).endswith("FAIL")
    assert platform_bench.verdict(1.9, 10).endswith("PASS") and platform_bench.verdict(2.1, 10).endswith("FAIL")
    assert platform_bench.verdict(1.0, 3) == "(no target for checkpoint_every=3)"


def test_short_must_be_below_epochs(platform_bench, capsys):
    with pytest.raises(SystemExit):
        platform_bench.main(["--epochs", "3", "--short", "3"])
    assert "--short must be in [1, --epochs)" in capsys.readouterr().err


def test_a_round_is_measured_against_the_mean_of_the_sequential_runs_around_it(platform_bench):
    # (a) before: 10 s and 50 s, after: 12 s and 58 s -> 11 and 54, 43 s for the extra epochs; (b): 48 s
    e = platform_bench.round_estimate(
        {"s": 10.0, "l": 50.0}, {"s": 12.0, "l": 58.0}, {"s": 15.0, "l": 63.0}, "s", "l", 1000
    )
    assert e["ms"] == pytest.approx(5.0) and e["a_ms"] == pytest.approx(43.0)
    assert e["ratio"] == pytest.approx(48 / 43)


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--trials", "0"]])
def test_rounds_and_trials_must_be_positive(platform_bench, capsys, argv):
    with pytest.raises(SystemExit):
        platform_bench.main(argv)
    assert "--trials and --rounds must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_run_prints_its_ratio_and_ms_per_epoch(platform_bench):
    done = subprocess.run(
        [
            sys.executable,
            platform_bench.__file__,
            "--trials",
            "1",
            "--rounds",
            "1",
            "--epochs",
            "3",
            "--short",
            "1",
            "--checkpoint-every",
            "10",
            "--width",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "1 and 3 epochs each" in out and "checkpoint_every=10" in out
    a = re.search(r"\(a\) sequential loop: +([0-9.]+) s and +([0-9.]+) s", out)
    b = re.search(r"time in Tune: +(-?[0-9.]+) s and +(-?[0-9.]+) s", out)
    assert a and b, out
    ratio = re.search(r"ratio \(b\)/\(a\) per extra epoch: (-?[0-9.]+) \(median of 1 rounds\)", out).group(1)
    ms = float(re.search(r"platform ms per epoch: (-?[0-9.]+)", out).group(1))
    # one round: its median is the round itself (the ratio may print as 0.000 or -0.000 here: 2 extra epochs
    # of ~5 ms each can leave b_long - b_short at 0.0 s after rounding)
    round_1 = re.search(r"round 1: .* ratio (-?[0-9.]+), (-?[0-9.]+) ms per epoch", out)
    assert round_1 and round_1.groups() == (ratio, f"{ms:.2f}"), out
    assert re.search(r"target <= 2 ms \(checkpoint_every=10\) +(PASS|FAIL)", out)
    # the printed figures agree: ms = ((b_long - b_short) - (a_long - a_short)) / (1 trial x 2 extra epochs), up to
    # the rounding of the four times to 0.1 s (0.2 s over 2 epochs)
    (a_s, a_l), (b_s, b_l) = map(float, a.groups()), map(float, b.groups())
    assert ms == pytest.approx(((b_l - b_s) - (a_l - a_s)) / 2 * 1e3, abs=101)
    assert b_s > 0 and b_l > 0
    assert "outside its epochs" in out and re.search(r"per extra epoch, measured inside the run .*: -?[0-9.]+ ms", out)
