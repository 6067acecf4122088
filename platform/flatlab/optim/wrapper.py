"""The base-wrapping mechanism shared by SAM/ASAM, TSAM and IRE.

A :class:`WrappedOptimizer` modifies the step of another ``torch.optim.Optimizer`` (its *base*):

* It **shares** the base's ``param_groups`` (the same list object holding the same dicts) and
  ``defaults``, so an LR scheduler built on either object changes the learning rate the base steps
  with (a wrapper holding its own copy of the groups is a known pitfall: mosaicml/composer#3259).
  ``base.load_state_dict`` replaces the base's list, so the wrapper re-shares after every load.
* Its own per-parameter state lives in ``self.state`` (never in the base's: Adam initialises its
  moments when ``state[p]`` is empty, so foreign keys there would break it).
* ``state_dict()`` is the base's state dict (torch's format, base momentum / Adam moments included)
  plus a ``"wrappers"`` list with one entry per wrapping level, innermost first. Only the keys a
  subclass lists in ``_persistent_state`` are saved; per-step scratch buffers are not.
* ``on_progress`` and ``pop_metrics`` (:mod:`flatlab.optim.protocol` hooks) are forwarded to the base,
  so wrappers compose: ``IRE(SAM(SGD))`` reports SAM's and IRE's metrics.

:func:`wrapped_spec` composes registry entries the same way: base hparams + wrapper hparams.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from flatlab.hparams import HParam
from flatlab.optim._flat import MetricMeans, group_params
from flatlab.optim.protocol import Progress
from flatlab.optim.registry import OptimizerSpec

__all__ = ["WrappedOptimizer", "wrapped_spec", "require_closure"]


def require_closure(closure: Optional[Callable[[], torch.Tensor]], who: str) -> Callable[[], torch.Tensor]:
    """Return ``closure``; raises ``ValueError`` when it is ``None`` (multi-pass optimizers need it)."""
    if closure is None:
        raise ValueError(
            f"{who}.step() needs a closure that recomputes the loss and gradients "
            "(flatlab.train.closure.BatchClosure, or any `fn() -> loss` that calls backward()); got None"
        )
    return closure


class WrappedOptimizer(torch.optim.Optimizer):
    """An optimizer that modifies the step of ``base`` and shares its ``param_groups``.

    Args:
        base: the optimizer whose step is modified (any ``torch.optim.Optimizer``, wrappers included).

    Raises:
        TypeError: ``base`` is not a ``torch.optim.Optimizer``.
    """

    #: name of this wrapper's entry in ``state_dict()["wrappers"]`` (checked on load).
    _state_tag: str = "wrapper"
    #: per-parameter ``self.state`` keys saved in checkpoints (scratch buffers are left out).
    _persistent_state: Tuple[str, ...] = ()

    def __init__(self, base: torch.optim.Optimizer) -> None:
        if not isinstance(base, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a torch.optim.Optimizer, got {type(base).__name__}")
        self._sharing = False  # add_param_group goes to torch's own implementation during __init__
        super().__init__(base.param_groups, {})  # registers the base's group dicts themselves
        self.base = base
        self._share()
        self._sharing = True
        self._metrics = MetricMeans()
        self._progress: Optional[Progress] = None

    # ------------------------------------------------------------------ sharing
    def _share(self) -> None:
        self.param_groups = self.base.param_groups
        self.defaults = self.base.defaults

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group to the base (and therefore to this wrapper, which shares the list)."""
        if self._sharing:
            self.base.add_param_group(param_group)
        else:
            super().add_param_group(param_group)

    def _params(self) -> List[torch.Tensor]:
        return group_params(self.param_groups)

    # ------------------------------------------------------------------ hooks
    def on_progress(self, progress: Progress) -> None:
        """Remember the training position (schedules read it) and forward it to the base."""
        self._progress = progress
        hook = getattr(self.base, "on_progress", None)
        if hook is not None:
            hook(progress)

    def pop_metrics(self) -> Dict[str, float]:
        """The base's metrics and this wrapper's, each the mean since the previous call."""
        hook = getattr(self.base, "pop_metrics", None)
        out: Dict[str, float] = dict(hook()) if hook is not None else {}
        out.update(self._metrics.pop())
        return out

    # ------------------------------------------------------------------ checkpoints
    def _extra_state(self) -> Dict[str, Any]:
        """Non-tensor state to checkpoint (counters, flags); subclasses override."""
        return {}

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        """Inverse of :meth:`_extra_state`."""

    def state_dict(self) -> Dict[str, Any]:
        """The base's state dict plus this wrapper's entry appended to ``"wrappers"``.

        Tensors are referenced, not copied (as in torch); ``torch.save`` makes the copy.
        """
        sd = dict(self.base.state_dict())
        index = {p: i for i, p in enumerate(self._params())}
        own: Dict[int, Dict[str, torch.Tensor]] = {}
        for p, entries in self.state.items():
            kept = {k: v for k, v in entries.items() if k in self._persistent_state}
            if kept and p in index:
                own[index[p]] = kept
        entry = {"type": self._state_tag, "state": own, "extra": self._extra_state()}
        sd["wrappers"] = list(sd.get("wrappers", [])) + [entry]
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load what :meth:`state_dict` produced (base state first, then this wrapper's).

        Raises:
            ValueError: the state dict has no entry for this wrapper type at this nesting level, or
                refers to more parameters than this optimizer has.
        """
        sd = dict(state_dict)
        stack = list(sd.pop("wrappers", []))
        if not stack or stack[-1].get("type") != self._state_tag:
            found = [e.get("type") for e in stack]
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: expected the outermost wrapper entry to be "
                f"{self._state_tag!r}, found wrapper entries {found} (was it saved by another optimizer?)"
            )
        own = stack.pop()
        if stack:
            sd["wrappers"] = stack
        self.base.load_state_dict(sd)
        self._share()  # torch's load_state_dict built new group dicts in a new list
        params = self._params()
        state: defaultdict = defaultdict(dict)
        for i, entries in own.get("state", {}).items():
            i = int(i)
            if not 0 <= i < len(params):
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: state for parameter #{i}, "
                    f"but this optimizer has {len(params)} parameters"
                )
            p = params[i]
            state[p] = {k: v.detach().to(device=p.device, copy=True) for k, v in entries.items()}
        self.state = state
        self._load_extra_state(own.get("extra", {}))

    # torch's Optimizer pickles only defaults/state/param_groups; a wrapper needs all its attributes
    # (options, the base) for copy.deepcopy and pickling. Shared objects stay shared through the memo.
    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._describe()}, base={self.base!r})"

    def _describe(self) -> str:
        return ""


def wrapped_spec(
    name: str,
    base: OptimizerSpec,
    extra: Sequence[HParam],
    wrap: Callable[..., torch.optim.Optimizer],
    *,
    doc: str,
    base_defaults: Optional[Mapping[str, Any]] = None,
) -> OptimizerSpec:
    """A registry entry for ``wrap(<base optimizer>, **<wrapper hparams>)``.

    The entry declares the base's hyperparameters (``base_defaults`` may change their default values)
    followed by ``extra``; building it builds the base with the base's share of the values and wraps
    it. Entries compose: ``sam_ire`` is ``wrapped_spec("sam_ire", <sam spec>, IRE_HPARAMS, IRE)``.

    Raises:
        ValueError: a wrapper hyperparameter has the same name as a base one, or ``base_defaults``
            names an unknown hyperparameter (both programming errors at registration time).
        ConfigError: a ``base_defaults`` value is outside that hyperparameter's range.
    """
    base_names = [h.name for h in base.hparams]
    clash = sorted(set(base_names) & {h.name for h in extra})
    if clash:
        raise ValueError(f"{name}: hyperparameter(s) {clash} declared by both {base.name!r} and the wrapper")
    overrides = dict(base_defaults or {})
    unknown = sorted(set(overrides) - set(base_names))
    if unknown:
        raise ValueError(f"{name}: base_defaults names {unknown}, not hyperparameters of {base.name!r}")
    hparams = tuple(
        dataclasses.replace(h, default=h.validate(overrides[h.name], name)) if h.name in overrides else h
        for h in base.hparams
    ) + tuple(extra)
    wrapper_names = [h.name for h in extra]

    def build(params: Any, **values: Any) -> torch.optim.Optimizer:
        inner = base.build(params, **{k: values[k] for k in base_names})
        return wrap(inner, **{k: values[k] for k in wrapper_names})

    build.__doc__ = f"Build {base.name!r} over ``params`` and wrap it: {doc}"
    return OptimizerSpec(name, hparams, build, doc=doc, base=base.name)
