"""Step time over a long run: does any optimizer's step slow down as training goes on?

Every registered optimizer (its registered defaults) and, for the AdmIRE/AdamW figure, AdamW with
AdmIRE's base settings (betas (0.9, 0.95), weight decay 0.1) and AdmIRE computed as the authors' released
code computes it (:class:`AuthorsAdmIRE`, a timing anchor over that same base) are stepped on each model of
bench/optimizer_overhead.py (the CNN, the one-block transformer, and the 3072-512-512-10 MLP whose loss
saturates on its fixed batch, where subnormal gradients appear after a few dozen steps: issue 26),
each on its own copy of the same initial weights, through the trainer's closure. After ``--warmup``
untimed steps, every step is timed; the steps form blocks of ``--block``. The optimizers run round-robin,
one block each in turn, so a change of load on a shared machine falls on all of them alike; each draws
from its own RNG stream, so its run is the one it would have alone.

Per optimizer: the mean step time of the first and the last block, their ratio (last / first; also the
ratio of the blocks' medians, which leaves out IRE's refresh steps), flagged "SLOWS DOWN" above
``--limit`` (1.3), and the subnormal entries left in its state (wrappers and bases) and in the
parameters at the end. Per model: AdmIRE / AdamW, the median over blocks of the ratio of AdmIRE's block
mean to its base's in the same round, and the same ratio for the authors' procedure; with both the MLP
and the CNN, the MLP's AdmIRE / AdamW over the CNN's, against issue 26's target of at most 1.10. With
the defaults (warm-up 10, blocks of 20) every block holds two of IRE's curvature refreshes (K = 10).

The CPU threads are set as a trial sets them (:func:`flatlab.train.cpu_threads.configure`: subnormals
flushed to zero unless ``--keep-denormals``; the mode is printed on the first line).

    python bench/optimizer_longrun.py --threads 1 --clock cpu      # a machine shared with other jobs
    python bench/optimizer_longrun.py --models mlp --only adamw     # names containing 'adamw'
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

from flatlab.optim import OPTIMIZERS, get_optimizer
from flatlab.train.cpu_threads import configure as configure_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import optimizer_overhead as ob  # noqa: E402  (a sibling script, not a package: its models, runner, table)

SLOWDOWN_LIMIT = 1.3
# issue 26's target: AdmIRE / AdamW on the MLP at most this multiple of its value on the CNN
MLP_OVER_CNN_LIMIT = 1.10
AUTHORS = "adamw_ire (authors' procedure)"
# (label, runner, the runner it is divided by): the wrapper against its base built with the same settings,
# and the authors' procedure (:class:`AuthorsAdmIRE`) against the same base
PAIRS = (
    ("AdmIRE / AdamW", "adamw_ire", "adamw (AdmIRE's base)"),
    ("authors' AdmIRE / AdamW", AUTHORS, "adamw (AdmIRE's base)"),
)


class AuthorsAdmIRE:
    """Timing anchor: AdmIRE's step computed the way the IRE authors' released AdmIRE computes it.

    The authors' ``AdamWIRE_PARAMS`` (IRE-algorithm-framework, ``NLP/LLM/adam.py``; Wang et al., NeurIPS
    2024): every step a fresh clone of each parameter, the base AdamW step, then per tensor the difference
    ``θ_new − θ_old``, times the float32 mask, times κ, added to ``θ_new`` (each a new tensor); every K steps
    the curvature ``h = β·h + (1 − β)·g²`` of the sampled-label gradient, one ``torch.topk`` over all of
    h concatenated for the threshold, and float32 masks ``h ≤ threshold``. The sampled-label gradient comes
    from the same closure pass as flatlab's (the authors run a separate pass), so the anchor is, if
    anything, cheaper than the released code. Same κ, γ, K and β as flatlab's defaults; only time is
    compared (the mask marks one or two more coordinates than flatlab's ⌊γ·p⌋, as their top-k does).
    """

    def __init__(
        self, base: torch.optim.Optimizer, kappa: float, gamma: float, mask_interval: int, beta: float
    ) -> None:
        self.base, self.kappa, self.gamma, self.mask_interval, self.beta = base, kappa, gamma, mask_interval, beta
        self.state: Dict[torch.Tensor, Dict[str, torch.Tensor]] = {}
        self.since_refresh = None

    @torch.no_grad()
    def _refresh(self, params: Sequence[torch.Tensor], sampled: Sequence[torch.Tensor]) -> None:
        for p, g in zip(params, sampled):
            old = self.state.setdefault(p, {}).get("fisher", torch.zeros_like(p))
            self.state[p]["fisher"] = self.beta * old + (1 - self.beta) * torch.square(g)
        h = torch.cat([torch.flatten(self.state[p]["fisher"]) for p in params])
        rank = float(
            f"{1 - self.gamma:.12g}"
        )  # their "rank", 1 − γ as a script writes it (0.2, not 0.19999999999999996)
        keep = int(h.numel() * rank)  # rank < 0.5: the ``keep`` largest h are sharp
        threshold = torch.topk(h, keep, largest=True).values[-1]
        for p in params:
            self.state[p]["mask"] = (self.state[p]["fisher"] <= threshold).float()

    def step(self, closure) -> torch.Tensor:
        params = [p for g in self.base.param_groups for p in g["params"]]
        if self.since_refresh is None or self.since_refresh >= self.mask_interval:
            loss, sampled = closure.with_sampled_grads(params)
            self._refresh(params, sampled)
            self.since_refresh = 0
        else:
            loss = closure()
        with torch.no_grad():
            last = [p.clone() for p in params]
            self.base.step()
            for p, old in zip(params, last):
                p.copy_(p + (p - old) * self.state[p]["mask"] * self.kappa)
        self.since_refresh += 1
        return loss


# ------------------------------------------------------------------------------------------ arithmetic
def blocks(per_step: Sequence[float], block: int) -> List[List[float]]:
    """Consecutive blocks of ``block`` per-step times; an incomplete last block is dropped."""
    return [list(per_step[i : i + block]) for i in range(0, len(per_step) - block + 1, block)]


def block_means(per_step: Sequence[float], block: int) -> List[float]:
    """Mean step time of each block (every step counts, IRE's refresh steps included)."""
    return [statistics.fmean(b) for b in blocks(per_step, block)]


def block_medians(per_step: Sequence[float], block: int) -> List[float]:
    """Median step time of each block (a few slow steps per block, such as refreshes, do not count)."""
    return [statistics.median(b) for b in blocks(per_step, block)]


def drift(per_block: Sequence[float]) -> float:
    """Last block's step time over the first block's."""
    return per_block[-1] / per_block[0]


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median over blocks of ``numerator[i] / denominator[i]`` (blocks of one round run back to back)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def subnormal_count(t: torch.Tensor) -> int:
    """Entries of a floating-point tensor that are finite, non-zero and below its smallest normal number."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0
    return int((torch.isfinite(t) & (t.abs() < torch.finfo(t.dtype).tiny) & (t != 0)).sum())


def subnormals_kept(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> int:
    """Subnormal entries in ``opt``'s state (its bases' included, for wrappers) and in ``params``."""
    n = sum(subnormal_count(p.detach()) for p in params)
    while opt is not None:
        n += sum(subnormal_count(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
        opt = getattr(opt, "base", None)
    return n


def summarize(times: Dict[str, List[float]], block: int, limit: float = SLOWDOWN_LIMIT) -> List[Dict[str, object]]:
    """One record per runner from its per-step times (seconds): first and last block means (ms), their
    ratio, the blocks' median ratio, and the flag (ratio of means above ``limit``)."""
    rows = []
    for name, per_step in times.items():
        means, medians = block_means(per_step, block), block_medians(per_step, block)
        ratio = drift(means)
        rows.append(
            {
                "optimizer": name,
                "blocks": len(means),
                "first block ms": 1e3 * means[0],
                "last block ms": 1e3 * means[-1],
                "last / first": ratio,
                "last / first (medians)": drift(medians),
                "slows down": ratio > limit,
            }
        )
    return rows


def pair_ratios(times: Dict[str, List[float]], block: int) -> Dict[str, Tuple[float, float, float]]:
    """``{label: (median over blocks, first block, last block)}`` of each pair of :data:`PAIRS` present."""
    out = {}
    for label, name, base in PAIRS:
        if name in times and base in times:
            a, b = block_means(times[name], block), block_means(times[base], block)
            out[label] = (paired_ratio(a, b), a[0] / b[0], a[-1] / b[-1])
    return out


# ------------------------------------------------------------------------------------------ the run
def mlp_over_cnn(
    pairs_by_model: Dict[str, Dict[str, Tuple[float, float, float]]], limit: float = MLP_OVER_CNN_LIMIT
) -> str:
    """One line: AdmIRE / AdamW on the MLP over its value on the CNN (medians over paired blocks, from
    :func:`pair_ratios`), against ``limit`` (issue 26); empty unless both models ran AdmIRE."""
    label = PAIRS[0][0]
    if label not in pairs_by_model.get("mlp", {}) or label not in pairs_by_model.get("cnn", {}):
        return ""
    mlp, cnn = pairs_by_model["mlp"][label][0], pairs_by_model["cnn"][label][0]
    verdict = "met" if mlp <= limit * cnn else "NOT met"
    return (
        f"{label}: mlp {mlp:.3f} / cnn {cnn:.3f} = {mlp / cnn:.3f} (target: at most {limit:.2f}, "
        f"i.e. mlp <= {limit * cnn:.3f}): {verdict}"
    )


def rng_state(device: torch.device) -> Tuple[torch.Tensor, ...]:
    """The global torch RNG state (CPU, and the device's on CUDA)."""
    return (torch.get_rng_state(),) + ((torch.cuda.get_rng_state(device),) if device.type == "cuda" else ())


def set_rng_state(state: Tuple[torch.Tensor, ...], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state[1], device)


def runners(model_name: str, names: Sequence[str], device: torch.device, batch: int) -> Dict[str, "ob.Runner"]:
    """One runner per optimizer name (registered defaults) on its own copy of the model's initial weights,
    plus AdmIRE's base with AdmIRE's settings when ``adamw_ire`` is among them."""
    model, loss_fn, x, y = ob.workload(model_name, device, batch)
    out = {}
    for name in names:
        if name == "adamw_ire":
            opt_model, base_model = copy.deepcopy(model), copy.deepcopy(model)
            opt, base = ob.build(name, {}, opt_model, base_model)  # the base with the wrapper's settings
            out[name] = ob.Runner(opt, opt_model, loss_fn, x, y, device)
            out[PAIRS[0][2]] = ob.Runner(base, base_model, loss_fn, x, y, device)
            authors_model = copy.deepcopy(model)
            authors_base = ob.build(name, {}, copy.deepcopy(model), authors_model)[1]
            anchor = AuthorsAdmIRE(authors_base, opt.kappa, opt.gamma, opt.mask_interval, opt.curvature_beta)
            out[AUTHORS] = ob.Runner(anchor, authors_model, loss_fn, x, y, device)  # type: ignore[arg-type]
            continue
        m = copy.deepcopy(model)
        out[name] = ob.Runner(get_optimizer(name).create(m.named_parameters()), m, loss_fn, x, y, device)
    return out


def run_model(
    model_name: str, args: argparse.Namespace, device: torch.device
) -> Tuple[List[Dict[str, object]], Dict[str, Tuple[float, float, float]]]:
    """The selected optimizers on one model, round-robin: (:func:`summarize`'s rows with each one's
    subnormals kept, :func:`pair_ratios`)."""
    names = [n for n in OPTIMIZERS.names() if not args.only or any(k in n for k in args.only.split(","))]
    rs = runners(model_name, names, device, args.batch)
    # each runner draws from its own RNG stream (sampled labels, TSAM's noise), as if it ran alone: its
    # trajectory does not depend on which others run, nor in which order
    streams = {name: rng_state(device) for name in rs}

    def advance(name: str, steps: int) -> None:  # each step timed on its own
        set_rng_state(streams[name], device)
        for _ in range(steps):
            rs[name].steps(1)
        streams[name] = rng_state(device)

    for name, r in rs.items():
        advance(name, args.warmup)
        r.wall.clear()
        r.cpu.clear()
    for _ in range(args.steps // args.block):  # round-robin, one block each
        for name in rs:
            advance(name, args.block)
    times = {name: getattr(r, args.clock) for name, r in rs.items()}
    rows = summarize(times, args.block, args.limit)
    for row, r in zip(rows, rs.values()):
        row["subnormals kept"] = subnormals_kept(r.opt, list(r.model.parameters()))
    return rows, pair_ratios(times, args.block)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", default=",".join(ob.WORKLOADS), help=f"comma-separated, of: {', '.join(ob.WORKLOADS)}")
    ap.add_argument(
        "--batch", type=int, default=64, help="examples per batch (the LM uses batch/4 sequences of 64 tokens)"
    )
    ap.add_argument("--steps", type=int, default=200, help="timed steps per optimizer (a multiple of --block)")
    ap.add_argument("--block", type=int, default=20, help="steps per block")
    ap.add_argument(
        "--warmup", type=int, default=10, help="untimed steps first (10: every block then holds two IRE refreshes)"
    )
    ap.add_argument("--limit", type=float, default=SLOWDOWN_LIMIT, help="flag a last/first block ratio above this")
    ap.add_argument("--only", default="", help="comma-separated substrings of the optimizer names to run")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="'cpu' (process CPU time, with --threads 1) resists other jobs",
    )
    ap.add_argument("--json", default="", metavar="FILE", help="also write the settings and every row to FILE as JSON")
    ap.add_argument(
        "--keep-denormals",
        action="store_true",
        help="keep IEEE subnormal floats on the CPU (a trial flushes them unless Resources(flush_denormal=False))",
    )
    args = ap.parse_args()
    if args.steps < 2 * args.block or args.steps % args.block:
        ap.error(f"--steps must be a multiple of --block ({args.block}) holding at least two blocks, got {args.steps}")
    # as a trial sets its CPU threads, before any computation (flatlab.train.cpu_threads)
    denormals = configure_cpu(args.threads or torch.get_num_threads(), flush_denormal=not args.keep_denormals)
    device = torch.device(args.device)
    print(
        f"device={device} threads={torch.get_num_threads()} cpu_denormals={denormals} steps={args.steps} "
        f"block={args.block} "
        f"warmup={args.warmup} batch={args.batch} clock={args.clock}"
    )
    header = ["model", "optimizer", f"first block ms ({args.clock})", "last block ms", "last / first", "(medians)"]
    header += ["subnormals kept", "result"]
    table = [header]
    per_model: Dict[str, object] = {}
    flagged = 0
    pairs_by_model = {}
    for m in (s.strip() for s in args.models.split(",")):
        rows, pairs = run_model(m, args, device)
        pairs_by_model[m] = pairs
        per_model[m] = {"rows": rows, "pairs": {k: dict(zip(("median", "first", "last"), v)) for k, v in pairs.items()}}
        for r in rows:
            flagged += bool(r["slows down"])
            table.append(
                [
                    m,
                    str(r["optimizer"]),
                    f"{r['first block ms']:.1f}",
                    f"{r['last block ms']:.1f}",
                    f"{r['last / first']:.2f}",
                    f"{r['last / first (medians)']:.2f}",
                    str(r["subnormals kept"]),
                    "SLOWS DOWN" if r["slows down"] else "ok",
                ]
            )
            print("  " + " | ".join(table[-1]), flush=True)
    ob.print_table(table)
    print()
    for m, pairs in pairs_by_model.items():
        for label, (med, first, last) in pairs.items():
            print(f"{m}: {label} = {med:.3f} (median over paired blocks; first block {first:.3f}, last {last:.3f})")
    verdict = mlp_over_cnn(pairs_by_model)
    if verdict:
        print(verdict)
    if args.json:
        settings = {
            **vars(args),
            "threads": torch.get_num_threads(),
            "cpu_denormals": denormals,
            "torch": torch.__version__,
        }
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "models": per_model}, f, indent=1, ensure_ascii=False)
    how = f"by more than {args.limit:g}× from the first block to the last"
    print(f"\n{flagged} optimizer run(s) slow down {how}" if flagged else f"\nno optimizer's step slows down {how}")


if __name__ == "__main__":
    main()
