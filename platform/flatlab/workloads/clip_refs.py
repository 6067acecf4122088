"""Kept for study files that import ``cache_root`` from here (``studies/rft_clip.py`` did): it lives in
:mod:`flatlab.cache`. Fine-tuned checkpoint references moved out of the workloads: ``mlflow:`` references
are resolved at launch by :mod:`flatlab.study.chain`, and ``run:`` checkpoints fetched by
:mod:`flatlab.tracking.checkpoints`.
"""

from flatlab.cache import cache_root

__all__ = ["cache_root"]
