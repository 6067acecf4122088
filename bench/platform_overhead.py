"""Platform overhead: the same N trials (a) in a plain sequential loop and (b) through `flatlab run`.

(b) runs 2 trials at a time on local Ray (1 CPU each, which is also the thread count of (a)), with the
Optuna-free grid searcher so both sides train exactly the same configurations, MLflow tracking on
SQLite and a checkpoint every epoch. Printed: wall times, the ratio (b)/(a), and the per-trial
overhead ((b) x concurrency - (a)) / N. Targets on a 2-core machine: ratio <= 0.65 for trials of
>= 10 s, overhead <= 1 s per trial. One run measures both sides (these machines are noisy).

    python bench/platform_overhead.py [--trials 6] [--epochs 15] [--width 32]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

STUDY = """
from flatlab import Arm, Study
from flatlab import space as sp

STUDY = Study(
    name="bench_overhead",
    workload="digits",
    workload_params={{"model": "cnn", "width": {width}}},
    arms=(Arm("sgd", space={{"lr": sp.grid({lrs})}}),),
    searcher="grid",
    scheduler="fifo",
    max_epochs={epochs},
    max_concurrent=2,
)
"""


def sequential(study) -> float:
    import torch

    from flatlab.train.trainer import Trainer
    from flatlab.workloads.registry import build_workload

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data = build_workload(study.workload, **dict(study.workload_params)).load_data(study.seed)
    for cfg in study.grid(study.arms[0]):
        trainer = Trainer(study.trial_spec(cfg), data)
        for _ in range(study.max_epochs):
            trainer.run_epoch()
        trainer.evaluate_test()
    return time.perf_counter() - t0


def time_outside_training(db: Path) -> list:
    """Per trial: seconds between its MLflow run's start and end not spent in its epochs (set-up,
    reporting, checkpoints, artifact upload), from the study's SQLite store."""
    import sqlite3

    con = sqlite3.connect(str(db))
    rows = con.execute(
        "select r.run_uuid, r.start_time, r.end_time from runs r join tags t on t.run_uuid = r.run_uuid "
        "where t.key = 'flatlab.role' and t.value = 'trial'"
    ).fetchall()
    out = []
    for run_id, start, end in rows:
        (epochs,) = con.execute(
            "select sum(v) from (select max(value) as v from metrics where run_uuid = ? and key = 'time/epoch_s' group by step)",
            (run_id,),
        ).fetchone()
        if start and end and epochs is not None:
            out.append((end - start) / 1000 - epochs)
    con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--width", type=int, default=32)
    args = ap.parse_args()
    lrs = [round(0.02 + 0.01 * i, 4) for i in range(args.trials)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_overhead.py"
        path.write_text(textwrap.dedent(STUDY.format(width=args.width, lrs=lrs, epochs=args.epochs)))
        from flatlab.study.loader import load_studies

        study = load_studies(str(path))[0]
        a = sequential(study)
        t0 = time.perf_counter()
        res = subprocess.run(
            [str(Path(sys.executable).parent / "flatlab"), "run", str(path), "--root", str(Path(tmp) / "root")],
            capture_output=True, text=True,
        )
        b = time.perf_counter() - t0
        if res.returncode != 0:
            sys.exit(f"flatlab run failed:\n{res.stdout}\n{res.stderr}")
        log = (Path(tmp) / "root" / "bench_overhead" / "logs" / "flatlab.log").read_text()
        outside = time_outside_training(Path(tmp) / "root" / "mlflow.db")
        phases = {m.group(1): float(m.group(2)) for m in re.finditer(r"(starting Tune|Tune done) \(([0-9.]+) s\)", log)}
    n = args.trials
    overhead = (b * 2 - a) / n
    print(f"trials: {n} x {args.epochs} epochs (digits CNN width {args.width}), {a / n:.1f} s per trial sequentially")
    print(f"(a) sequential loop, 1 thread:        {a:7.1f} s")
    print(f"(b) flatlab run, 2 concurrent trials: {b:7.1f} s  (Ray start-up, MLflow, checkpoints included)")
    print(f"ratio (b)/(a): {b / a:.3f}   target <= 0.65   {'PASS' if b / a <= 0.65 else 'FAIL'}")
    print(f"per-trial overhead: {overhead:.2f} s   target <= 1.0 s   {'PASS' if overhead <= 1.0 else 'FAIL'}")
    if outside:
        print(f"  per trial, time outside its epochs (MLflow run span - sum of time/epoch_s): "
              f"{statistics.mean(outside):.2f} s mean, {min(outside):.2f}-{max(outside):.2f} s "
              f"(the first trial on each worker also starts the worker)")
    if len(phases) == 2:
        tune_s = phases["Tune done"] - phases["starting Tune"]
        print(f"  breakdown of (b): {phases['starting Tune']:.1f} s set-up before Tune (Ray, MLflow, data), "
              f"{tune_s:.1f} s in Tune ({(tune_s * 2 - a) / n:.2f} s per trial over the sequential time), "
              f"{b - phases['Tune done']:.1f} s imports before / shutdown after")


if __name__ == "__main__":
    main()
