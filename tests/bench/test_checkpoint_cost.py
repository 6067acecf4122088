"""bench/checkpoint_cost.py: its arithmetic, its launch order and argument checks, and (slow) one tiny
run end to end. No timed assertions."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def test_costs_per_round_trip_and_per_checkpoint_by_hand(checkpoint_bench):
    # 4 trials x 1000 epochs: 4000 round trips more unbatched, 400 checkpoints more at every-10
    c = checkpoint_bench.costs({"batched": 20.0, "unbatched": 36.0, "every-10": 26.0}, trials=4, epochs=1000)
    assert c["round_trip_ms"] == pytest.approx(4.0)  # 16 s / 4000
    assert c["checkpoint_ms"] == pytest.approx(15.0)  # 6 s / 400


def test_every_other_round_runs_the_variants_in_reverse(checkpoint_bench):
    assert checkpoint_bench.order(0) == ["batched", "unbatched", "every-10"]
    assert checkpoint_bench.order(1) == ["every-10", "unbatched", "batched"]
    assert checkpoint_bench.order(2) == checkpoint_bench.order(0)


def test_the_variants_differ_in_one_setting_each(checkpoint_bench):
    assert checkpoint_bench.VARIANTS["batched"] == (None, {})
    assert checkpoint_bench.VARIANTS["unbatched"] == (None, {"FLATLAB_RESULT_BUFFER_S": "0"})
    assert checkpoint_bench.VARIANTS["every-10"] == (10, {})


@pytest.mark.parametrize("argv", [["--epochs", "15"], ["--rounds", "0"], ["--trials", "0"]])
def test_bad_arguments_are_refused(checkpoint_bench, capsys, argv):
    with pytest.raises(SystemExit):
        checkpoint_bench.main(argv)
    assert "--epochs a multiple of 10" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_run_prints_both_costs(checkpoint_bench):
    done = subprocess.run(
        [sys.executable, checkpoint_bench.__file__, "--trials", "1", "--epochs", "20", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    line = re.search(r"round 1: time in Tune batched ([0-9.]+) s, unbatched ([0-9.]+) s, every-10 ([0-9.]+) s", out)
    assert line, out
    assert all(float(v) > 0 for v in line.groups())
    assert re.search(r"median: -?[0-9.]+ ms per round trip, -?[0-9.]+ ms per checkpoint", out), out
    assert "checkpoint_every=10 therefore adds" in out
