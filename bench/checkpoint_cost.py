"""What a Tune round trip and a trial checkpoint cost, from trials whose epochs do almost nothing.

`bench/platform_overhead.py` measures the platform's cost per epoch against a sequential loop; on a
noisy 2-core machine its figure moves by about a millisecond per epoch with the machine's load. This
script measures the two costs behind its `--checkpoint-every` figure directly, with epochs of a few
milliseconds (digits, an MLP of width 8, the whole training split as one batch), so that the platform's
work is most of the time measured. Three launches of the same N trials, one at a time:

- `batched`: flatlab's defaults (reports travel to the driver in batches of up to 1 s; one checkpoint
  per 10 s and one at the end);
- `unbatched`: the same with `FLATLAB_RESULT_BUFFER_S=0`, one driver <-> worker round trip per epoch;
- `every-10`: `checkpoint_every=10`.

Each runs `--rounds` times, the order reversed every other round (so that a steadily drifting load
cancels), and the time in Tune (`starting Tune` to `Tune done` in the study's log) gives:

    ms per round trip  = (unbatched - batched) / (N * epochs)
    ms per checkpoint  = (every-10 - batched) / (N * epochs / 10)

A checkpoint takes three round trips in Ray 2.60 (the batch before it, the report that carries it,
Tune's `save`; see `flatlab.study.trainable.make_trainable`) plus the copy of the trial's state in
memory (on its training thread), writing it and Tune's copy into its storage (in its reporting thread),
and Tune's bookkeeping on the driver (registering the checkpoint, deleting the oldest beyond
`KEEP_CHECKPOINTS`, an experiment-state snapshot every `KEEP_CHECKPOINTS` checkpoints). What
`checkpoint_every=10` adds per epoch is the checkpoint's cost / 10, whatever the epoch computes.

    python bench/checkpoint_cost.py [--trials 4] [--epochs 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from platform_overhead import run_flatlab, tune_span  # noqa: E402  (a sibling script, not a package)

STUDY = """
from flatlab import Arm, Resources, Study
from flatlab import space as sp

STUDIES = [Study(
    name="bench_checkpoint_cost",
    workload="digits",
    workload_params={{"model": "mlp", "width": 8}},
    arms=(Arm("sgd", space={{"lr": sp.grid({lrs}), "momentum": 0.9}}),),
    train={{"batch_size": 4096}},
    searcher="grid",
    scheduler="fifo",
    max_epochs={epochs},
    max_concurrent=1,
    resources=Resources(cpu=1),
    checkpoint_every={checkpoint_every},
)]
"""

#: The checkpoint interval (epochs) of the ``every-10`` launch.
EVERY = 10

#: name -> (the study's checkpoint_every, extra environment of the launch)
VARIANTS: Dict[str, tuple] = {
    "batched": (None, {}),
    "unbatched": (None, {"FLATLAB_RESULT_BUFFER_S": "0"}),
    "every-10": (EVERY, {}),
}


def order(round_index: int) -> List[str]:
    """The launches of round ``round_index`` (0-based): the variants in order, reversed every other round."""
    names = list(VARIANTS)
    return names if round_index % 2 == 0 else names[::-1]


def costs(spans: Dict[str, float], trials: int, epochs: int) -> Dict[str, float]:
    """Milliseconds per round trip and per checkpoint from one round's seconds in Tune per variant.

    Args:
        spans: variant name (:data:`VARIANTS`) -> seconds between ``starting Tune`` and ``Tune done``.
        trials, epochs: the launch's trials and epochs per trial (checkpoints: ``epochs // EVERY`` per
            trial in ``every-10``).
    """
    n_epochs = trials * epochs
    return {
        "round_trip_ms": (spans["unbatched"] - spans["batched"]) / n_epochs * 1e3,
        "checkpoint_ms": (spans["every-10"] - spans["batched"]) / (trials * (epochs // EVERY)) * 1e3,
    }


def launch(tmp: Path, name: str, lrs: Sequence[float], epochs: int, index: int) -> float:
    """Seconds in Tune of one launch of variant ``name``."""
    every, env = VARIANTS[name]
    study = tmp / f"{name}.py"
    study.write_text(textwrap.dedent(STUDY.format(lrs=list(lrs), epochs=epochs, checkpoint_every=every)))
    root = tmp / f"root-{name}-{index}"
    run_flatlab(study, root, env)
    return tune_span((root / "bench_checkpoint_cost" / "logs" / "flatlab.log").read_text())


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1000, help=f"epochs per trial (a multiple of {EVERY})")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    if args.trials < 1 or args.rounds < 1 or args.epochs < EVERY or args.epochs % EVERY:
        ap.error(f"--trials and --rounds must be >= 1, --epochs a multiple of {EVERY}")
    lrs = [round(0.02 + 0.005 * i, 4) for i in range(args.trials)]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            spans = {name: launch(Path(tmp), name, lrs, args.epochs, r) for name in order(r)}
            rounds.append((spans, costs(spans, args.trials, args.epochs)))
    print(
        f"trials: {args.trials} x {args.epochs} epochs (digits mlp width 8, one batch per epoch), one at a time; "
        f"{args.rounds} rounds, the order reversed every other round"
    )
    for r, (spans, c) in enumerate(rounds, 1):
        print(
            f"round {r}: time in Tune "
            + ", ".join(f"{k} {v:.1f} s" for k, v in spans.items())
            + f"   -> {c['round_trip_ms']:.2f} ms per round trip, {c['checkpoint_ms']:.1f} ms per checkpoint"
        )
    trip = statistics.median(c["round_trip_ms"] for _, c in rounds)
    ckpt = statistics.median(c["checkpoint_ms"] for _, c in rounds)
    batched_ms = statistics.median(s["batched"] for s, _ in rounds) / (args.trials * args.epochs) * 1e3
    print(
        f"median: {trip:.2f} ms per round trip, {ckpt:.1f} ms per checkpoint "
        f"(three round trips make {3 * trip:.1f} ms of it); an epoch here takes {batched_ms:.2f} ms in all"
    )
    print(
        f"checkpoint_every={EVERY} therefore adds {ckpt / EVERY:.2f} ms per epoch to the batched per-epoch cost, "
        f"whatever the epoch computes"
    )


if __name__ == "__main__":
    main()
