"""Public search-space primitives for study files: ``from flatlab import space as sp``.

``sp.loguniform(1e-3, 1)``, ``sp.uniform(0, 0.99)``, ``sp.int(1, 8)``, ``sp.choice([3, 5])``,
``sp.fixed(0.9)`` (or the plain value), ``sp.grid([0.05, 0.1, 0.2])``, conditional fields
``**sp.when("schedule", "step", {"step_epochs": sp.int(5, 30)})`` and
``sp.best_of("tsam_table1_cifar100", arm="tsam", param="lr")`` (chained studies: another study's best
value, resolved when the study is launched; see ``flatlab.study.chain``).
"""

from flatlab.study.space import (
    BestOf,
    Choice,
    Conditional,
    Dim,
    Fixed,
    Float,
    Int,
    best_of,
    choice,
    fixed,
    grid,
    loguniform,
    uniform,
    when,
)
from flatlab.study.space import integer as int  # noqa: A001  (the documented name; nothing else here uses int)

__all__ = [
    "Dim",
    "Float",
    "Int",
    "Choice",
    "Fixed",
    "Conditional",
    "BestOf",
    "loguniform",
    "uniform",
    "int",
    "choice",
    "fixed",
    "grid",
    "when",
    "best_of",
]
