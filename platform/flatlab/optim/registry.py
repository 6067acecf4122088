"""Optimizer registry: name -> :class:`OptimizerSpec` (hyperparameters + builder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

import torch

from flatlab.hparams import HParam, resolve
from flatlab.registry import Registry

Builder = Callable[..., torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    """A registered optimizer.

    Attributes:
        name: registry name used in studies (``sgd``, ``sam``, ``tsam``, ``sgd_ire`` ...).
        hparams: declared hyperparameters (``lr`` included), with defaults and allowed ranges.
        build: ``build(params, **hparams) -> torch.optim.Optimizer``; ``params`` is what
            ``torch.optim.Optimizer`` accepts: an iterable of tensors, of ``(name, tensor)`` pairs
            (``model.named_parameters()``; torch keeps the names as ``group['param_names']``, which
            ASAM's official scope reads), or of param-group dicts holding either. Builders hand
            ``params`` to a torch optimizer and wrappers share its groups, so names reach every level.
        doc: one line, with the source paper.
        base: name of the base optimizer this one modifies (``None`` for a base optimizer); the
            benchmarks compare against it.
    """

    name: str
    hparams: Tuple[HParam, ...]
    build: Builder
    doc: str = ""
    base: Optional[str] = None

    def resolve(self, given: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
        """Defaults filled in and values validated; raises ``ConfigError`` naming the bad field."""
        return resolve(self.hparams, given, where or f"optimizer {self.name!r}")

    def create(self, params: Iterable[Any], **hparams: Any) -> torch.optim.Optimizer:
        """Validate ``hparams`` and build the optimizer over ``params``.

        Args:
            params: ``model.named_parameters()`` (preferred: the trainer passes it, and ASAM's default
                scope needs the names), ``model.parameters()``, or param-group dicts of either.
        Raises:
            ConfigError: a hyperparameter outside its range or unknown.
        """
        return self.build(params, **self.resolve(hparams))


#: Each module registers its own optimizers where it defines them (:mod:`flatlab.registry`).
OPTIMIZERS: Registry[OptimizerSpec] = Registry(
    "optimizer",
    modules=(
        "flatlab.optim.basic",
        "flatlab.optim.sam",
        "flatlab.optim.sam_variants",
        "flatlab.optim.tsam",
        "flatlab.optim.ire",
    ),
)


def register_optimizer(
    spec: Optional[OptimizerSpec] = None,
    *,
    name: str = "",
    hparams: Iterable[HParam] = (),
    doc: str = "",
    base: Optional[str] = None,
) -> Any:
    """Add an optimizer to :data:`OPTIMIZERS`: ``register_optimizer(OptimizerSpec(...))`` returns the
    spec; as a decorator of a builder function, ``@register_optimizer(name="lion", hparams=common(...),
    doc="...")`` registers ``OptimizerSpec(name, hparams, build=<the function>, doc, base)`` and returns
    the function. ``hparams`` must declare ``lr`` and ``weight_decay`` (:func:`common` gives both).

    Raises:
        ValueError: the name is taken by a different definition (the same one again is fine: a study
            file loaded twice); a decorator without ``name``.
    """
    return OPTIMIZERS.register_or_decorate(
        spec,
        name,
        lambda build: OptimizerSpec(name, tuple(hparams), build, doc=doc, base=base),
        "register_optimizer(name=..., hparams=..., doc=...)",
    )


def get_optimizer(name: str) -> OptimizerSpec:
    """Look up a registered optimizer; unknown names raise ``UnknownNameError`` listing the valid ones."""
    return OPTIMIZERS.get(name)


# Hyperparameters shared by several optimizers, declared once.
LR = HParam("lr", 0.1, float, low=0.0, low_open=True, doc="learning rate (peak value of the schedule)")
WEIGHT_DECAY = HParam("weight_decay", 0.0, float, low=0.0, doc="weight decay, inside the base optimizer")


def common(*extra: HParam, lr_default: float = 0.1) -> Tuple[HParam, ...]:
    """``lr`` (with the given default) and ``weight_decay`` followed by ``extra``."""
    lr = HParam("lr", lr_default, float, low=0.0, low_open=True, doc=LR.doc)
    return (lr, WEIGHT_DECAY) + tuple(extra)
