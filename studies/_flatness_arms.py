"""The eight arms of the flatness comparison, shared by ``digits_flatness.py`` and ``fmnist_flatness.py``.

Not a study file (``flatlab studies`` skips names that start with ``_``); each study file imports
:func:`flatness_arms` from here, as it would any module next to it, and passes its own learning-rate
ranges, the only part of the arms that differs between the workloads.

From the papers: the optimizers (SAM, Foret et al. 2021; ASAM, Kwon et al. 2021; TSAM's released
procedure with s = 3 samples and its grid of t; IRE's SGD, SAM and AdamW variants with the mask
refreshed every K = 10 steps), SGD momentum 0.9 and weight decay 5e-4 (both papers' CNN recipes).
Ours: the ranges of rho, kappa and gamma, the AdamW weight decay range, and IRE switching on at
(0-based) epoch 2.
"""

from __future__ import annotations

from typing import Any, Dict

from flatlab import Arm
from flatlab import space as sp

RHO = {"rho": sp.loguniform(0.01, 0.3)}
IRE = {"kappa": sp.uniform(0.5, 5.0), "gamma": sp.uniform(0.5, 0.95), "mask_interval": 10, "switch_epoch": 2}


def flatness_arms(lr_sgd: Any, lr_adamw: Any) -> Dict[str, Arm]:
    """The arms ``sgd``, ``sam``, ``asam``, ``tsam``, ``sgd_ire``, ``sam_ire``, ``adamw`` and ``adamw_ire``
    (in that order), searching ``lr_sgd`` for the SGD-based arms and ``lr_adamw`` for the AdamW-based
    ones (``flatlab.space`` dimensions)."""
    sgd = {"lr": lr_sgd, "momentum": 0.9, "weight_decay": 5e-4}
    adamw = {"lr": lr_adamw, "weight_decay": sp.loguniform(1e-4, 1e-1)}
    return {
        "sgd": Arm("sgd", space=sgd),
        "sam": Arm("sam", space={**sgd, **RHO}),
        "asam": Arm("asam", space={**sgd, "rho": sp.loguniform(0.1, 2.0)}),
        "tsam": Arm("tsam", space={**sgd, **RHO, "t": sp.choice([0.0, 1.0, 5.0, 20.0]), "s": 3}),
        "sgd_ire": Arm("sgd_ire", space={**sgd, **IRE}),
        "sam_ire": Arm("sam_ire", space={**sgd, **RHO, **IRE}),
        "adamw": Arm("adamw", space=adamw),
        "adamw_ire": Arm("adamw_ire", space={**adamw, "beta2": 0.999, **IRE}),
    }
