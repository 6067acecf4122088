"""Public search-space primitives for study files: ``from flatlab import space as sp``.

``sp.loguniform(1e-3, 1)``, ``sp.uniform(0, 0.99)``, ``sp.int(1, 8)``, ``sp.choice([3, 5])``,
``sp.fixed(0.9)`` (or the plain value), ``sp.grid([0.05, 0.1, 0.2])`` and conditional fields
``**sp.when("schedule", "step", {"step_epochs": sp.int(5, 30)})``.
"""

from flatlab.study.space import Choice, Conditional, Dim, Fixed, Float, Int, choice, fixed, grid, loguniform, uniform, when
from flatlab.study.space import integer as int  # noqa: A001  (the documented name; nothing else here uses int)

__all__ = ["Dim", "Float", "Int", "Choice", "Fixed", "Conditional", "loguniform", "uniform", "int", "choice", "fixed",
           "grid", "when"]
