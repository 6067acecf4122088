"""A study's own workloads, optimizers and flatness measures, on every process that runs its trials.

A study file (or a module next to it that it imports) may register its own entries with the decorators
``@register_workload``, ``@register_optimizer(name=...)`` and ``@register_measure(name=...)``. The
driver executes the study file; the processes that run trials (Ray workers, on this machine or on other
nodes) never do, and could not import it. So the driver hands every trial the registered entries that
are not flatlab's own (:func:`capture`), and the trial registers them in its own process before it
builds anything (:func:`install`). Their classes and functions travel by value: the modules that define
them (the study file, the user modules it imported from its folder) are marked for Ray's cloudpickle
to pickle by value, so a worker needs nothing but flatlab and the libraries they import.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, Mapping, Set

from flatlab.lazy import lazy
from flatlab.registry import definition

# the registries load torch, and the study loader reads USER_MODULES without it
optim_registry = lazy("flatlab.optim.registry")
sharpness_registry = lazy("flatlab.sharpness.registry")
workloads_registry = lazy("flatlab.workloads.registry")
cloudpickle = lazy("ray.cloudpickle")  # Ray loads in seconds

#: Names of the modules loaded from study files and their folders (:func:`flatlab.study.loader.load_module`).
USER_MODULES: Set[str] = set()

Extensions = Dict[str, Dict[str, Any]]
"""``{kind: {name: entry}}``, kinds ``workload``, ``optimizer``, ``measure``."""


def _registries() -> Dict[str, Any]:
    return {
        "workload": workloads_registry.WORKLOADS,
        "optimizer": optim_registry.OPTIMIZERS,
        "measure": sharpness_registry.MEASURES,
    }


def pickle_by_value(modules: Iterable[str]) -> None:
    """Mark the modules named ``modules`` (those loaded in this process) for Ray's cloudpickle to
    pickle their classes and functions by value: a process that cannot import them still gets them."""
    for name in modules:
        module = sys.modules.get(name)
        if module is None or name == "__main__":
            continue
        try:
            cloudpickle.register_pickle_by_value(module)
        except ValueError:  # a module cloudpickle refuses (e.g. not in sys.modules under its own name)
            continue


def capture() -> Extensions:
    """The registered entries that are not flatlab's own, by kind; their modules and the modules of the
    study files loaded in this process are marked to be pickled by value (:func:`pickle_by_value`)."""
    found = {kind: registry.extensions() for kind, registry in _registries().items()}
    modules = set(USER_MODULES)
    for entries in found.values():
        modules.update(definition(entry)[0] for entry in entries.values())
    pickle_by_value(sorted(modules))
    return {kind: dict(entries) for kind, entries in found.items() if entries}


def install(extensions: Mapping[str, Mapping[str, Any]]) -> None:
    """Register ``extensions`` (from :func:`capture`, on the driver) in this process. Idempotent: the
    same definition registered again replaces itself.

    Raises:
        ValueError: an entry's name is taken here by a different definition (the message names both).
    """
    if not extensions:
        return
    registries = _registries()
    for kind, entries in extensions.items():
        for name, entry in entries.items():
            registries[kind].register(name, entry)
