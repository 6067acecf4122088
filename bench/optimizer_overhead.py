"""Per-step cost of each flatlab optimizer relative to its base optimizer, and its extra memory.

For each model (a small CNN with BatchNorm on 32×32 images, a one-block transformer language model;
on request, ``--models mlp``, an MLP whose loss saturates on its batch), every optimizer below and its
base are built on copies of the same initial weights and stepped on the same fixed mini-batch through
the trainer's closure (flatlab.train.closure.BatchClosure). The timing is paired: after warm-up, blocks
of ``--steps`` optimizer steps alternate with blocks of base steps of about the same duration
(B O B O … O B, ``--repeats`` optimizer blocks); each optimizer block's
per-step time is divided by the mean per-step time of the two base blocks around it, and the ratio
reported is the median over blocks (per-step times shown are medians too), so load changes on a shared
machine hit both sides of each ratio alike. Next to it: a distribution-free interval for that median
(order statistics of the block ratios, coverage ≥ 90 % where the blocks allow, printed); a verdict whose
interval contains the target is marked "within noise". Wall time is the default clock; process CPU time is
printed too (and can be the judged clock, ``--clock cpu``) because other jobs on a shared CPU distort
wall time.

Memory, in parameter copies over what the base optimizer alone holds: "state copies" are the bytes of
the tensors each optimizer keeps in its state between steps (wrappers and base together; IRE's bool mask
counts 1/4 of a float32 copy); "peak extra copies" add the transient peak of its steps over the base's
(the accumulator, noise and sampled gradients that live only during a step). On CUDA the peak comes
from the caching allocator's statistics on each model. On CPU it is the process's peak RSS (reset
through /proc/self/clear_refs, Linux) on a probe MLP with two 3072×3072 weights, after fixing glibc's
mmap threshold at 64 KiB (mallopt), so every tensor from that size up is its own mapping and a freed
one leaves the RSS at once; activations are negligible there. After timing runs the CPU memory is
measured in a fresh child process (the same script with ``--memory-only``), whose heap holds no free
chunks left by them. Where the peak cannot be measured the state figure is judged. ``--json FILE``
writes every row of both tables (timing rows also with their unrounded block ratios, interval and
target as numbers).

Three timing rows take IRE apart. "SGD-IRE, mask held" never refreshes after its first step: its
excess is the wrapper's two passes per step (copy θ_old, one lerp). The two "IRE's floor" rows are not
optimizers: SGD (AdamW) alone, its closure adding IRE's sampled-label pass (labels drawn from the
softmax, one more backward through the step's own graph) to every 10th step. Each is the least any
exact IRE at K = 10 over that base costs on that model and batch. The SGD-IRE row's excess is about
the sum of the other two's, plus the mask's select every 10th step.

Targets: SAM/SGD ≤ 2.05; SGD-IRE/SGD and AdmIRE/AdamW ≤ 1.10 (K = 10); TSAM/SGD ≤ 2s + 0.2;
TSAM extra memory ≤ 3 parameter copies for s = 3 and s = 8.

    python bench/optimizer_overhead.py                     # CPU, both models
    python bench/optimizer_overhead.py --threads 1 --clock cpu      # on a machine shared with other jobs
    python bench/optimizer_overhead.py --device cuda --repeats 9
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.optim import get_optimizer
from flatlab.train.closure import BatchClosure
from flatlab.train.cpu_threads import configure as configure_cpu


# ------------------------------------------------------------------------------------------ models
def small_cnn(classes: int = 10) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)
        )

    return nn.Sequential(
        block(3, 32), block(32, 64), block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes)
    )


class TinyLM(nn.Module):
    """Token embedding + one pre-LN transformer block + LM head: logits ``(B, T, vocab)``."""

    def __init__(self, vocab: int = 512, width: int = 128, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)
        self.block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.ln(self.block(h, src_mask=self.causal, is_causal=True)))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def saturating_mlp(classes: int = 10) -> nn.Module:
    """3072 → 512 → 512 → ``classes`` with ReLU (1.8 M parameters). On its fixed random batch the loss
    saturates within a few dozen steps and the gradients grow subnormal entries (issue 26)."""
    return nn.Sequential(nn.Linear(3072, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, classes))


WORKLOADS = ("cnn", "transformer", "mlp")


def workload(name: str, device: torch.device, batch: int) -> Tuple[nn.Module, Callable, torch.Tensor, torch.Tensor]:
    """``(model, loss_fn, inputs, targets)`` of one of :data:`WORKLOADS`, on a fixed random batch.

    ``cnn``: :func:`small_cnn` on ``batch`` 3×32×32 images; ``transformer``: :class:`TinyLM` on
    ``batch // 4`` sequences of 64 tokens; ``mlp``: :func:`saturating_mlp` on ``batch`` vectors of 3072.
    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(WORKLOADS)}")
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "cnn":
        x = torch.randn(batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return small_cnn().to(device), F.cross_entropy, x.to(device), y.to(device)
    if name == "mlp":
        x = torch.randn(batch, 3072, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return saturating_mlp().to(device), F.cross_entropy, x.to(device), y.to(device)
    tokens = torch.randint(0, 512, (batch // 4, 65), generator=g)
    return TinyLM().to(device), lm_loss, tokens[:, :-1].to(device), tokens[:, 1:].to(device)


# ------------------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    label: str
    name: str  # registry name
    hparams: Tuple[Tuple[str, object], ...] = ()
    target_time: Optional[float] = None  # max ratio to the base's step time
    target_memory: Optional[float] = None  # max extra parameter copies
    # Not an optimizer of its own: the base alone, its closure adding IRE's sampled-label pass (labels
    # drawn from the softmax, one more backward through the step's graph) to every n-th step. Its ratio
    # is the least an exact IRE at K = n costs on this model, with no mask, copy or lerp at all.
    sampled_every: Optional[int] = None
    timing_only: bool = False  # a diagnostic row that takes IRE's cost apart: no memory row

    @property
    def refreshes(self) -> bool:
        """Whether the row belongs to the IRE family (IRE, the mask-held row, the floor rows), timed in
        blocks of ``--ire-steps`` so that each block holds the same number of curvature passes."""
        return "ire" in self.name or self.sampled_every is not None


CASES = [
    Case("SAM / SGD", "sam", target_time=2.05),
    Case("ASAM / SGD", "asam"),
    Case("TSAM s=3 / SGD", "tsam", (("s", 3),), target_time=2 * 3 + 0.2, target_memory=3.0),
    Case("TSAM s=8 / SGD", "tsam", (("s", 8),), target_time=2 * 8 + 0.2, target_memory=3.0),
    Case("SGD-IRE / SGD (K=10)", "sgd_ire", (("mask_interval", 10),), target_time=1.10),
    Case("AdmIRE / AdamW (K=10)", "adamw_ire", (("mask_interval", 10),), target_time=1.10),
    Case("SAM-IRE / SAM (K=10)", "sam_ire", (("mask_interval", 10),)),
    # IRE's two per-step passes alone: the first step computes the mask, which is then held for good
    Case("SGD-IRE, mask held (no refresh) / SGD", "sgd_ire", (("mask_interval", 10**9),), timing_only=True),
    Case("IRE's floor: SGD + sampled pass every 10th step / SGD", "sgd", sampled_every=10, timing_only=True),
    Case("IRE's floor: AdamW + sampled pass every 10th step / AdamW", "adamw", sampled_every=10, timing_only=True),
]


class SampledEvery:
    """A closure that runs the sampled-label pass (``with_sampled_grads``) on every ``n``-th call and a
    plain pass otherwise, dropping the sampled gradients: IRE's curvature estimator without IRE."""

    def __init__(self, inner: BatchClosure, params: List[torch.Tensor], n: int) -> None:
        self.inner, self.params, self.n, self.calls = inner, params, n, 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if self.calls % self.n:
            return self.inner()
        return self.inner.with_sampled_grads(self.params)[0]


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the tensors ``opt`` (and, for wrappers, its bases) keeps in ``state``."""
    n = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    base = getattr(opt, "base", None)
    return n + (state_bytes(base) if base is not None else 0)


def build(case_name: str, hparams: Dict[str, object], model: nn.Module, base_model: nn.Module):
    """(optimizer over ``model.named_parameters()`` as the trainer builds it, its base alone over
    ``base_model`` with the same base hyperparameters)."""
    spec = get_optimizer(case_name)
    values = spec.resolve(hparams)
    base_spec = get_optimizer(spec.base) if spec.base else spec
    base_values = {h.name: values[h.name] for h in base_spec.hparams}
    return spec.build(model.named_parameters(), **values), base_spec.build(base_model.parameters(), **base_values)


def median_interval(values: List[float], level: float = 0.9) -> Tuple[float, float, float]:
    """Distribution-free confidence interval for the median of ``values`` (order statistics).

    ``[x_(k), x_(n+1-k)]`` of the sorted values covers the true median with probability
    ``1 - 2·P(Bin(n, 1/2) ≤ k-1)`` whatever the distribution; the narrowest such interval with coverage
    ≥ ``level`` is returned with its exact coverage, ``(lo, hi, coverage)``. Fewer than 2 values, or too
    few for ``level``: the full range and the coverage it has.
    """
    xs = sorted(values)
    n = len(xs)
    if n < 2:
        return (xs[0], xs[0], 0.0) if xs else (math.nan, math.nan, 0.0)
    best = (xs[0], xs[-1], 1 - 2 * 0.5**n)
    tail = 0.0  # P(Bin(n, 1/2) ≤ k-1)
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1) * 0.5**n
        coverage = 1 - 2 * tail
        if coverage < level:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


# ------------------------------------------------------------------------------------------ memory
# The CPU memory probe: an MLP whose two weights are 3072×3072 float32 (37.7 MB each). With glibc's mmap
# threshold fixed at 64 KiB (_map_every_allocation), every tensor from 64 KiB up (parameter copies, masks,
# scratch) is its own mapping, returned to the OS when freed, so the process's peak RSS counts them
# exactly. Its batch (8) keeps activations negligible next to one parameter copy.
PROBE_WIDTH = 3072
PROBE_BATCH = 8


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _map_every_allocation(threshold: int = 1 << 16) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more with its own mapping, returned
    to the OS when freed (``mallopt(M_MMAP_THRESHOLD)``; fixing it also stops glibc's dynamic raising
    of the threshold), so the peak RSS counts exactly the live tensors of that size. Slows every later
    allocation of that size (a fresh mapping each time): call it only before measuring memory.
    Returns False where libc is not glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, threshold))  # M_MMAP_THRESHOLD = -3 in glibc's malloc.h
    except (OSError, AttributeError):
        return False


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux ≥ 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def transient_peak_bytes(run: Callable[[], None], device: torch.device) -> Optional[int]:
    """Peak bytes in use while ``run()`` executes above those in use before it: the CUDA caching
    allocator's statistics, or on CPU the process's peak RSS (``None`` where it cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = _status_bytes("VmRSS")
    if not _reset_peak_rss():
        return None
    run()
    return _status_bytes("VmHWM") - before


def peak_extra_copies(
    case: Case, model: nn.Module, loss_fn, x, y, device: torch.device, warmup: int, steps: int
) -> Tuple[float, Optional[float]]:
    """``(state, peak)``: extra memory of ``case``'s optimizer over its base, in parameter copies.

    ``state``: bytes kept in optimizer state between steps. ``peak``: state plus the transient peak of
    ``steps`` steps (after ``warmup``), each side measured by :func:`transient_peak_bytes`; ``None``
    where the peak cannot be measured.
    """
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    runners = paired_runners(case, model, loss_fn, x, y, device)
    opt, base = (r.opt for r in runners)
    for r in runners:
        r.steps(warmup)
    peaks = [transient_peak_bytes(lambda r=r: r.steps(steps), device) for r in runners]
    state = (state_bytes(opt) - state_bytes(base)) / param_bytes
    if peaks[0] is None or peaks[1] is None:
        return state, None
    return state, state + (peaks[0] - peaks[1]) / param_bytes


def probe_workload(device: torch.device) -> Tuple[nn.Module, Callable, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w = PROBE_WIDTH
    model = nn.Sequential(nn.Linear(w, w, bias=False), nn.ReLU(), nn.Linear(w, w, bias=False)).to(device)
    x = torch.randn(PROBE_BATCH, w, generator=g)
    y = torch.randint(0, w, (PROBE_BATCH,), generator=g)
    return model, F.cross_entropy, x.to(device), y.to(device)


class Runner:
    """One optimizer on its own copy of the model, stepping a fixed batch."""

    def __init__(
        self,
        opt: torch.optim.Optimizer,
        model: nn.Module,
        loss_fn,
        x,
        y,
        device: torch.device,
        sampled_every: Optional[int] = None,
    ) -> None:
        self.opt, self.model, self.device = opt, model, device
        self.closure: Callable[[], torch.Tensor] = BatchClosure(model, loss_fn, x, y)
        if sampled_every is not None:
            self.closure = SampledEvery(self.closure, list(model.parameters()), sampled_every)
        self.wall: List[float] = []
        self.cpu: List[float] = []

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def steps(self, n: int) -> None:
        """Run ``n`` steps; record seconds per step of wall time and of this process's CPU time."""
        self.sync()
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            self.opt.step(self.closure)
        self.sync()
        self.wall.append((time.perf_counter() - w0) / n)
        self.cpu.append((time.process_time() - c0) / n)


def paired_runners(case: Case, model: nn.Module, loss_fn, x, y, device: torch.device) -> List[Runner]:
    """``[optimizer's runner, base's runner]``, each on its own copy of ``model``'s initial weights."""
    opt_model, base_model = copy.deepcopy(model), copy.deepcopy(model)
    opt, base = build(case.name, dict(case.hparams), opt_model, base_model)
    return [
        Runner(opt, opt_model, loss_fn, x, y, device, case.sampled_every),
        Runner(base, base_model, loss_fn, x, y, device),
    ]


def selected(args: argparse.Namespace) -> List[Case]:
    return [c for c in CASES if not args.only or any(key.lower() in c.label.lower() for key in args.only.split(","))]


def memory_model(model_name: str, args: argparse.Namespace, device: torch.device) -> List[List[str]]:
    """Memory rows: state and peak extra copies of every selected case on one model."""
    model, loss_fn, x, y = probe_workload(device) if model_name == "probe" else workload(model_name, device, args.batch)
    rows = []
    for case in selected(args):
        if case.timing_only:
            continue
        steps = args.ire_steps if case.refreshes else args.steps  # IRE: one curvature refresh inside
        state, peak = peak_extra_copies(case, model, loss_fn, x, y, device, max(1, args.warmup), steps)
        verdict = "—"
        if case.target_memory is not None:
            verdict = "PASS" if (peak if peak is not None else state) <= case.target_memory else "FAIL"
        rows.append(
            [
                model_name,
                case.label,
                f"{state:.2f}",
                "n/a" if peak is None else f"{peak:.2f}",
                f"≤ {case.target_memory:g}" if case.target_memory is not None else "—",
                verdict,
            ]
        )
        print("  " + " | ".join(rows[-1]), flush=True)
    return rows


def memory_rows_in_child(args: argparse.Namespace) -> List[List[str]]:
    """The CPU memory rows, measured by this script run again with ``--memory-only`` in a fresh process.

    The peak RSS counts a tensor only when its allocation maps new pages. After the timing runs, glibc's
    heap holds large free chunks, and malloc serves a request from a free chunk before it maps anything
    (whatever the mmap threshold), so in the same process the figures would depend on what ran before:
    SGD-IRE's peak read 3.50 there, against 3.53 in a fresh process.

    Raises:
        RuntimeError: the child failed (its stderr's tail in the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "memory.json")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--memory-only",
            "--json",
            out,
            "--threads",
            str(torch.get_num_threads()),
            "--warmup",
            str(args.warmup),
            "--steps",
            str(args.steps),
            "--ire-steps",
            str(args.ire_steps),
        ] + (["--only", args.only] if args.only else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the memory measurement's child process failed:\n{done.stderr[-2000:]}")
        with open(out) as f:
            records = json.load(f)["memory"]
    rows = [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.values()] for r in records]
    for r in rows:
        print("  " + " | ".join(r), flush=True)
    return rows


def _number_or_text(cell: str) -> object:
    try:
        return float(cell)
    except ValueError:
        return cell


def print_table(rows: List[List[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def run_model(
    model_name: str, args: argparse.Namespace, device: torch.device, numbers: List[Dict[str, object]]
) -> List[List[str]]:
    """Timing rows (text, as printed) of every selected case on one model; for each row, ``numbers`` gets
    the figures the text rounds or formats: the block ratios on the judged clock, the median's interval
    and its coverage, and the target (``None``: no target)."""
    model, loss_fn, x, y = workload(model_name, device, args.batch)
    rows = []
    for case in selected(args):
        runners = paired_runners(case, model, loss_fn, x, y, device)
        opt_r, base_r = runners
        steps = args.ire_steps if case.refreshes else args.steps
        for r in runners:
            r.steps(args.warmup)
            r.steps(steps)  # probe: how many base steps last as long as one optimizer block
        base_steps = steps * max(1, round(opt_r.wall[-1] / base_r.wall[-1]))
        for r in runners:
            r.wall.clear()
            r.cpu.clear()
        # Paired design: B O B O ... O B; each optimizer block is compared with the mean of the two base
        # blocks around it, so load changes on a shared machine hit both sides of every ratio alike.
        base_r.steps(base_steps)
        for _ in range(args.repeats):
            opt_r.steps(steps)
            base_r.steps(base_steps)

        def paired(clock: str, opt_r=opt_r, base_r=base_r, case=case) -> List[float]:
            o, b = getattr(opt_r, clock), getattr(base_r, clock)
            ratios = [o[k] / (0.5 * (b[k] + b[k + 1])) for k in range(len(o))]
            if args.verbose:
                print(f"    {case.label} {clock}: block ratios " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
            return ratios

        t_opt, t_base = (statistics.median(getattr(r, args.clock)) for r in runners)
        other = "cpu" if args.clock == "wall" else "wall"
        ratios = paired(args.clock)
        ratio, ratio_other = statistics.median(ratios), statistics.median(paired(other))
        lo, hi, coverage = median_interval(ratios)
        verdict = "—"
        if case.target_time is not None:
            verdict = "PASS" if ratio <= case.target_time else "FAIL"
            if lo <= case.target_time < hi:
                verdict += " (within noise)"  # the median's interval contains the target
        rows.append(
            [
                model_name,
                case.label,
                f"{1e3 * t_opt:.1f}",
                f"{1e3 * t_base:.1f}",
                f"{ratio:.3f}",
                f"{lo:.3f}–{hi:.3f} ({100 * coverage:.0f}%)",
                f"{ratio_other:.3f}",
                f"≤ {case.target_time:g}" if case.target_time is not None else "—",
                verdict,
            ]
        )
        numbers.append(
            {
                "block ratios": ratios,
                "interval": [lo, hi],
                "interval coverage": coverage,
                "target ratio": case.target_time,
            }
        )
        print("  " + " | ".join(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="cases (--only matches substrings of these labels, case-insensitively): "
        + "; ".join(c.label for c in CASES),
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--models",
        default="cnn,transformer",
        help="comma-separated: cnn, transformer, mlp (the 3072-512-512-10 MLP whose loss saturates; timing; CPU "
        "memory always uses the probe MLP)",
    )
    ap.add_argument(
        "--batch", type=int, default=64, help="images per batch (the LM uses batch/4 sequences of 64 tokens)"
    )
    ap.add_argument("--steps", type=int, default=3, help="steps per timed block")
    ap.add_argument(
        "--ire-steps",
        type=int,
        default=10,
        help="steps per timed block of the IRE rows (the diagnostic ones included); K is 10 in those cases, so "
        "the default puts one refresh in every block",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=9,
        help="timed optimizer blocks (paired with base blocks); the median is reported",
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each optimizer and its base before timing")
    ap.add_argument("--only", default="", help="comma-separated substrings of the cases to run (e.g. 'TSAM,IRE')")
    ap.add_argument("--verbose", action="store_true", help="print every block's ratio")
    ap.add_argument("--memory-only", action="store_true", help="skip the timing; measure memory only")
    ap.add_argument(
        "--json",
        default="",
        metavar="FILE",
        help="also write the run's settings and every row (time and memory) to FILE as JSON; timing rows add "
        "'block ratios', 'interval', 'interval coverage' and 'target ratio' as numbers",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="clock the targets are judged on; 'cpu' (process CPU time, use with --threads 1) is robust to "
        "other jobs sharing the machine; both ratios are printed",
    )
    args = ap.parse_args()
    # as a trial sets its CPU threads, before any computation (flatlab.train.cpu_threads: subnormals flushed)
    denormals = configure_cpu(args.threads or torch.get_num_threads())
    device = torch.device(args.device)
    other = "cpu" if args.clock == "wall" else "wall"
    header = [
        "model",
        "optimizer / base",
        f"{args.clock} ms/step",
        f"base {args.clock} ms",
        f"ratio ({args.clock})",
        "median's interval",
        f"ratio ({other})",
        "target",
        "result",
    ]
    print(
        f"device={device} threads={torch.get_num_threads()} cpu_denormals={denormals} steps={args.steps} "
        f"ire_steps={args.ire_steps} "
        + ("" if args.memory_only else f"repeats={args.repeats} batch={args.batch} clock={args.clock}")
    )
    rows = [header]
    numbers: List[Dict[str, object]] = []  # per timing row, the unrounded figures for --json
    if not args.memory_only:
        print("  " + " | ".join(header), flush=True)
        for m in args.models.split(","):
            rows += run_model(m.strip(), args, device, numbers)
        print_table(rows)

    # Memory: on CUDA each model's own step (allocator statistics); on CPU the probe MLP (peak RSS).
    mem_models = [m.strip() for m in args.models.split(",")] if device.type == "cuda" else ["probe"]
    exact = device.type == "cuda" or _map_every_allocation()
    mem_header = ["model", "optimizer / base", "state copies", "peak extra copies", "target", "result"]
    print(
        "\nmemory, in parameter copies over the base optimizer ("
        + (
            "CUDA allocator peak"
            if device.type == "cuda"
            else f"CPU peak RSS, MLP with two {PROBE_WIDTH}² weights, batch {PROBE_BATCH}"
        )
        + ("" if exact else "; glibc's mmap threshold could not be fixed, so tensors under 32 MB may be over-counted")
        + "):"
    )
    print("  " + " | ".join(mem_header), flush=True)
    mem_rows = [mem_header]
    if device.type == "cpu" and not args.memory_only:
        mem_rows += memory_rows_in_child(args)
    else:
        for m in mem_models:
            mem_rows += memory_model(m, args, device)
    print_table(mem_rows)

    if args.json:

        def records(table: List[List[str]]) -> List[Dict[str, object]]:
            return [{k: _number_or_text(v) for k, v in zip(table[0], r)} for r in table[1:]]

        settings = {**vars(args), "threads": torch.get_num_threads(), "torch": torch.__version__}  # threads in use
        with open(args.json, "w") as f:
            timing = [{**record, **extra} for record, extra in zip(records(rows), numbers)]
            json.dump(
                {"settings": settings, "time": timing, "memory": records(mem_rows)}, f, indent=1, ensure_ascii=False
            )
    judged = rows[1:] + mem_rows[1:]
    fails = sum(r[-1].startswith("FAIL") for r in judged)
    noisy = sum(r[-1].endswith("(within noise)") for r in rows[1:])
    how = "" if args.memory_only else " (time: by the median ratio)"
    targets = sum(r[-1] != "—" for r in judged)
    verdict = (
        "no target among the cases run"
        if not targets
        else "all targets met"
        if not fails
        else f"{fails} target(s) missed"
    )
    print(f"\n{verdict}{how}")
    if noisy:
        print(
            f"{noisy} time verdict(s) within noise: the distribution-free interval of the median block ratio "
            "contains the target, so another run may give the other verdict"
        )


if __name__ == "__main__":
    main()
