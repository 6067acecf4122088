"""bench/fmnist_epoch_cost.py: its extrapolation arithmetic, and one tiny run on synthetic data. No timed assertions."""


def test_the_extrapolation(fmnist_bench):
    rows = [
        {"model": "mlp", "threads": 1, "step_s": 0.1, "cpu_step_s": 0.09, "eval_s": 0.5, "eval_n": 5_000},
        {"model": "mlp", "threads": 2, "step_s": 0.04, "cpu_step_s": 0.07, "eval_s": 0.25, "eval_n": 5_000},
    ]
    lines = fmnist_bench.report(rows, [1, 2])
    # 50,000 / 128 -> 391 steps, 60,000 / 128 -> 469 steps; eval of 5,000 images scaled to 10,000
    assert lines[1].split() == ["mlp", "1", "100.0", "90.0", "39.1", "46.9", "1.00", "40.1", "1.00"]
    # 0.04 * 391 = 15.64, 0.04 * 469 = 18.76; epoch 15.64 + 0.5 = 16.14; speed-up 40.1 / 16.14 = 2.4845
    assert lines[2].split() == ["mlp", "2", "40.0", "70.0", "15.6", "18.8", "0.50", "16.1", "2.48"]


def test_a_tiny_run_on_synthetic_data(fmnist_bench):
    lines = fmnist_bench.main(
        ["--steps", "2", "--warmup", "1", "--threads", "1", "--models", "small_cnn", "--data-path", "synthetic"]
    )
    assert lines[0].startswith("load_data: ") and lines[2].split()[:2] == ["small_cnn", "1"]
    assert float(lines[2].split()[2]) > 0
