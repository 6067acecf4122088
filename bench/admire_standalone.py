"""AdmIRE in one's own training loop: does its step slow down against AdamW's as subnormals appear?

Outside a trial nothing sets the CPU's subnormal mode (``flatlab.train.cpu_threads`` does, for a trial),
so this script leaves torch's default (IEEE subnormals kept) and checks it. On an MLP 3072-512-512-10
(1.8 M parameters) with a fixed random batch of 64, whose loss saturates so that subnormal gradients
appear, AdmIRE (``adamw_ire``, its registered defaults) and AdamW with AdmIRE's base settings (betas
(0.9, 0.95), weight decay 0.1, lr 1e-3) each train their own copy of the same initial weights, one thread,
stepping in turn so a change of load falls on both. Every step is timed (CPU time by default); the steps
form blocks of ``--block``. Printed: the CPU model (``/proc/cpuinfo``), the mode found, per block the mean
step time of each and AdmIRE / AdamW, then the first and last block's ratio and each optimizer's last /
first block. ``--unguarded`` turns IRE's own flush (``flatlab.optim._subnormal.flushed_subnormals``) off,
to show the cost without it.

    python bench/admire_standalone.py                 # 80 steps, blocks of 20
    python bench/admire_standalone.py --unguarded
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

import flatlab.optim.ire as ire_mod
from flatlab.optim import get_optimizer
from flatlab.optim._subnormal import flushing_now
from flatlab.train.closure import BatchClosure


def cpu_model() -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` (``unknown`` where there is none)."""
    path = Path("/proc/cpuinfo")
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def build(sizes: List[int], batch: int, seed: int = 0):
    """The MLP (ReLU between layers) and a fixed batch of ``batch`` random inputs and labels."""
    torch.manual_seed(seed)
    layers: List[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    g = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(batch, sizes[0], generator=g), torch.randint(0, sizes[-1], (batch,), generator=g)
    return model, x, y


def run(steps: int, block: int, sizes: List[int], batch: int, clock) -> Dict[str, List[float]]:
    """Step times (seconds) of AdmIRE and AdamW, stepping in turn, each on its own copy of the model."""
    model, x, y = build(sizes, batch)
    runners = {}
    for name in ("adamw_ire", "adamw"):
        m = copy.deepcopy(model)
        if name == "adamw":
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        else:
            opt = get_optimizer(name).create(m.named_parameters())
        runners[name] = (m, opt, torch.Generator().manual_seed(7))
    times: Dict[str, List[float]] = {name: [] for name in runners}
    for _ in range(steps):
        for name, (m, opt, rng) in runners.items():
            state = torch.get_rng_state()
            torch.set_rng_state(rng.get_state())  # each its own stream (IRE's sampled labels)
            closure = BatchClosure(m, F.cross_entropy, x, y)
            start = clock()
            if name == "adamw":
                opt.zero_grad()
                closure()
                opt.step()
            else:
                opt.step(closure)
            times[name].append(clock() - start)
            rng.set_state(torch.get_rng_state())
            torch.set_rng_state(state)
    return times


def report(times: Dict[str, List[float]], block: int) -> Dict[str, float]:
    """Print the per-block table and return the summary ratios."""
    blocks = {k: [statistics.fmean(v[i : i + block]) for i in range(0, len(v), block)] for k, v in times.items()}
    ratios = [a / b for a, b in zip(blocks["adamw_ire"], blocks["adamw"])]
    print(f"{'block':>5} {'AdmIRE ms':>10} {'AdamW ms':>10} {'ratio':>7}")
    for i, (a, b, r) in enumerate(zip(blocks["adamw_ire"], blocks["adamw"], ratios)):
        print(f"{i:>5} {a * 1e3:>10.2f} {b * 1e3:>10.2f} {r:>7.3f}")
    out = {
        "first_ratio": ratios[0],
        "last_ratio": ratios[-1],
        "admire_last_over_first": blocks["adamw_ire"][-1] / blocks["adamw_ire"][0],
        "adamw_last_over_first": blocks["adamw"][-1] / blocks["adamw"][0],
    }
    print(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
    return out


def main(argv=None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--sizes", default="3072,512,512,10", help="layer widths, input first")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--unguarded", action="store_true", help="IRE's own flush off: the cost without it")
    args = p.parse_args(argv)
    threads, guard = torch.get_num_threads(), ire_mod.flushed_subnormals
    torch.set_num_threads(1)
    if args.unguarded:
        ire_mod.flushed_subnormals = contextlib.nullcontext  # type: ignore[assignment]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"cpu: {cpu_model()}; torch {torch.__version__}; 1 thread; caller flushes subnormals: {flushing_now()}")
    print(f"IRE's flush around its step: {'off' if args.unguarded else 'on'}")
    sizes = [int(s) for s in args.sizes.split(",")]
    try:
        return report(run(args.steps, args.block, sizes, args.batch, clock), args.block)
    finally:
        torch.set_num_threads(threads)
        ire_mod.flushed_subnormals = guard  # type: ignore[assignment]


if __name__ == "__main__":
    main()
