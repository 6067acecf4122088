"""What a trial spends: passes over mini-batches, examples and seconds, counted as it trains.

A *pass* is one forward and backward over one mini-batch, one gradient evaluation. Each optimizer
declares what its steps spend (``step_passes``, read by :func:`flatlab.optim.protocol.passes_of`: SAM
2, TSAM 2s, IRE one more backward at each mask refresh) and :class:`ComputeCounter` adds them up, with
the examples the steps consumed and the seconds spent training, evaluating and measuring. Forward-only
work (evaluation, the flatness measures) is counted apart and never against a pass budget.

The counts are logged as cumulative MLflow metrics with step = epoch under :data:`PREFIX`
(:meth:`ComputeCounter.metrics`), and the final model's report adds their totals
(:data:`TOTAL_PREFIX`, MLflow summary values at step 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Callable, Dict, Mapping, Optional

PREFIX = "compute/"
TOTAL_PREFIX = "compute_total/"


@dataclass
class ComputeCounter:
    """Cumulative compute of one trial (part of the trainer's state, so a resumed trial goes on counting).

    Attributes:
        forward, backward: passes over training mini-batches, as the optimizer declared them; ``backward``
            is the number of gradient evaluations (``compute/passes``).
        examples: training examples the steps consumed (mini-batch rows, once per step whatever its passes).
        eval_examples: examples run forward-only by evaluation (every eval split each epoch, the test split).
        train_s, eval_s, measure_s: wall-clock seconds training (the optimizer steps and their data),
            evaluating and running the flatness measures.
    """

    forward: int = 0
    backward: int = 0
    examples: int = 0
    eval_examples: int = 0
    train_s: float = 0.0
    eval_s: float = 0.0
    measure_s: float = 0.0

    def add_step(self, forward: int, backward: int, examples: int) -> None:
        """One optimizer step that spent ``forward``/``backward`` passes over ``examples`` rows."""
        self.forward += forward
        self.backward += backward
        self.examples += examples

    @property
    def passes(self) -> int:
        """Gradient evaluations over mini-batches (backward passes): the unit of a pass budget."""
        return self.backward

    def metrics(self, prefix: str = PREFIX) -> Dict[str, float]:
        """``compute/forward``, ``compute/backward``, ``compute/passes``, ``compute/examples``,
        ``compute/eval_examples``, ``compute/train_s``, ``compute/eval_s``, ``compute/measure_s`` (cumulative)."""
        out = {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}
        out[f"{prefix}passes"] = float(self.passes)
        return out

    def state_dict(self) -> Dict[str, float]:
        return asdict(self)

    def load_state_dict(self, state: Optional[Mapping[str, float]]) -> None:
        """Restore :meth:`state_dict`'s values; ``None`` (a checkpoint from before the count) starts at 0."""
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))((state or {}).get(f.name, 0)))


def steps_within(passes: int, cost: Callable[[int], int], limit: int = 10**9) -> int:
    """The most steps whose passes fit in ``passes``: the largest n with Σ_{i<n} cost(i) <= ``passes``.

    Args:
        passes: the budget, gradient evaluations over mini-batches (>= 0).
        cost: the passes (backward) that step i (0-based) spends, >= 1.
        limit: the most steps counted (a guard against a cost that rounds to nothing).
    Returns:
        The step count n (0 when even the first step does not fit).
    """
    spent, n = 0, 0
    while n < limit:
        spent += cost(n)
        if spent > passes:
            return n
        n += 1
    return n
