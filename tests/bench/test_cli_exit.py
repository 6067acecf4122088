"""bench/cli_exit.py: its medians and difference, and one short run of each exit. No timed assertions."""


def test_summary_is_the_medians_and_their_difference(cli_exit_bench):
    times = {
        "normal exit": [{"wall": 3.0, "cpu": 2.0}, {"wall": 5.0, "cpu": 3.0}, {"wall": 4.0, "cpu": 9.0}],
        "flatlab's exit": [{"wall": 2.0, "cpu": 1.0}, {"wall": 2.5, "cpu": 1.5}, {"wall": 9.0, "cpu": 2.0}],
    }
    out = cli_exit_bench.summary(times)
    assert out["normal exit"] == {"wall": 4.0, "cpu": 3.0} and out["flatlab's exit"] == {"wall": 2.5, "cpu": 1.5}
    assert out["saved"] == {"wall": 1.5, "cpu": 1.5}


def test_a_short_run_times_both_exits(cli_exit_bench):
    out = cli_exit_bench.main(["--rounds", "1", "--", "--help"])
    assert set(out) == {"normal exit", "flatlab's exit", "saved"}
    assert all(out[way]["wall"] > 0 and out[way]["cpu"] > 0 for way in ("normal exit", "flatlab's exit"))
