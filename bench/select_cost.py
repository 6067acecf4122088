"""Cost of IRE's threshold select on the CPU: the sampled bracket against the radix select and torch.kthvalue.

The keys are what AdmIRE ranks on a refresh of issue 26's MLP (bench/optimizer_overhead.py's
``saturating_mlp``, 1.8 M coordinates): the bit patterns of |g| of the sampled-label gradient after
``--steps`` AdamW steps on its fixed batch. Three harder cases follow on as many synthetic values: 90 %
exact zeros with k inside them (the bracket answers [0, 0] without gathering), 70 % tied at 1.0 with
the k-th just above them (the bracket overfills, gives up, and the radix select answers), and the
values sorted. Every method must give torch.kthvalue's value; each time is the median of ``--repeats``
calls, CPU time, with the threads set as a trial sets them.

    python bench/select_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

import flatlab.optim._select as flat
from flatlab.optim.ire import flat_count
from flatlab.train.closure import BatchClosure
from flatlab.train.cpu_threads import configure as configure_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import optimizer_overhead as ob  # noqa: E402  (a sibling script: the MLP and its batch)


def mlp_keys(steps: int) -> List[torch.Tensor]:
    """int32 bit patterns of |g|, g the MLP's sampled-label gradient after ``steps`` AdamW steps."""
    model, loss_fn, x, y = ob.workload("mlp", torch.device("cpu"), 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    closure = BatchClosure(model, loss_fn, x, y)
    for _ in range(steps):
        opt.step(closure)
    _, sampled = closure.with_sampled_grads(list(model.parameters()))
    return [g.view(torch.int32).bitwise_and_(0x7FFFFFFF) for g in sampled]


def synthetic(n: int) -> Dict[str, Tuple[torch.Tensor, int]]:
    """The harder cases: name -> (values, k)."""
    g = torch.Generator().manual_seed(0)
    zeros = torch.rand(n, generator=g)
    zeros[torch.rand(n, generator=g) < 0.9] = 0.0
    tied = int(0.7 * n)
    ties = torch.cat([torch.ones(tied), 1.0 + torch.rand(n - tied, generator=g)])[torch.randperm(n, generator=g)]
    return {
        "90 % zeros, k = 80 %": (zeros, flat_count(0.8, n)),
        "70 % tied, k just above": (ties, tied + 100),
        "sorted, k = 80 %": (torch.sort(torch.rand(n, generator=g)).values, flat_count(0.8, n)),
    }


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU milliseconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times)


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, object]]:
    """Run the cases, print the table; returns one record per case (times in ms, ``same`` = every method
    gave torch.kthvalue's value)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (numpy's passes use one)")
    ap.add_argument("--steps", type=int, default=60, help="AdamW steps before the MLP's keys are taken")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    mode = configure_cpu(args.threads, True)
    keys = mlp_keys(args.steps)
    every = torch.cat([k.reshape(-1) for k in keys]).view(torch.float32)
    cases: Dict[str, Tuple[object, int, torch.Tensor]] = {
        f"issue-26 MLP keys ({every.numel():,}), k = 80 %": (keys, flat_count(0.8, every.numel()), every)
    }
    for name, (values, k) in synthetic(every.numel()).items():
        cases[name] = (values, k, values)
    print(f"threads={args.threads} cpu_denormals={mode} repeats={args.repeats}")
    print(
        f"{'case':40s} {'bracket ms':>11s} {'radix ms':>9s} {'kthvalue ms':>12s} {'radix / bracket':>16s}  same value"
    )
    rows: List[Dict[str, object]] = []
    for name, (values, k, flat_values) in cases.items():
        expected = torch.kthvalue(flat_values, k).values
        same = all(
            torch.equal(select(values, k)[0], expected)
            for select in (flat.kth_smallest_with_count, flat.radix_kth_smallest_with_count)
        )
        row = {
            "case": name,
            "same": same,
            "bracket ms": timed(lambda values=values, k=k: flat.kth_smallest_with_count(values, k), args.repeats),
            "radix ms": timed(lambda values=values, k=k: flat.radix_kth_smallest_with_count(values, k), args.repeats),
            "kthvalue ms": timed(lambda v=flat_values, k=k: torch.kthvalue(v, k), max(1, args.repeats // 3)),
        }
        rows.append(row)
        print(
            f"{name:40s} {row['bracket ms']:11.2f} {row['radix ms']:9.2f} {row['kthvalue ms']:12.2f} "
            f"{row['radix ms'] / row['bracket ms']:16.2f}  {same}"
        )
    return rows


if __name__ == "__main__":
    main()
