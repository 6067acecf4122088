"""flatlab: Ray-distributed hyperparameter studies of sharpness-aware and flat-minima training."""

__version__ = "0.1.0"

from flatlab.study.spec import Arm, Resources, Study  # noqa: E402

__all__ = ["Arm", "Resources", "Study", "__version__"]
