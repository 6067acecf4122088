"""Workload registry: name -> :class:`~flatlab.workloads.base.Workload` subclass."""

from __future__ import annotations

from typing import Any, Type

from flatlab.registry import Registry, describe
from flatlab.workloads.base import Workload

#: Each module registers its own workloads where it defines them (``@register_workload``).
WORKLOADS: Registry[Type[Workload]] = Registry(
    "workload",
    modules=(
        "flatlab.workloads.digits",
        "flatlab.workloads.clip",
        "flatlab.interpolation.workload",
        "flatlab.workloads.cifar",
        "flatlab.workloads.dtd",
        "flatlab.workloads.fashion_mnist",
        "flatlab.workloads.glue",
        "flatlab.workloads.lm",
        "flatlab.workloads.imagenet",
        "flatlab.workloads.toys",
    ),
)


def register_workload(cls: Type[Workload]) -> Type[Workload]:
    """Class decorator: register ``cls`` under ``cls.name``.

    Raises:
        ValueError: ``cls`` is not a :class:`Workload` subclass, or leaves one of its abstract methods
            (``load_data``, ``build_model``) undefined, so it could not be built when a trial starts;
            or the name is taken (:meth:`flatlab.registry.Registry.register`).
    """
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise ValueError(f"register_workload: {cls!r} is not a subclass of flatlab.workloads.Workload")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ValueError(
            f"workload {getattr(cls, 'name', '?')!r}: {describe(cls)} does not define "
            f"{', '.join(missing)}; a workload implements load_data(seed) -> Data and "
            f"build_model() -> nn.Module (docs/extensions.md)"
        )
    WORKLOADS.register(cls.name, cls)
    return cls


def get_workload(name: str) -> Type[Workload]:
    """The workload class registered as ``name``; unknown names raise ``UnknownNameError`` with the list."""
    return WORKLOADS.get(name)


def build_workload(name: str, **params: Any) -> Workload:
    """Instantiate workload ``name`` with validated ``params`` (``ConfigError`` on a bad value)."""
    return get_workload(name)(**params)
