"""Studies: definitions, search spaces, loading/validation, searchers, the trainable and the runner."""

from flatlab.study.spec import Arm, Resources, Study

__all__ = ["Arm", "Resources", "Study"]
