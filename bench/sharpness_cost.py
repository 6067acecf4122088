"""Cost of average adaptive sharpness, in forward-pass equivalents, and vmap batching vs the loop.

Measures, in one process, the median wall time over ``--repeats`` of
  1. one forward pass (eval mode, no grad) over a fixed subset of ``--m`` examples (unit of cost);
  2. ``average_sharpness`` with ``--n-draws`` draws (loop; target <= n + 1.2 forward equivalents:
     n perturbed passes + 1 clean pass + noise draws and restores);
  3. ``average_sharpness_batched`` with ``--draws-per-forward`` draws per vmapped forward,
and prints both costs and the batched/loop ratio (medians of per-repeat ratios; the three are timed
interleaved so that load from other processes hits them alike). Random data and weights; no downloads.

    python bench/sharpness_cost.py                       # small CNN with BatchNorm, CPU
    python bench/sharpness_cost.py --model vit --device cuda --m 1024 --n-draws 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

from flatlab.sharpness import EvalSubset, average_sharpness, average_sharpness_batched
from flatlab.train.cpu_threads import configure as configure_cpu


def small_cnn(classes: int = 10) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(
        block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes)
    )


def mlp(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, classes)
    )


class ResidualAttentionBlock(nn.Module):
    """open_clip's block layout: pre-LN, nn.MultiheadAttention (sequence-first), GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, B, width)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TinyViT(nn.Module):
    """CLIP-style ViT (patch conv, class token, ln_pre, open_clip blocks, ln_post, linear head)."""

    def __init__(self, width: int = 128, depth: int = 4, heads: int = 4, patch: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * 0.02)
        self.positional_embedding = nn.Parameter(torch.randn((32 // patch) ** 2 + 1, width) * 0.02)
        self.ln_pre = nn.LayerNorm(width)
        self.resblocks = nn.ModuleList(ResidualAttentionBlock(width, heads) for _ in range(depth))
        self.ln_post = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32) -> (B, classes)
        h = self.conv1(x).flatten(2).transpose(1, 2)  # (B, P, width)
        h = torch.cat([self.class_embedding.expand(h.shape[0], 1, -1), h], 1) + self.positional_embedding
        h = self.ln_pre(h).transpose(0, 1)  # (T, B, width)
        for block in self.resblocks:
            h = block(h)
        return self.head(self.ln_post(h[0]))


MODELS = {"cnn": small_cnn, "mlp": mlp, "vit": TinyViT}


def timed(fn: Callable[[], object], device: torch.device) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of this process). On a shared CPU machine the CPU time is the figure
    that other processes' load does not inflate; on CUDA only the wall time is meaningful."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--m", type=int, default=512, help="examples in the fixed subset")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--n-draws", type=int, default=8)
    parser.add_argument("--draws-per-forward", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--no-math-attention",
        action="store_true",
        help="batched variant: keep fused attention kernels (vmap falls back to a per-draw loop)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    args = parser.parse_args()
    configure_cpu(args.threads or torch.get_num_threads())  # as a trial sets its CPU threads (subnormals flushed)

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = MODELS[args.model]().to(device)
    x = torch.randn(args.m, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.m,), device=device)
    subset = EvalSubset(tuple((x[i : i + args.batch], y[i : i + args.batch]) for i in range(0, args.m, args.batch)))
    n = args.n_draws

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            for xb, _ in subset.batches:
                model(xb)

    kw = dict(rho=1.0, n_draws=n, seed=0)
    runs = {
        "forward": forward,
        "loop": lambda: average_sharpness(model, subset, **kw),
        "vmap": lambda: average_sharpness_batched(
            model, subset, draws_per_forward=args.draws_per_forward, math_attention=not args.no_math_attention, **kw
        ),
    }
    for fn in runs.values():  # warm-up
        fn()
    # Interleaved repeats: a load change on a shared machine hits all three alike; ratios per repeat.
    samples: Dict[str, List[Tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            samples[name].append(timed(fn, device))
    loop = average_sharpness(model, subset, **kw)
    vm = average_sharpness_batched(model, subset, draws_per_forward=args.draws_per_forward, **kw)
    diff = max(abs(a - b) for a, b in zip(loop.values, vm.values))

    params = sum(p.numel() for p in model.parameters())
    print(
        f"model={args.model} params={params} device={device} threads={torch.get_num_threads()} "
        f"m={args.m} batch={args.batch} n_draws={n} draws_per_forward={args.draws_per_forward} "
        f"repeats={args.repeats} (medians; ratios are medians of per-repeat ratios)"
    )
    clocks = [("wall", 0)] + ([("cpu", 1)] if device.type == "cpu" else [])
    for clock, c in clocks:
        fwd, lp, vm_ = ([s[c] for s in samples[k]] for k in ("forward", "loop", "vmap"))
        r_loop = statistics.median(x / f for x, f in zip(lp, fwd))
        r_vmap = statistics.median(x / f for x, f in zip(vm_, fwd))
        r_vl = statistics.median(x / y for x, y in zip(vm_, lp))
        verdict = "OK" if r_loop <= n + 1.2 else "ABOVE"
        print(f"[{clock:4s}] one forward pass over the subset : {statistics.median(fwd) * 1e3:9.2f} ms")
        print(
            f"[{clock:4s}] average_sharpness (loop)         : {statistics.median(lp) * 1e3:9.2f} ms = "
            f"{r_loop:6.2f} forward equivalents (target <= n + 1.2 = {n + 1.2:.1f}: {verdict})"
        )
        print(
            f"[{clock:4s}] average_sharpness_batched (vmap) : {statistics.median(vm_) * 1e3:9.2f} ms = "
            f"{r_vmap:6.2f} forward equivalents; batched / loop = {r_vl:.2f}"
        )
    print(f"sharpness = {loop.value:.6f} +- {loop.stderr:.6f}; max |loop - batched| per draw = {diff:.2e}")


if __name__ == "__main__":
    main()
