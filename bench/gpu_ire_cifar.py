"""Training throughput of SGD, SAM and SGD-IRE in the IRE Table 1 setup (ResNet-56, CIFAR-10 shapes).

One prepared GPU check: the ``ire_table1_cnn_cifar`` recipe for ResNet-56 (batch 128, lr 0.1, momentum
0.9, weight decay 5e-4, label smoothing 0.1, cosine; SAM rho 0.05; IRE gamma 0.8, kappa 2, curvature
refreshed every 10 steps, switched on from the first step so its cost is measured) on SYNTHETIC
CIFAR-10-shaped data (uint8 32x32 images generated in memory; nothing is downloaded). Each optimizer
trains a freshly seeded model through the trainer's own pieces (workload model and augmentation,
``BatchClosure``, registered optimizer, LR schedule); the first ``--warmup`` steps are not timed.
Prints images/s per optimizer and the ratios to SGD (the IRE paper, Table 5, reports about 1.1x the base
optimizer's time for IRE at K = 10; SAM costs about 2x).

    python bench/gpu_ire_cifar.py                         # GPU: 3 epochs of 50,000 images per optimizer
    python bench/gpu_ire_cifar.py --device cpu --steps 3  # a quick check that it runs
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from typing import Dict, List

import torch

from flatlab.optim.registry import get_optimizer
from flatlab.train.closure import BatchClosure
from flatlab.train.schedules import Schedule
from flatlab.workloads import build_workload

OPTIMIZERS = {
    "sgd": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
    "sam": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "rho": 0.05},
    "sgd_ire": {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "gamma": 0.8, "kappa": 2.0, "mask_interval": 10},
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(name: str, args: argparse.Namespace, data, device: torch.device) -> Dict[str, float]:
    """Train ``name`` for the configured steps; returns timed images/s and the last loss."""
    wl = build_workload("cifar10", model="resnet56", data_path="synthetic")
    torch.manual_seed(0)
    model = wl.build_model().to(device).train()
    opt = get_optimizer(name).create(model.parameters(), **OPTIMIZERS[name])
    n = len(data.train)
    steps_per_epoch = math.ceil(n / args.batch_size)
    total = args.steps if args.steps else args.epochs * steps_per_epoch
    sched = Schedule("cosine", total_steps=total + args.warmup, steps_per_epoch=steps_per_epoch).scheduler(opt)
    gen = torch.Generator().manual_seed(0)

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return wl.loss(out, y, label_smoothing=0.1)

    step, timed_images, t0, loss = 0, 0, None, float("nan")
    while step < total + args.warmup:
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, args.batch_size):
            if step == args.warmup:
                sync(device)
                t0 = time.perf_counter()
            idx = perm[start : start + args.batch_size]
            x = wl.augment(data.train.inputs[idx], gen).to(device, non_blocking=True)
            y = data.train.targets[idx].to(device, non_blocking=True)
            closure = BatchClosure(model, loss_fn, x, y)
            opt.step(closure)
            sched.step()
            if step >= args.warmup:
                timed_images += len(idx)
            step += 1
            if step >= total + args.warmup:
                break
    loss = float(closure.loss)
    sync(device)
    elapsed = time.perf_counter() - t0
    if not math.isfinite(loss):
        raise RuntimeError(f"{name}: the training loss became {loss}")
    return {"images_per_s": timed_images / elapsed, "seconds": elapsed, "steps": total, "loss": loss}


def main(argv: List[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per optimizer (ignored with --steps)")
    ap.add_argument("--steps", type=int, default=0, help="timed steps per optimizer instead of epochs")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 20; 1 with --steps)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--images", type=int, default=50_000, help="synthetic training images (CIFAR-10: 50,000)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.warmup is None:
        args.warmup = 1 if args.steps else 20
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    images = args.images if not args.steps else min(args.images, (args.steps + args.warmup) * args.batch_size)
    data = build_workload(
        "cifar10", model="resnet56", data_path="synthetic", synthetic_size=images, val_size=0
    ).load_data(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"ResNet-56, synthetic CIFAR-10 shapes ({len(data.train)} images), batch {args.batch_size}, "
        f"device {device} ({name}), "
        f"torch {torch.__version__}"
    )
    results = {}
    for opt in OPTIMIZERS:
        r = run(opt, args, data, device)
        results[opt] = r
        print(
            f"  {opt:8s} {r['images_per_s']:10.1f} images/s  ({r['steps']} timed steps in {r['seconds']:.2f} s, "
            f"last loss {r['loss']:.3f})"
        )
    base = results["sgd"]["images_per_s"]
    print("time per image relative to SGD (paper: SAM ~2x, IRE ~1.1x at K=10):")
    for opt, r in results.items():
        print(f"  {opt:8s} {base / r['images_per_s']:.2f}x")
    print(
        f"  sgd_ire / sgd = {base / results['sgd_ire']['images_per_s']:.3f}, "
        f"sam / sgd = {base / results['sam']['images_per_s']:.3f}"
    )


if __name__ == "__main__":
    main()
