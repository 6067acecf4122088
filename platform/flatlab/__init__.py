"""flatlab: Ray-distributed hyperparameter studies of sharpness-aware and flat-minima training."""

from flatlab.telemetry import disable_reporting

disable_reporting()  # before Ray or MLflow is imported: nothing of a local study is reported out

from flatlab._version import __version__  # noqa: E402
from flatlab.analysis.curve_sets import Published  # noqa: E402
from flatlab.study.budget import Budget  # noqa: E402
from flatlab.study.spec import Arm, Resources, Study  # noqa: E402

__all__ = ["Arm", "Budget", "Published", "Resources", "Study", "results", "run", "__version__"]


def __getattr__(name: str):
    """``flatlab.run`` and ``flatlab.results`` (:mod:`flatlab.api`), imported on first use so that
    ``import flatlab`` loads neither Ray, MLflow nor pandas."""
    if name in ("run", "results"):
        from flatlab import api

        return getattr(api, name)
    raise AttributeError(f"module 'flatlab' has no attribute {name!r}")
