"""Study definitions: the typed, frozen description of a hyperparameter study.

A study file in ``studies/`` exposes ``STUDY`` (one :class:`Study`) or ``STUDIES`` (several). Each
:class:`Arm` names a registered optimizer and its own search space; a space entry may be an optimizer
hyperparameter (``lr``, ``rho``, ``kappa`` ...), a trainer one (``batch_size``, ``label_smoothing`` ...)
or a workload one (``model``, ``width`` ...). :meth:`Study.validate` checks everything before anything
starts and reports all problems at once.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from flatlab.analysis.published import Published
from flatlab.analysis.sample import TRIAL_KEYS
from flatlab.errors import ConfigError, UnknownNameError, did_you_mean
from flatlab.hparams import HParam, resolve
from flatlab.study.space import (
    SOURCE_SUFFIX,
    BestOf,
    Dim,
    as_dim,
    condition_problems,
    grid_points,
    inner,
    is_searched,
    representatives,
)
from flatlab.study.tunings import overlapping_seeds, tuning_seeds, with_tuning
from flatlab.train.config import TARGET_HPARAMS, TRAINER_HPARAMS, recipe_problems
from flatlab.train.trainer import TrialSpec

SEARCHERS = ("optuna", "grid", "random")
# The searchers seed arm i's Optuna sampler with seed * SAMPLER_SEED_STRIDE + i (study/searchers.py), and
# numpy's RandomState inside the samplers needs that in [0, 2**32): this bounds the study seed.
SAMPLER_SEED_STRIDE = 1000
SEED_LIMIT = 2**32  # trial seeds and derived sampler seeds lie in [0, SEED_LIMIT)
MAX_COUNT = 10**6  # upper bound of trial, epoch and rung counts (a typo's 10**9 would run forever)
MAX_RESOURCE = 2**16  # upper bound of per-trial CPUs / GPUs
SCHEDULERS = ("asha", "fifo")
MODES = ("max", "min")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Resources:
    """Per-trial resources: ``cpu`` cores (also torch's thread count) and ``gpu`` (fraction allowed),
    per worker; ``workers`` data-parallel workers (DDP ranks) per trial.

    ``workers = 1`` (default): the trial is one process reserving ``cpu`` and ``gpu``. ``workers = N > 1``:
    the trial runs as a Ray Train ``TorchTrainer`` with N workers (:mod:`flatlab.study.ddp_trial`), each
    reserving ``cpu`` and ``gpu`` (a GPU per worker: ``gpu`` must then be 0 or a whole number); the Tune
    trial that starts it reserves nothing itself.

    A trial that reserved a GPU and finds no usable CUDA on its node fails at once
    (:func:`flatlab.study.placement.choose_device`); with ``cpu_fallback=True`` it trains on CPU instead,
    with a warning on the terminal and a ``flatlab.cpu_fallback`` tag on its run.

    ``flush_denormal=True`` (default): the trial's CPU threads read and write subnormal floats (below
    1.18e-38 in float32) as 0, as TensorFlow and XLA do on CPUs; on many x86 CPUs an operation on
    subnormals otherwise takes a slow path (up to ~160x for a matrix product), which a confident
    classifier's backward pass reaches and a GPU never charges (:mod:`flatlab.train.cpu_threads`). GPU
    arithmetic is unaffected. ``False`` keeps IEEE subnormals. The run's ``flatlab.cpu_denormals`` tag
    says what the trial's threads did.
    """

    cpu: float = 1
    gpu: float = 0
    workers: int = 1
    cpu_fallback: bool = False
    flush_denormal: bool = True

    def as_dict(self) -> Dict[str, float]:
        """What the Tune trial itself reserves (``tune.with_resources``). With ``workers > 1`` no CPU or
        GPU (the Train workers reserve them; the trial only waits on them), but a 1-byte ``memory``
        token, since Ray refuses an empty request."""
        if self.workers > 1:
            return {"cpu": 0, "gpu": 0, "memory": 1}
        return {"cpu": self.cpu, "gpu": self.gpu}

    def request(self) -> Dict[str, float]:
        """What one trial needs of a Ray cluster at once, in Ray's resource names (``CPU``, ``GPU`` when it
        reserves one): a multi-worker trial needs each worker's share ``workers`` times."""
        out = {"CPU": float(self.cpu) * self.workers}
        if self.gpu > 0:
            out["GPU"] = float(self.gpu) * self.workers
        return out

    def concurrent_trials(self, cluster: Mapping[str, float]) -> int:
        """How many trials fit on ``cluster`` (``ray.cluster_resources()``) at once, at least 1 (Tune's
        concurrency: with a custom searcher Tune starts one trial at a time unless told)."""
        return max(1, min(int(cluster.get(k, 0) // v) for k, v in self.request().items()))

    def worker_dict(self) -> Dict[str, float]:
        """What each Ray Train worker reserves (``ScalingConfig.resources_per_worker``)."""
        out = {"CPU": float(self.cpu)}
        if self.gpu > 0:
            out["GPU"] = float(self.gpu)
        return out


@dataclass(frozen=True)
class Arm:
    """One optimizer arm of a study.

    Attributes:
        name: the arm's label (defaults to the optimizer name); unique within the study.
        optimizer: registered optimizer name (see ``flatlab optimizers``).
        space: field -> dimension (``flatlab.space`` primitives, Optuna distributions or Tune domains, which
            are converted) or a constant; ``**space.when(parent, value, {...})`` adds fields that exist only
            when field ``parent`` takes ``value`` (absent from other trials, so their defaults apply).

    Several arms may use one optimizer under different names (``Arm("sgd", name="sgd_nesterov", ...)``):
    each gets its own Optuna study, ASHA rungs and ``num_trials``.
    """

    optimizer: str
    space: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.optimizer)
        if callable(self.space) and not isinstance(self.space, Mapping):
            raise ConfigError(
                f"arm {self.name!r}: space={self.space!r} is a function; a define-by-run space cannot be validated, shown "
                f"by --dry-run or enumerated by searcher='grid': write a dict, with conditional fields as "
                f"**space.when(parent, value, {{field: dimension}})"
            )
        if not isinstance(self.space, Mapping):
            raise ConfigError(
                f"arm {self.name!r}: space={self.space!r} ({type(self.space).__name__}); expected a dict of field -> "
                f"value or dimension, e.g. space={{'lr': space.loguniform(1e-3, 1.0)}}"
            )
        object.__setattr__(self, "space", {k: as_dim(v) for k, v in dict(self.space).items()})

    @property
    def dims(self) -> Dict[str, Dim]:
        return dict(self.space)  # type: ignore[arg-type]

    def searched(self) -> Dict[str, Dim]:
        """Dimensions the searcher samples, and the conditional fields (``space.when``)."""
        return {k: d for k, d in self.dims.items() if is_searched(d)}

    def constants(self) -> Dict[str, Any]:
        """Fixed values of this arm (every trial has them; conditional fields are not among them)."""
        return {k: d.value for k, d in self.dims.items() if not is_searched(d)}  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Study:
    """A hyperparameter study: one workload, one or more optimizer arms, a searcher and a budget.

    Attributes:
        name: MLflow experiment name and output folder; letters, digits, ``_ . -``.
        workload: registered workload name; ``workload_params`` its parameters.
        arms: optimizer arms, each with its own space; every arm gets ``num_trials`` trials.
        train: trainer parameters shared by all arms (``batch_size``, ``schedule`` ...).
        metric, mode: what the searcher and the scheduler optimise (a metric the workload reports).
        num_trials: trials per arm (``grid``: the grid size x seeds, this field is then ignored).
        max_epochs: epochs per trial (the LR schedule spans them; ASHA's ``max_t``).
        scheduler: ``asha`` (early stopping, ``grace_period`` epochs, ``reduction_factor``) or ``fifo``.
        seeds: trial seeds; ``grid`` runs every point with every seed, ``optuna``/``random`` cycle
            through them (trial i of an arm gets ``seeds[i % len(seeds)]``).
        seed: study seed (data split, searcher sampling).
        resources: per trial; ``max_concurrent``: cap on simultaneous trials (``None`` = as resources allow).
        searcher: ``optuna`` (TPE, seeded), ``random`` (Optuna's random sampler, seeded) or ``grid``.
        checkpoint_every: epochs between trial checkpoints, as Tune's ``checkpoint_frequency`` (the last
            epoch is always checkpointed, as with ``checkpoint_at_end``); ``None`` (default): a checkpoint at
            the first epoch ending 10 s or more after the previous one (``trial_loop.CHECKPOINT_INTERVAL_S``),
            so short epochs do not each pay for one. ``flatlab run --checkpoint-every N`` overrides it.
        reference_arm: steps-to-target against an arm (IRE paper, Fig. 4: AdamW's final loss). After the
            study, every finished trial gets ``train/steps_to_target``: the first optimizer step at which
            its smoothed training loss (``train_step/loss_smoothed``, EMA factor ``curve_smoothing``) is <= the
            FINAL smoothed training loss of this arm's best finished trial with the same seed (best by
            ``metric``/``mode``), and ``train/speedup`` = that reference trial's total optimizer steps /
            ``train/steps_to_target``. Trials that never reach it get the tag
            ``flatlab.target_reached=false`` instead. Resolution: the loss curve's stride (one step for
            runs of up to 1024 steps, then doubling), so steps_to_target is an upper bound within it.
        target_loss: a fixed target training loss (> 0, the workload's loss units, e.g. nats per token)
            instead of ``reference_arm``: only ``train/steps_to_target`` is logged. Not both.
        measures: flatness measures every completed trial computes on its final model, measure name ->
            parameters (``flatlab measures`` lists them), e.g. ``{"fisher_trace": {}, "neighbourhood_loss":
            {"sigma": 0.03, "draws": 40}}``; logged as ``flat/<measure>`` metrics and in ``trial.json``. With
            ``train={"measure_at_train_loss": x}`` they also run on the model of the first epoch whose mean
            training loss is <= x (``flat_at_target/<measure>``, ``train/epochs_to_target``), and training
            goes on to ``max_epochs``; ``train={"stop_at_train_loss": x}`` ends the trial there instead.
            Either target is study-wide (not in an arm's space).
        measure_examples, measure_seed, measure_split: the fixed evaluation subset of the measures:
            ``measure_examples`` rows (0 = all) of the ``measure_split`` split (``train``: the training
            loss, whose minimum the optimizers reach; or an evaluation split such as ``val``), chosen with
            ``measure_seed``, which also seeds the measures' noise, probes and sampled labels: the same
            for every trial, so values are paired across arms and seeds.
        final_seeds: after the search, each arm's best configuration (by ``metric`` among its completed
            trials) is re-run once per seed here, with no early stopping, as trials tagged
            ``flatlab.stage=final`` in the same MLflow parent run; ``flatlab compare`` reports them.
            Empty: no final stage (grid studies pool their seeds instead).
        tunings: independent tunings per arm (:mod:`flatlab.study.tunings`): each arm is searched this
            many times with ``num_trials`` trials each, its own Optuna study, seeds, ASHA rungs, best
            configuration and final seeds; ``flatlab compare`` then takes the tuning as its unit of
            replication. 1 (default): one tuning.
        published: a published reference, :class:`~flatlab.analysis.published.Published`: a curve-set
            file (path relative to the study file) and arm -> curve; ``flatlab curves STUDY`` sets each
            arm's per-epoch values beside that curve's published runs (:mod:`flatlab.analysis.published`).
        reports: reports over all of the study's trials after a launch, report name -> parameters
            (:mod:`flatlab.tracking.reports`), e.g. ``{"interpolation": {}}`` or ``{"toy_figure": {"end":
            "val/abs_u", "flatness": "val/trace_hessian"}}``; written to ``<root>/<study>/report`` and
            logged on the launch run.
    """

    name: str
    workload: str
    arms: Tuple[Arm, ...]
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    train: Mapping[str, Any] = field(default_factory=dict)
    metric: str = "val/accuracy"
    mode: str = "max"
    num_trials: int = 8
    max_epochs: int = 20
    scheduler: str = "asha"
    grace_period: Optional[int] = None
    reduction_factor: int = 3
    seeds: Tuple[int, ...] = (0,)
    seed: int = 0
    resources: Resources = Resources()
    max_concurrent: Optional[int] = None
    searcher: str = "optuna"
    checkpoint_every: Optional[int] = None
    description: str = ""
    reference_arm: Optional[str] = None
    target_loss: Optional[float] = None
    measures: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    measure_examples: int = 512
    measure_seed: int = 0
    measure_split: str = "train"
    final_seeds: Tuple[int, ...] = ()
    tunings: int = 1
    published: Optional[Published] = None
    reports: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arms = self.arms
        if isinstance(arms, Arm):  # arms=(Arm(...)) without its trailing comma is one Arm, not a tuple
            arms = (arms,)
        if isinstance(arms, (str, bytes)) or not hasattr(arms, "__iter__"):
            raise ConfigError(
                f"study {self.name!r}: arms={arms!r}; expected a tuple of Arm(...), e.g. arms=(Arm('sgd'),)"
            )
        arms = tuple(arms)
        for a in arms:
            if not isinstance(a, Arm):
                raise ConfigError(
                    f"study {self.name!r}: arms must be Arm(...) objects, got {a!r} ({type(a).__name__}); "
                    f"e.g. arms=(Arm('sgd'), Arm('adamw'))"
                )
        object.__setattr__(self, "arms", arms)
        for name in ("seeds", "final_seeds"):
            value = getattr(self, name)
            if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, Mapping)):
                object.__setattr__(self, name, tuple(value))  # anything else is reported by validate()
        if self.grace_period is None:  # ASHA's default first rung: 2 epochs, or the whole budget if shorter
            budget = self.max_epochs if _is_int(self.max_epochs) and self.max_epochs >= 1 else 2
            object.__setattr__(self, "grace_period", min(2, budget))

    # ----------------------------------------------------------------------------------------------
    def with_budget(
        self,
        trials: Optional[int] = None,
        epochs: Optional[int] = None,
        final_seeds: Optional[int] = None,
        tunings: Optional[int] = None,
    ) -> "Study":
        """A copy with a smaller (or larger) budget: ``trials`` per arm and tuning, ``epochs`` per trial, the
        first ``final_seeds`` final seeds (0: no final stage) and ``tunings`` independent tunings."""
        changes: Dict[str, Any] = {}
        if tunings is not None:
            changes["tunings"] = tunings
        if final_seeds is not None:
            changes["final_seeds"] = tuple(self.final_seeds)[:final_seeds]
        if trials is not None:
            changes["num_trials"] = trials
        if epochs is not None:
            changes["max_epochs"] = epochs
            changes["grace_period"] = max(1, min(self.grace_period, epochs))
        return dataclasses.replace(self, **changes)

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise UnknownNameError(
            f"unknown arm {name!r}; arms of study {self.name!r}: {', '.join(a.name for a in self.arms)}"
        )

    def route(self, arm: Arm) -> Dict[str, str]:
        """field -> ``optimizer`` | ``trainer`` | ``workload``: where each space field of ``arm`` goes."""
        from flatlab.optim.registry import get_optimizer
        from flatlab.workloads.registry import get_workload

        opt = {h.name for h in get_optimizer(arm.optimizer).hparams}
        trn = {h.name for h in TRAINER_HPARAMS}
        wl = {h.name for h in get_workload(self.workload).hparams}
        out = {}
        for k in arm.dims:
            out[k] = "optimizer" if k in opt else "trainer" if k in trn else "workload" if k in wl else "unknown"
        return out

    def declared(self, arm: Arm) -> Dict[str, HParam]:
        """Every field ``arm`` may set, with its declaration (optimizer, trainer and workload fields)."""
        from flatlab.optim.registry import get_optimizer
        from flatlab.workloads.registry import get_workload

        out: Dict[str, HParam] = {h.name: h for h in get_workload(self.workload).hparams}
        out.update({h.name: h for h in TRAINER_HPARAMS})
        out.update({h.name: h for h in get_optimizer(arm.optimizer).hparams})
        return out

    def trial_spec(self, config: Mapping[str, Any], device: str = "cpu") -> TrialSpec:
        """The :class:`TrialSpec` of one trial config (``{"arm", "seed", field: value ...}``)."""
        arm = self.arm(config["arm"])
        route = self.route(arm)
        opt: Dict[str, Any] = {}
        trn: Dict[str, Any] = dict(self.train)
        wl: Dict[str, Any] = dict(self.workload_params)
        for k, v in config.items():
            if k in TRIAL_KEYS or k.endswith(SOURCE_SUFFIX):  # <field>.source: a chained value's origin
                continue
            {"optimizer": opt, "trainer": trn, "workload": wl}.get(route.get(k, ""), opt)[k] = v
        return TrialSpec(
            workload=self.workload,
            optimizer=arm.optimizer,
            epochs=self.max_epochs,
            seed=int(config["seed"]),
            workload_params=wl,
            optimizer_params=opt,
            trainer_params=trn,
            device=device,
        )

    def resolved_config(self, config: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
        """Every value one trial (``config``: ``{"arm", "seed", field: value ...}``) runs with, defaults
        filled in from the declarations: ``{"optimizer": {...}, "trainer": {...}, "workload": {...}}``
        (``trainer`` includes ``epochs``; see :func:`flatlab.train.resolved.resolve_spec`).

        Raises:
            ConfigError: a value outside its allowed range; UnknownNameError: an unknown arm.
        """
        from flatlab.train.resolved import resolve_spec

        return resolve_spec(self.trial_spec(config))

    def num_total_trials(self) -> int:
        """Search trials the whole study launches (all arms and tunings; the final stage not counted)."""
        if self.searcher == "grid":
            return sum(len(self.grid(a, k)) for a in self.arms for k in range(1, self.tunings + 1))
        return self.num_trials * len(self.arms) * self.tunings

    def num_final_trials(self) -> int:
        """Final-stage trials: every arm's best configuration of each tuning over ``final_seeds``."""
        return len(self.arms) * len(self.final_seeds) * self.tunings

    def grid(self, arm: Arm, tuning: int = 1) -> List[Dict[str, Any]]:
        """Grid searcher: every point of ``arm``'s grid x every seed of tuning ``tuning``, as trial configs."""
        where = f"study {self.name!r}, arm {arm.name!r}"
        seeds = tuning_seeds(self.seeds, tuning)
        return [
            with_tuning({"arm": arm.name, "seed": s, **point}, tuning, self.tunings)
            for point in grid_points(arm.dims, where)
            for s in seeds
        ]

    def warnings(self) -> List[str]:
        """Settings that are valid but probably not what was meant (printed by ``flatlab run``)."""
        out: List[str] = []

        def long_warmup(who: str, value: Any) -> None:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= self.max_epochs:
                out.append(
                    f"{who} warmup_epochs={value} >= max_epochs={self.max_epochs}: the LR never leaves its warm-up"
                )

        long_warmup("train", self.train.get("warmup_epochs") if isinstance(self.train, Mapping) else None)
        reused = sorted(set(self.final_seeds) & set(self.seeds)) if isinstance(self.final_seeds, tuple) else []
        if reused:
            out.append(
                f"final_seeds {reused} also seed the search trials: the final stage then re-runs seeds the "
                f"configuration was selected on; fresh seeds give an unbiased estimate"
            )
        for arm in self.arms:
            grids = [k for k, d in arm.dims.items() if getattr(inner(d), "is_grid", False)]
            if grids and self.searcher != "grid":
                out.append(
                    f"arm {arm.name!r}: {', '.join(grids)} written as grid([...]) but searcher={self.searcher!r} samples "
                    f"them like choice([...]); use searcher='grid' to run every point"
                )
            for key, value in arm.constants().items():
                if key == "switch_epoch" and isinstance(value, int) and value >= self.max_epochs:
                    out.append(
                        f"arm {arm.name!r}: switch_epoch={value} >= max_epochs={self.max_epochs}: IRE never switches on, "
                        f"so this arm trains exactly as its base optimizer"
                    )
                if key == "warmup_epochs":
                    long_warmup(f"arm {arm.name!r}:", value)
        return out

    # ----------------------------------------------------------------------------------------------
    def validate(self, source: str = "") -> "Study":
        """Check the whole study; raises ONE :class:`ConfigError` listing every problem found.

        Each message names the study file (``source``), the arm and the field, with the allowed values.
        Nothing is started or written. Returns ``self`` for chaining.
        """
        from flatlab.workloads.registry import get_workload

        where = f"{source}: study {self.name!r}" if source else f"study {self.name!r}"
        errors: List[str] = []

        def check(cond: bool, msg: str) -> None:
            if not cond:
                errors.append(f"{where}: {msg}")

        check(
            isinstance(self.name, str) and bool(_NAME.match(self.name or "")),
            f"name={self.name!r}: use letters, digits, '_', '.', '-'",
        )
        workload_cls = None
        try:
            workload_cls = get_workload(self.workload)
        except UnknownNameError as exc:
            errors.append(f"{where}: field 'workload': {exc}")
        if workload_cls is not None:
            try:
                resolve(workload_cls.hparams, self.workload_params, f"{where}: workload_params")
            except ConfigError as exc:
                errors.extend(str(exc).splitlines())
            per_epoch = [m for m in workload_cls.metrics if not m.startswith("test/")]
            if self.metric in workload_cls.metrics and self.metric not in per_epoch:
                check(
                    False,
                    f"metric={self.metric!r} is reported only after the last epoch (the test split is kept out of "
                    f"model selection); the searcher and scheduler need one reported every epoch: {', '.join(per_epoch)}",
                )
            else:
                check(
                    self.metric in workload_cls.metrics,
                    f"metric={self.metric!r} is not reported by workload {self.workload!r}; it reports: {', '.join(per_epoch)}",
                )
        try:
            resolve(TRAINER_HPARAMS, self.train, f"{where}: field 'train'")
        except ConfigError as exc:
            errors.extend(str(exc).splitlines())
        errors.extend(self._validate_target(where))
        errors.extend(f"{where}: {m}" for m in _scalar_problems(self))
        check(self.mode in MODES, f"mode={self.mode!r}; expected one of {', '.join(MODES)}")
        check(self.searcher in SEARCHERS, f"searcher={self.searcher!r}; expected one of {', '.join(SEARCHERS)}")
        check(self.scheduler in SCHEDULERS, f"scheduler={self.scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
        if self.scheduler == "asha":  # ASHA's first rung must lie within the budget; FIFO ignores it
            check(
                _is_int(self.grace_period)
                and 1 <= self.grace_period <= (self.max_epochs if _is_int(self.max_epochs) else 1),
                f"grace_period={self.grace_period!r}; expected an int in [1, max_epochs={self.max_epochs!r}] (scheduler='asha')",
            )
        else:
            check(
                _is_int(self.grace_period) and 1 <= self.grace_period <= MAX_COUNT,
                f"grace_period={self.grace_period!r}; expected an int in [1, {MAX_COUNT}]",
            )
        check(len(self.arms) > 0, "arms is empty; give at least one Arm(optimizer=..., space={...})")
        names = [a.name for a in self.arms]
        check(len(set(map(repr, names))) == len(names), f"arm names must be unique, got {names}")
        for n in names:  # they name MLflow runs, Optuna studies and Tune trials
            check(isinstance(n, str) and bool(_NAME.match(n)), f"arm name {n!r}: use letters, digits, '_', '.', '-'")
        check(
            self.reference_arm is None or self.reference_arm in names,
            f"reference_arm={self.reference_arm!r}; expected None or one of the arm names: {', '.join(map(repr, names))}",
        )
        check(
            self.target_loss is None
            or (
                isinstance(self.target_loss, (int, float))
                and not isinstance(self.target_loss, bool)
                and 0 < self.target_loss < float("inf")
            ),
            f"target_loss={self.target_loss!r}; expected None or a finite float > 0 (the training loss to reach)",
        )
        check(
            self.reference_arm is None or self.target_loss is None,
            f"reference_arm={self.reference_arm!r} and target_loss={self.target_loss!r} are both set; set at most one of them",
        )
        errors.extend(self._validate_measures(where))
        if self.published is not None and not isinstance(self.published, Published):
            check(False, f"published={self.published!r}; expected None or Published(path, arms={{arm: curve}})")
        elif self.published is not None:
            errors.extend(f"{where}: {m}" for m in self.published.problems(names))
        errors.extend(self._validate_reports(where))
        for arm in self.arms:
            errors.extend(self._validate_arm(arm, where, workload_cls is not None))
        if errors:
            raise ConfigError("invalid study:\n  " + "\n  ".join(errors))
        return self

    def _validate_target(self, where: str) -> List[str]:
        """Problems with the training-loss target (the trainer's ``stop_at_train_loss`` or
        ``measure_at_train_loss``): both set (:func:`~flatlab.train.config.recipe_problems`); either in an
        arm's space (a target is study-wide: flatness is compared at one training loss for every arm, and
        ``flatlab compare`` reads it from the launch); ``measure_at_train_loss`` without ``measures``."""
        if not isinstance(self.train, Mapping):
            return []  # reported by the resolve above
        errors = [f"{where}: field 'train': {m}" for m in recipe_problems(self.train)]
        for arm in self.arms:
            for key in TARGET_HPARAMS:
                if isinstance(arm.space, Mapping) and key in arm.space:
                    errors.append(
                        f"{where}, arm {arm.name!r}: field {key!r} is study-wide (every arm is measured at the same "
                        f"training loss): set it in Study(train={{{key!r}: ...}}), not in an arm's space"
                    )
        measure_at = self.train.get("measure_at_train_loss")
        if measure_at is not None and isinstance(self.measures, Mapping) and not self.measures:
            errors.append(
                f"{where}: field 'train': measure_at_train_loss={measure_at!r} runs the study's measures at the target, "
                f"but measures is empty; set measures={{...}} (`flatlab measures` lists them), or use "
                f"stop_at_train_loss to only stop there"
            )
        return errors

    def _validate_measures(self, where: str) -> List[str]:
        """Problems with ``measures``, their subset and ``final_seeds`` (each naming the field)."""
        from flatlab.sharpness.measures import resolve_measures

        errors: List[str] = []
        if not isinstance(self.measures, Mapping):
            errors.append(
                f"{where}: measures={self.measures!r}; expected a dict of measure name -> parameters, "
                f"e.g. measures={{'fisher_trace': {{}}}} (see `flatlab measures`)"
            )
        else:
            try:
                resolve_measures(self.measures, f"{where}: measures")
            except ConfigError as exc:
                errors.extend(str(exc).splitlines())
        if not (_is_int(self.measure_examples) and 0 <= self.measure_examples <= 10**7):
            errors.append(
                f"{where}: measure_examples={self.measure_examples!r}; expected an int in [0, 10**7] (0 = the whole split)"
            )
        if not (_is_int(self.measure_seed) and 0 <= self.measure_seed < 2**32):
            errors.append(f"{where}: measure_seed={self.measure_seed!r}; expected an int in [0, 2**32)")
        splits = ("train", "val")
        if self.measure_split not in splits:
            errors.append(
                f"{where}: measure_split={self.measure_split!r}; expected one of {', '.join(map(repr, splits))}"
            )
        fs = self.final_seeds
        if not (isinstance(fs, tuple) and all(_is_int(x) and 0 <= x < 2**32 for x in fs)):
            errors.append(
                f"{where}: final_seeds={fs!r}; expected a tuple of ints in [0, 2**32), e.g. final_seeds=(1, 2, 3)"
            )
        elif len(set(fs)) != len(fs):
            errors.append(f"{where}: final_seeds={fs!r} repeats a seed")
        elif fs and self.searcher == "grid":
            errors.append(
                f"{where}: final_seeds={fs!r} with searcher='grid': a grid already runs every point with every "
                f"seed in seeds=...; put the seeds there and leave final_seeds empty"
            )
        return errors

    def _validate_reports(self, where: str) -> List[str]:
        """Problems with ``reports`` (:func:`flatlab.tracking.reports.resolve_reports`), one per line."""
        from flatlab.tracking.reports import resolve_reports

        try:
            resolve_reports(self.reports, f"{where}: reports")
        except ConfigError as exc:
            return str(exc).splitlines()
        return []

    def _validate_arm(self, arm: Arm, where: str, workload_ok: bool) -> List[str]:
        from flatlab.optim.registry import get_optimizer
        from flatlab.workloads.registry import get_workload

        aw = f"{where}, arm {arm.name!r}"
        if not isinstance(arm.optimizer, str):
            return [
                f"{aw}: field 'optimizer'={arm.optimizer!r}; expected a registered optimizer name (`flatlab optimizers` lists them)"
            ]
        try:
            get_optimizer(arm.optimizer)
        except UnknownNameError as exc:
            # the fields cannot be checked against an unknown optimizer, but each dimension's own
            # problems (a log range with low <= 0, an empty choice ...) are still reported now
            own = [f"{aw}, field {key!r}: {msg}" for key, dim in arm.dims.items() if (msg := dim.problem())]
            return [f"{aw}: field 'optimizer': {exc}"] + own
        if not workload_ok:
            return []
        errors: List[str] = []
        declared = self.declared(arm)
        route = self.route(arm)
        data_fields = get_workload(self.workload).data_hparams
        for key, dim in arm.dims.items():
            if key in ("arm", "seed"):
                errors.append(f"{aw}: field {key!r} is reserved; set trial seeds with Study(seeds=...)")
                continue
            hp = declared.get(key)
            if hp is None:
                errors.append(
                    f"{aw}: field {key!r}{did_you_mean(key, declared)} is not accepted by optimizer {arm.optimizer!r}, the "
                    f"trainer or workload {self.workload!r}; accepted: {', '.join(sorted(declared))}"
                )
                continue
            if route[key] == "workload" and key in data_fields:
                errors.append(
                    f"{aw}: field {key!r} changes workload {self.workload!r}'s data, which is loaded once per study; "
                    f"set it in Study(workload_params=...) (one study per value)"
                )
                continue
            try:
                dim.check(hp, f"{aw}, field {key!r}")
            except ConfigError as exc:
                errors.append(str(exc))
        errors.extend(f"{aw}, field {key!r}: {msg}" for key, msg in condition_problems(arm.dims))
        if self.searcher == "grid" and not errors:
            try:
                grid_points(arm.dims, aw)
            except ConfigError as exc:
                errors.append(str(exc))
        if not errors:
            errors += _probe_optimizer(arm, aw, route)
        return errors


def _probe_optimizer(arm: Arm, where: str, route: Mapping[str, str]) -> List[str]:
    """Build ``arm``'s optimizer once, on a one-element dummy parameter, with its fixed values and a
    representative value of every searched dimension (:meth:`Dim.representative`). A combination the
    optimizer rejects as a whole (``nesterov=True`` with ``momentum=0``) is then reported now, naming
    the arm, instead of failing every trial."""
    import torch

    from flatlab.optim.registry import get_optimizer

    for config in representatives(arm.dims):  # one per branch of the conditional fields
        values = {
            k: v
            for k, v in config.items()  # a chained value (best_of) is known only at launch
            if route.get(k) == "optimizer" and not isinstance(inner(arm.dims.get(k)), BestOf)
        }
        try:
            get_optimizer(arm.optimizer).create([torch.zeros(1, requires_grad=True)], **values)
        except (ConfigError, ValueError) as exc:
            return [f"{where}: optimizer {arm.optimizer!r} rejects these settings: {exc}"]
    return []


def _scalar_problems(study: "Study") -> List[str]:
    """The problems of ``study``'s counts, seeds and resources (each message names its field and the
    allowed range). Bounds: counts <= :data:`MAX_COUNT`; trial seeds in [0, 2**32); the study seed such
    that every sampler seed ``seed * 1000 + arm index`` (study/searchers.py) stays below 2**32."""
    out: List[str] = []

    def count(name: str, low: int, nullable: bool = False) -> None:
        value = getattr(study, name)
        if nullable and value is None:
            return
        if not (_is_int(value) and low <= value <= MAX_COUNT):
            out.append(f"{name}={value!r}; expected {'None or ' if nullable else ''}an int in [{low}, {MAX_COUNT}]")

    count("num_trials", 1)
    count("tunings", 1)
    count("max_epochs", 1)
    count("reduction_factor", 2)
    count("max_concurrent", 1, nullable=True)
    count("checkpoint_every", 1, nullable=True)
    seeds = study.seeds
    if not (isinstance(seeds, tuple) and seeds and all(_is_int(s) and 0 <= s < SEED_LIMIT for s in seeds)):
        out.append(f"seeds={seeds!r}; expected a non-empty tuple of ints in [0, 2**32), e.g. seeds=(0, 1, 2)")
    elif len(set(seeds)) != len(seeds):
        out.append(f"seeds={seeds!r} repeats a seed (the same trials would run twice)")
    elif _is_int(study.tunings) and 1 < study.tunings <= MAX_COUNT:
        finals = study.final_seeds if isinstance(study.final_seeds, tuple) else ()
        shared = overlapping_seeds(set(seeds) | {s for s in finals if _is_int(s)}, study.tunings)
        if shared:
            out.append(
                f"tunings={study.tunings} with seeds={seeds!r} and final_seeds={finals!r}: tuning k shifts every "
                f"seed by (k - 1) * 1000000, so tunings would share seeds {shared[:5]}; keep seeds below 1000000"
            )
    n_arms = len(study.arms) if isinstance(study.arms, tuple) else 1
    max_seed = (SEED_LIMIT - max(n_arms, 1)) // SAMPLER_SEED_STRIDE
    if not (_is_int(study.seed) and 0 <= study.seed <= max_seed):
        out.append(
            f"seed={study.seed!r}; expected an int in [0, {max_seed}] (arm i's sampler is seeded with "
            f"seed * {SAMPLER_SEED_STRIDE} + i, which must stay below 2**32)"
        )
    res = study.resources
    if not isinstance(res, Resources):
        out.append(
            f"resources={res!r} ({type(res).__name__}); expected Resources(cpu=..., gpu=...), e.g. Resources(cpu=2, gpu=0.5)"
        )
    else:
        cpu_ok = _is_number(res.cpu) and 0 < res.cpu <= MAX_RESOURCE
        gpu_ok = _is_number(res.gpu) and 0 <= res.gpu <= MAX_RESOURCE and (res.gpu <= 1 or float(res.gpu).is_integer())
        if not (cpu_ok and gpu_ok):
            out.append(
                f"resources=Resources(cpu={res.cpu!r}, gpu={res.gpu!r}); expected cpu in (0, {MAX_RESOURCE}] and gpu in "
                f"[0, {MAX_RESOURCE}], a fraction only up to 1 (Ray shares a GPU, it does not split several)"
            )
        if not isinstance(getattr(res, "cpu_fallback", False), bool):
            out.append(f"resources=Resources(cpu_fallback={res.cpu_fallback!r}); expected True or False")
        if not isinstance(getattr(res, "flush_denormal", True), bool):
            out.append(
                f"resources=Resources(flush_denormal={res.flush_denormal!r}); expected True (subnormal floats "
                "read and written as 0 on the trial's CPU threads) or False (IEEE subnormals kept)"
            )
        workers = getattr(res, "workers", 1)
        if not (_is_int(workers) and 1 <= workers <= MAX_RESOURCE):
            out.append(
                f"resources=Resources(workers={workers!r}); expected an int in [1, {MAX_RESOURCE}] (data-parallel workers per trial)"
            )
        elif workers > 1 and gpu_ok and not float(res.gpu).is_integer():
            out.append(
                f"resources=Resources(workers={workers}, gpu={res.gpu!r}); with workers > 1 each worker (DDP rank) needs "
                f"whole GPUs: expected gpu = 0 (CPU, gloo) or an integer >= 1"
            )
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
