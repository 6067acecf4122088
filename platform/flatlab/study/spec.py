"""Study definitions: the typed, frozen description of a hyperparameter study.

A study file in ``studies/`` exposes ``STUDY`` (one :class:`Study`) or ``STUDIES`` (several). Each
:class:`Arm` names a registered optimizer and its own search space; a space entry may be an optimizer
hyperparameter (``lr``, ``rho``, ``kappa`` ...), a trainer one (``batch_size``, ``label_smoothing`` ...)
or a workload one (``model``, ``width`` ...).

This module is the configuration only, and imports no torch, Ray, MLflow or Optuna: reading a study
file loads none of them. :func:`flatlab.study.validate.validate` checks a study before anything starts
and reports all problems at once; :mod:`flatlab.study.trial_spec` routes a trial's values to the
optimizer, the trainer and the workload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from flatlab.analysis.curve_sets import Published
from flatlab.errors import ConfigError, UnknownNameError
from flatlab.study.budget import PER_ARM, Budget, arm_grace_period
from flatlab.study.space import Dim, as_dim, grid_points, inner, is_searched
from flatlab.study.tunings import tuning_seeds, with_tuning

SEARCHERS = ("optuna", "grid", "random")
SCHEDULERS = ("asha", "fifo")
MODES = ("max", "min")


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
    subnormals otherwise takes a slow path, many times slower for a matrix product, which a confident
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
                f"arm {self.name!r}: space={self.space!r} is a function; a define-by-run space cannot be "
                "validated, shown by --dry-run or enumerated by searcher='grid': write a dict, with conditional "
                "fields as **space.when(parent, value, {field: dimension})"
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
        budget: what each trial may spend, :class:`~flatlab.study.budget.Budget`: ``None`` (default) or
            ``Budget(epochs=E)`` (``max_epochs = E``), ``Budget(passes=P)`` (every arm trains until its
            declared passes reach P, so SGD gets about twice SAM's epochs; ``max_epochs`` and
            ``grace_period`` then count epochs of the arm with the most, and each arm's own are set at
            launch: :meth:`epochs_of`, :meth:`grace_of`), ``Budget(steps=N)`` (every arm trains N optimizer
            steps, its epochs set at launch likewise) or ``Budget(seconds=S)`` (training seconds,
            stopping at an epoch boundary; ``max_epochs`` still bounds the trial). See
            :mod:`flatlab.study.budget`.
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
        target_metric: the target of ``metric`` (a validation value in its units, e.g. 0.9 for
            ``val/accuracy``) for ``flatlab compare --time-to-target``: the passes and training seconds each
            final run takes to reach it (:mod:`flatlab.analysis.time_to_target`). ``None`` (default): the
            median final value of the reference arm's final runs. ``--target`` overrides it.
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
        measure_extra_splits: further splits the same measures run on (``"train"``, ``"val"`` or ``"test"``;
            not ``measure_split``), the same number of rows chosen with the same seed, logged as
            ``flat_<split>/<measure>`` beside ``flat/<measure>`` (TSAM paper, Table 2: each objective on
            the training and on the test set: ``measure_split="train", measure_extra_splits=("test",)``).
            Only on the final model (not at a training-loss target).
        measure_every: also run the measures every this many epochs during training (IRE paper, Fig. 2:
            Tr(F) over training), logged as ``flat_curve/<measure>`` (``flat_curve_<split>/<measure>`` for
            an extra split) with MLflow step = epoch; the final model's ``flat/*`` stay summary values.
            ``None`` (default): only at the end.
        final_seeds: after the search, each arm's best configuration (by ``metric`` among its completed
            trials) is re-run once per seed here, with no early stopping, as trials tagged
            ``flatlab.stage=final`` in the same MLflow parent run; ``flatlab compare`` reports them.
            Empty: no final stage (grid studies pool their seeds instead).
        tunings: independent tunings per arm (:mod:`flatlab.study.tunings`): each arm is searched this
            many times with ``num_trials`` trials each, its own Optuna study, seeds, ASHA rungs, best
            configuration and final seeds; ``flatlab compare`` then takes the tuning as its unit of
            replication. 1 (default): one tuning.
        margins: equivalence margins of ``flatlab compare``'s claims over tunings, quantity -> m > 0 in the
            quantity's units (e.g. ``{"test/accuracy": 0.005, "flat/fisher_trace": 5.0}``): a difference
            shown to lie within ±m is reported as "no difference larger than ±m" (docs/comparing.md). A
            quantity not named gets the default: 1 point of an accuracy, else 10 % of the reference arm's mean.
        published: a published reference, :class:`~flatlab.analysis.curve_sets.Published`: a curve-set
            file (path relative to the study file) and arm -> curve; ``flatlab curves STUDY`` sets each
            arm's per-epoch values beside that curve's published runs (:mod:`flatlab.analysis.published`).
        reports: reports over all of the study's trials after a launch, report name -> parameters
            (:mod:`flatlab.reports.declared`), e.g. ``{"interpolation": {}}`` or ``{"toy_figure": {"end":
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
    target_metric: Optional[float] = None
    measures: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    measure_examples: int = 512
    measure_seed: int = 0
    measure_split: str = "train"
    measure_extra_splits: Tuple[str, ...] = ()
    measure_every: Optional[int] = None
    final_seeds: Tuple[int, ...] = ()
    tunings: int = 1
    margins: Mapping[str, float] = field(default_factory=dict)
    published: Optional[Published] = None
    reports: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    budget: Optional[Budget] = None

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
        for name in ("seeds", "final_seeds", "measure_extra_splits"):
            value = getattr(self, name)
            if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, Mapping)):
                object.__setattr__(self, name, tuple(value))  # anything else is reported by validate
        if isinstance(self.budget, Budget) and self.budget.unit == "epochs" and self.budget.epochs is not None:
            object.__setattr__(self, "max_epochs", self.budget.epochs)  # Budget(epochs=E) is max_epochs=E
        if self.grace_period is None:  # ASHA's default first rung: 2 epochs, or the whole budget if shorter
            given = isinstance(self.max_epochs, int) and not isinstance(self.max_epochs, bool)
            budget = self.max_epochs if given and self.max_epochs >= 1 else 2
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
            if isinstance(self.budget, Budget) and self.budget.unit in PER_ARM:
                unit = self.budget.unit
                raise ConfigError(
                    f"study {self.name!r}: an epoch budget (epochs={epochs}) with budget=Budget({unit}="
                    f"{self.budget.amount}): each arm's epochs follow from its {unit}; change the {unit} instead"
                )
            if isinstance(self.budget, Budget) and self.budget.unit == "epochs":
                changes["budget"] = dataclasses.replace(self.budget, epochs=epochs)
            changes["max_epochs"] = epochs
            changes["grace_period"] = max(1, min(self.grace_period, epochs))
        return dataclasses.replace(self, **changes)

    def epochs_of(self, arm: str) -> int:
        """The epochs of arm ``arm``'s trials: its share of a pass or step budget once the launch has set it
        (:attr:`Budget.arm_epochs`), else ``max_epochs``."""
        per_arm = self.budget.arm_epochs if isinstance(self.budget, Budget) else {}
        return int(per_arm.get(arm, self.max_epochs))

    def grace_of(self, arm: str) -> int:
        """ASHA's first rung for arm ``arm``, in its epochs: ``grace_period`` scaled to its share of a pass
        or step budget (:func:`~flatlab.study.budget.arm_grace_period`), else ``grace_period``."""
        per_arm = self.budget.arm_epochs if isinstance(self.budget, Budget) else {}
        if arm not in per_arm:
            return int(self.grace_period)  # type: ignore[arg-type]
        return arm_grace_period(int(self.grace_period), int(per_arm[arm]), max(per_arm.values()))  # type: ignore[arg-type]

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise UnknownNameError(
            f"unknown arm {name!r}; arms of study {self.name!r}: {', '.join(a.name for a in self.arms)}"
        )

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
        steps = self.budget.steps if isinstance(self.budget, Budget) else None
        warmup = self.train.get("warmup_steps") if isinstance(self.train, Mapping) else None
        if isinstance(steps, int) and isinstance(warmup, int) and warmup >= steps:
            out.append(f"train warmup_steps={warmup} >= budget steps={steps}: the LR never leaves its warm-up")
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
                    f"arm {arm.name!r}: {', '.join(grids)} written as grid([...]) but searcher={self.searcher!r} "
                    "samples them like choice([...]); use searcher='grid' to run every point"
                )
            for key, value in arm.constants().items():
                if key == "switch_epoch" and isinstance(value, int) and value >= self.max_epochs:
                    out.append(
                        f"arm {arm.name!r}: switch_epoch={value} >= max_epochs={self.max_epochs}: IRE never switches "
                        "on, so this arm trains exactly as its base optimizer"
                    )
                if key == "warmup_epochs":
                    long_warmup(f"arm {arm.name!r}:", value)
        return out
