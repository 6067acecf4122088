"""Public search-space primitives for study files: ``from flatlab import space as sp``.

``sp.loguniform(1e-3, 1)``, ``sp.uniform(0, 0.99)``, ``sp.int(1, 8)``, ``sp.choice([3, 5])``,
``sp.fixed(0.9)`` (or the plain value) and ``sp.grid([0.05, 0.1, 0.2])``.
"""

from flatlab.study.space import Choice, Dim, Fixed, Float, Int, choice, fixed, grid, loguniform, uniform
from flatlab.study.space import integer as int  # noqa: A001  (the documented name; nothing else here uses int)

__all__ = ["Dim", "Float", "Int", "Choice", "Fixed", "loguniform", "uniform", "int", "choice", "fixed", "grid"]
