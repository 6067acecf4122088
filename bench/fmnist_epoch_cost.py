"""Seconds per Fashion-MNIST epoch on this machine's CPU, for each model and thread count: what a CPU
study on ``fashion_mnist`` costs (sizes its budget).

For each model (``2c2d``, ``mlp``, ``small_cnn``) and each ``torch.set_num_threads`` value, flatlab's
own :class:`~flatlab.train.trainer.Trainer` (plain SGD, batch 128, the workload's default split of
50,000 / 10,000 / 10,000) runs ``--steps`` training steps (after ``--warmup`` untimed ones), and the
workload evaluates the 10,000 validation images once. Per epoch:

    train_s(N) = seconds per step * ceil(N / 128)     for N = 50,000 (val_size 10,000) and 60,000 (val_size 0)
    eval_s     = one pass over 10,000 images (flatlab evaluates val every epoch, test once at the end)

and the speed-up of each thread count over the first. The CPU time per step (all threads) is printed
too: on a machine busy with other work it moves less than the wall time. It also times ``load_data`` (the IDX files read
and split, once per study). Timings on a shared machine move with its load: run it when it is quiet,
or compare the ratios within one run.

    python bench/fmnist_epoch_cost.py [--steps 200] [--threads 1 2] [--models 2c2d mlp small_cnn]
                                      [--data-path synthetic]   # a quick check of the script itself
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Dict, List, Optional, Sequence

import torch

from flatlab.train.cpu_threads import configure as configure_cpu
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import Data, Split, build_workload

BATCH = 128
MODELS = ("2c2d", "mlp", "small_cnn")


def _rows(split: Split, n: int) -> Split:
    return Split(split.inputs[:n], split.targets[:n])


def time_load(params: Dict, repeats: int = 3) -> float:
    """Median wall seconds of ``load_data`` (files read, decompressed and split)."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        build_workload("fashion_mnist", **params).load_data(0)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def time_model(model: str, data: Data, params: Dict, threads: int, steps: int, warmup: int) -> Dict[str, float]:
    """Wall and CPU seconds per training step, and wall seconds per evaluation of ``data.val``, for ``model``
    on ``threads`` threads."""
    torch.set_num_threads(threads)
    wp = {**params, "model": model}
    spec = TrialSpec(
        workload="fashion_mnist",
        optimizer="sgd",
        epochs=1,
        workload_params=wp,
        optimizer_params={"lr": 0.01},
        trainer_params={"batch_size": BATCH, "schedule": "constant"},
    )
    tiny_val = _rows(data.val, BATCH)  # run_epoch evaluates its eval splits: keep that out of the step time
    Trainer(spec, Data(train=_rows(data.train, warmup * BATCH), val=tiny_val)).run_epoch()  # warm-up
    trainer = Trainer(spec, Data(train=_rows(data.train, steps * BATCH), val=tiny_val))
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.run_epoch()
    step_s, cpu_step_s = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
    wl = build_workload("fashion_mnist", **wp)
    t0 = time.perf_counter()
    wl.evaluate(trainer.model, data.val)
    eval_s = time.perf_counter() - t0
    return {"step_s": step_s, "cpu_step_s": cpu_step_s, "eval_s": eval_s, "eval_n": len(data.val)}


def report(rows: List[Dict], threads: Sequence[int]) -> List[str]:
    """Table lines: per model and thread count, wall and CPU ms/step, s per epoch of 50k and 60k, eval s, speed-up."""
    lines = [
        f"{'model':10s} {'threads':>7s} {'ms/step':>8s} {'cpu ms/step':>11s} {'train 50k s':>11s} {'train 60k s':>11s} "
        f"{'eval 10k s':>10s} {'epoch 50k+val s':>15s} {'speed-up':>8s}"
    ]
    base: Dict[str, float] = {}
    for r in rows:
        t50, t60 = r["step_s"] * math.ceil(50_000 / BATCH), r["step_s"] * math.ceil(60_000 / BATCH)
        ev = r["eval_s"] * 10_000 / r["eval_n"]
        base.setdefault(r["model"], t50 + ev)
        lines.append(
            f"{r['model']:10s} {r['threads']:7d} {1e3 * r['step_s']:8.1f} {1e3 * r['cpu_step_s']:11.1f} "
            f"{t50:11.1f} {t60:11.1f} {ev:10.2f} "
            f"{t50 + ev:15.1f} {base[r['model']] / (t50 + ev):8.2f}"
        )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> List[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="timed training steps per model and thread count")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--data-path", default=None, help="the workload's data_path (default: Debian's folder or the hub)")
    args = ap.parse_args(argv)
    params = {"data_path": args.data_path}
    if args.data_path == "synthetic":
        params["synthetic_size"] = 2 * BATCH * (max(args.steps, args.warmup) + 1)  # a quarter is held out
    before = torch.get_num_threads()
    configure_cpu(max(args.threads))  # as a trial sets its CPU threads, before computing (subnormals flushed)
    lines = [f"load_data: {time_load(params):.2f} s (median of 3; data_path={args.data_path!r})"]
    data = build_workload("fashion_mnist", **params).load_data(0)
    rows = []
    try:
        for model in args.models:
            for t in args.threads:
                rows.append(
                    {"model": model, "threads": t, **time_model(model, data, params, t, args.steps, args.warmup)}
                )
    finally:
        torch.set_num_threads(before)
    lines += report(rows, args.threads)
    lines.append(
        f"({args.steps} steps of batch {BATCH} per row, SGD, extrapolated to ceil(N / {BATCH}) steps; "
        "speed-up = the first thread count's epoch time / this one's; cpu ms/step: CPU time of all threads, "
        "which a busy machine inflates less than the wall time)"
    )
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
