"""Generated malformed study files: each is refused with ONE ConfigError naming the file and the field,
or it is valid AND really runs (plan, searcher, every arm's trial spec, a Trainer and one epoch).

The files come from one valid base study by replacing one field (or one part of a field) at a time with
a bad value of many kinds; the counts the test asserts are "0 tracebacks" and "0 accepted then crashed".
"""

from __future__ import annotations

import json
from typing import Dict, List, Tuple

import pytest

from flatlab import Study
from flatlab import space as sp
from flatlab.errors import ConfigError, FlatlabError
from flatlab.study.loader import load_studies
from flatlab.study.trial_spec import trial_spec
from flatlab.study.validate import validate

HEADER = "from flatlab import Arm, Resources, Study\nfrom flatlab import space as sp\n\n"

# The base study, one <<slot>> per place a value can go wrong; DEFAULTS fills each slot with a valid value.
TEMPLATE = """STUDY = Study(
    name=<<name>>,
    workload=<<workload>>,
    workload_params=<<workload_params>>,
    train=<<train>>,
    arms=<<arms>>,
    metric=<<metric>>,
    mode=<<mode>>,
    num_trials=<<num_trials>>,
    max_epochs=<<max_epochs>>,
    scheduler=<<scheduler>>,
    grace_period=<<grace_period>>,
    reduction_factor=<<reduction_factor>>,
    seeds=<<seeds>>,
    seed=<<seed>>,
    resources=<<resources>>,
    max_concurrent=<<max_concurrent>>,
    searcher=<<searcher>>,
    checkpoint_every=<<checkpoint_every>>,
    target_loss=<<target_loss>>,
)
"""

DEFAULTS: Dict[str, str] = {
    "name": '"fuzz"',
    "workload": '"digits"',
    "workload_params": '{"model": "mlp", "width": <<width>>}',
    "width": "8",
    "train": '{"batch_size": <<batch_size>>, "warmup_epochs": <<warmup_epochs>>, "clip_norm": <<clip_norm>>}',
    "batch_size": "256",
    "warmup_epochs": "0.0",
    "clip_norm": "None",
    "arms": '(Arm(<<optimizer>>, space=<<space>>), Arm("adamw", space={"lr": sp.choice(<<choices>>)}))',
    "optimizer": '"sgd"',
    "space": '{"lr": <<lr>>, "momentum": sp.uniform(0.0, <<momentum_high>>), "weight_decay": <<weight_decay>>, '
    '"batch_size": sp.int(<<int_low>>, 512)}',
    "lr": "sp.loguniform(<<lr_low>>, <<lr_high>>)",
    "lr_low": "1e-3",
    "lr_high": "1.0",
    "momentum_high": "0.9",
    "weight_decay": "1e-4",
    "int_low": "128",
    "choices": "[1e-3, 3e-3]",
    "metric": '"val/accuracy"',
    "mode": '"max"',
    "num_trials": "2",
    "max_epochs": "2",
    "scheduler": '"asha"',
    "grace_period": "1",
    "reduction_factor": "2",
    "seeds": "(0, <<seed_item>>)",
    "seed_item": "1",
    "seed": "0",
    "resources": "Resources(cpu=<<cpu>>, gpu=<<gpu>>)",
    "cpu": "1",
    "gpu": "0",
    "max_concurrent": "None",
    "searcher": '"optuna"',
    "checkpoint_every": "1",
    "target_loss": "None",
}

# What the error message must name for a bad value in each slot (any one of the words).
FIELD_WORDS: Dict[str, Tuple[str, ...]] = {
    "width": ("width",),
    "batch_size": ("batch_size",),
    "warmup_epochs": ("warmup_epochs",),
    "clip_norm": ("clip_norm",),
    "optimizer": ("optimizer",),
    "lr": ("lr",),
    "lr_low": ("lr",),
    "lr_high": ("lr",),
    "momentum_high": ("momentum",),
    "int_low": ("batch_size",),
    "choices": ("lr",),
    "seed_item": ("seeds",),
    "space": ("space", "field 'a'"),  # a dict with an unknown key: the key is named
    "cpu": ("resources",),
    "gpu": ("resources",),
}

BAD_VALUES: List[str] = [
    "None",
    "[1, 2]",
    '{"a": 1}',
    '"x"',
    'float("inf")',
    'float("-inf")',
    'float("nan")',
    "1e308",
    "2**70",
    "-1",
    "True",
    "()",
    "object()",
    "0",
]

# Slots that only take one kind of value: probing them with numbers is enough variety.
SLOTS = [s for s in DEFAULTS if s not in ("arms",)] + ["arms"]


def render(overrides: Dict[str, str]) -> str:
    """The base study's source with ``overrides`` (slot -> source text) filled in."""
    text = TEMPLATE
    for _ in range(6):  # slots nest a few levels deep
        for slot, default in DEFAULTS.items():
            text = text.replace(f"<<{slot}>>", overrides.get(slot, default))
    assert "<<" not in text
    return HEADER + text


def cases() -> List[Tuple[str, str, str, Tuple[str, ...]]]:
    """``(case id, file text, the field's name, words its error must contain)``."""
    out = []
    for slot in SLOTS:
        for bad in BAD_VALUES:
            out.append((f"{slot}={bad}", render({slot: bad}), slot, FIELD_WORDS.get(slot, (slot,))))
    # the study itself, and what a scaled file's build(scale) returns
    for bad in ["None", "[1, 2]", '{"a": 1}', '"x"', "1e308", "object()", "[]"]:
        out.append((f"STUDY={bad}", HEADER + f"STUDY = {bad}\n", "STUDY", ("STUDY",)))
        out.append(
            (
                f"build->{bad}",
                HEADER + f"SCALES = ('smoke',)\n\ndef build(scale):\n    return {bad}\n",
                "build",
                ("build",),
            )
        )
    out.append(("build->nothing", HEADER + "SCALES = ('smoke',)\n\ndef build(scale):\n    pass\n", "build", ("build",)))
    for bad in ["None", '"smoke"', "[1]", "object()"]:
        out.append(
            (f"SCALES={bad}", HEADER + f"SCALES = {bad}\n\ndef build(scale):\n    return None\n", "SCALES", ("SCALES",))
        )
    # a study seed whose samplers' seeds (seed * 1000 + arm) leave [0, 2**32)
    for seed in ["2**40", "4294967", "10**7"]:
        out.append((f"seed={seed}", render({"seed": seed}), "seed", ("seed",)))
    return out


CASES = cases()


def test_enough_cases_of_many_kinds():
    assert len(CASES) >= 100
    assert render({}) == render({"seed": "0"})


class _Run:
    """Data per (workload params, seed), loaded once for all accepted studies."""

    def __init__(self) -> None:
        self.data: Dict[str, object] = {}

    def really_runs(self, study: Study) -> None:
        """What ``flatlab run`` does with a valid study, short of Ray: the plan (logged as JSON), the
        searcher (its seeded samplers) with one suggestion per arm, each trial's spec, a Trainer and one
        epoch on the workload's real data."""
        from flatlab.study.plan import plan
        from flatlab.study.searchers import ArmSearcher
        from flatlab.train.trainer import Diverged, Trainer
        from flatlab.workloads.registry import build_workload

        json.dumps(plan(study))
        key = repr((study.workload, dict(study.workload_params), study.seed))
        if key not in self.data:
            self.data[key] = build_workload(study.workload, **dict(study.workload_params)).load_data(study.seed)
        searcher = ArmSearcher(study)
        seen = set()
        for i in range(len(study.arms)):
            config = searcher.suggest(f"t{i}")
            assert isinstance(config, dict), config
            seen.add(config["arm"])
            trainer = Trainer(trial_spec(study, config), self.data[key])
            try:
                trainer.run_epoch()
            except Diverged:
                pass  # the trainable reports it as a diverged trial
        assert seen == {a.name for a in study.arms}


@pytest.fixture(scope="module")
def runner():
    return _Run()


def test_every_malformed_file_is_refused_naming_file_and_field_or_really_runs(tmp_path, runner, one_torch_thread):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tracebacks, unnamed, crashed, accepted = [], [], [], 0
    for i, (case, text, _field, words) in enumerate(CASES):
        path = tmp_path / f"case_{i:03d}.py"
        path.write_text(text)
        try:
            studies = load_studies(str(path), scale="smoke" if "SCALES" in text else None)
        except (FlatlabError, ConfigError) as exc:
            msg = str(exc)
            if str(path) not in msg or not any(w in msg for w in words):
                unnamed.append(f"{case}: {msg}")
            continue
        except BaseException as exc:  # noqa: BLE001 - the count of these is what the test is about
            tracebacks.append(f"{case}: {type(exc).__name__}: {exc}")
            continue
        accepted += 1
        for study in studies:
            try:
                runner.really_runs(study)
            except BaseException as exc:  # noqa: BLE001
                crashed.append(f"{case}: {type(exc).__name__}: {exc}")
    report = (
        ["tracebacks:"]
        + tracebacks
        + ["accepted, then crashed:"]
        + crashed
        + ["errors that do not name the file and the field:"]
        + unnamed
    )
    assert (tracebacks, crashed, unnamed) == ([], [], []), "\n".join(report)
    assert accepted >= 10  # the good values among the "bad" ones (0, 1e308 as a target loss ...) do run


def test_a_study_seed_whose_sampler_seeds_leave_32_bits_is_refused():
    from flatlab import Arm
    from flatlab.study.searchers import ArmSearcher

    def study(seed):
        return Study(name="s", workload="digits", arms=(Arm("sgd", space={"lr": sp.loguniform(1e-3, 1.0)}),), seed=seed)

    with pytest.raises(ConfigError, match=r"seed=1099511627776; expected an int in \[0, 4294967\] .*below 2\*\*32"):
        validate(study(2**40))
    with pytest.raises(ConfigError, match=r"seed=4294968; expected an int in \[0, 4294967\]"):
        validate(study(4294968))  # 4294968 * 1000 = 2**32 + 704
    ArmSearcher(validate(study(4294967))).suggest("t0")  # the largest allowed seed seeds its sampler
