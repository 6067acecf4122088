"""Steps-to-target and speed-up from MLflow loss curves (IRE paper, Fig. 4), on a temporary SQLite store:
logged on the trial runs and handed back in the launch's sample."""

import time

import pytest
from mlflow.entities import Metric

from flatlab import Arm, Study
from flatlab.reports import speedup as su
from flatlab.tracking import runs
from flatlab.tracking.artifacts import CURVE_METRIC
from flatlab.tracking.trials import read_sample

NAN = float("nan")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}", runs.artifact_location(root)


def new_launch(store, name):
    uri, art = store
    exp = runs.get_or_create_experiment(uri, name, art)
    parent = runs.client(uri).create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    return uri, exp, parent


def child(uri, exp, parent, arm, seed, curve, val_loss=None, status="FINISHED"):
    c = runs.client(uri)
    tags = {runs.PARENT: parent, runs.TAG_ROLE: "trial", runs.TAG_ARM: arm, runs.TAG_SEED: str(seed)}
    run_id = c.create_run(exp, tags=tags).info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(CURVE_METRIC, v, now, s) for s, v in curve]
    if val_loss is not None:
        metrics.append(Metric("val/loss", val_loss, now, 1))
    if metrics:
        c.log_batch(run_id, metrics=metrics)
    c.set_terminated(run_id, status=status)
    return run_id


def study(**kw):
    return Study(
        name="s",
        workload="digits",
        arms=(Arm("adamw"), Arm("sgd", name="fast"), Arm("sgd", name="slow")),
        metric="val/loss",
        mode="min",
        seeds=(0, 1, 2),
        **kw,
    )


def steps_to_target(uri, name, parent, study_, sample=None):
    """``log_steps_to_target`` on the sample of launch ``parent`` of experiment ``name``, read here unless given."""
    sample = sample if sample is not None else read_sample(uri, name, launch=parent)
    return su.log_steps_to_target(uri, parent, study_, sample)


def columns(sample, run_ids):
    """The two logged metrics of each run in ``sample`` as text (``nan``: none)."""
    df = sample.trials.set_index("run_id")
    return str(
        {
            r: tuple(float(df.loc[r, c]) if c in df.columns else NAN for c in (su.STEPS_METRIC, su.SPEEDUP_METRIC))
            for r in run_ids
        }
    )


def logged(uri, run_id):
    r = runs.client(uri).get_run(run_id)
    return {k: v for k, v in r.data.metrics.items() if k in (su.STEPS_METRIC, su.SPEEDUP_METRIC)}, r.data.tags.get(
        su.TAG_REACHED
    )


def test_speedup_against_the_best_reference_trial_of_each_seed(store):
    uri, exp, parent = new_launch(store, "ref")
    # seed 0: two reference trials; the best by val/loss (min) is A, whose final smoothed loss is 1.1 over 10 steps
    ref_a = child(uri, exp, parent, "adamw", 0, [(1, 3.0), (2, 2.0), (4, 1.5), (8, 1.2), (10, 1.1)], val_loss=0.5)
    ref_b = child(
        uri, exp, parent, "adamw", 0, [(1, 3.0), (5, 1.05), (10, 0.9)], val_loss=0.7
    )  # lower loss, worse metric
    fast = child(uri, exp, parent, "fast", 0, [(2, 2.5), (4, 1.1), (6, 1.0)], val_loss=0.4)
    slow = child(uri, exp, parent, "slow", 0, [(5, 2.0), (10, 1.5)], val_loss=0.9)
    killed = child(uri, exp, parent, "fast", 0, [(1, 0.1)], val_loss=0.1, status="KILLED")
    no_curve = child(uri, exp, parent, "fast", 0, [], val_loss=0.3)
    # seed 1: reference C (final 1.0 over 3 steps); seed 2: no reference trial at all
    ref_c = child(uri, exp, parent, "adamw", 1, [(1, 2.0), (3, 1.0)], val_loss=0.4)
    fast1 = child(uri, exp, parent, "fast", 1, [(1, 1.0), (2, 0.5)], val_loss=0.3)
    orphan = child(uri, exp, parent, "fast", 2, [(1, 1.0)], val_loss=0.3)
    _, _, other_parent = new_launch(store, "ref")
    other = child(uri, exp, other_parent, "fast", 0, [(1, 0.5)], val_loss=0.1)

    sample, out = steps_to_target(uri, "ref", parent, study(reference_arm="adamw"))

    assert out["errors"] == []
    assert out["targets"] == {
        0: {"target": 1.1, "reference_run": ref_a, "reference_steps": 10},
        1: {"target": 1.0, "reference_run": ref_c, "reference_steps": 3},
    }
    assert logged(uri, fast) == ({"train/steps_to_target": 4.0, "train/speedup": 2.5}, "true")
    assert logged(uri, ref_a) == ({"train/steps_to_target": 10.0, "train/speedup": 1.0}, "true")
    assert logged(uri, ref_b) == ({"train/steps_to_target": 5.0, "train/speedup": 2.0}, "true")
    assert logged(uri, fast1) == ({"train/steps_to_target": 1.0, "train/speedup": 3.0}, "true")
    assert logged(uri, slow) == ({}, "false")  # never reached: a tag, no metric
    for untouched in (killed, no_curve, orphan, other):
        assert logged(uri, untouched) == ({}, None)
    assert out["runs"][fast] == {"arm": "fast", "seed": 0, "steps_to_target": 4, "speedup": 2.5}
    assert out["runs"][slow]["steps_to_target"] is None and set(out["runs"]) == {ref_a, ref_b, fast, slow, ref_c, fast1}
    assert set(out["skipped"]) == {no_curve, orphan}
    history = runs.client(uri).get_metric_history(parent, su.TARGET_METRIC)
    assert sorted((m.step, m.value) for m in history) == [(0, 1.1), (1, 1.0)]
    # the sample handed back holds what was logged, as the sample read after the logging does
    assert columns(sample, [fast, slow]) == str({fast: (4.0, 2.5), slow: (NAN, NAN)})
    ids = [ref_a, ref_b, fast, slow, killed, no_curve, ref_c, fast1, orphan]
    reread = read_sample(uri, "ref", launch=parent)
    assert columns(sample, ids) == columns(reread, ids)
    assert list(sample.trials["run_id"]) == list(reread.trials["run_id"]) and sample.trials.attrs == reread.trials.attrs


def test_fixed_target_logs_steps_only(store):
    uri, exp, parent = new_launch(store, "fixed")
    a = child(uri, exp, parent, "adamw", 0, [(1, 3.0), (2, 2.0), (4, 1.5), (8, 1.2)], val_loss=0.5)
    b = child(uri, exp, parent, "fast", 1, [(2, 2.5), (4, 1.1)], val_loss=0.4)
    sample, out = steps_to_target(uri, "fixed", parent, study(target_loss=1.5))
    assert columns(sample, [a, b]) == str({a: (4.0, NAN), b: (4.0, NAN)}) == columns(read_sample(uri, "fixed"), [a, b])
    assert logged(uri, a) == ({"train/steps_to_target": 4.0}, "true")
    assert logged(uri, b) == ({"train/steps_to_target": 4.0}, "true")
    assert out["targets"] == {
        0: {"target": 1.5, "reference_run": None, "reference_steps": None},
        1: {"target": 1.5, "reference_run": None, "reference_steps": None},
    }
    history = runs.client(uri).get_metric_history(parent, su.TARGET_METRIC)
    assert sorted((m.step, m.value) for m in history) == [(0, 1.5), (1, 1.5)]
    untouched, out = steps_to_target(uri, "fixed", parent, study(), sample)
    assert untouched is sample and out == {"targets": {}, "runs": {}, "skipped": {}, "errors": []}


def test_an_mlflow_failure_on_one_run_does_not_stop_the_others(store, monkeypatch):
    uri, exp, parent = new_launch(store, "hiccup")
    ref = child(uri, exp, parent, "adamw", 0, [(1, 2.0), (2, 1.0)], val_loss=0.5)
    bad = child(uri, exp, parent, "fast", 0, [(1, 1.0)], val_loss=0.4)
    real = runs.client

    class Flaky:
        def __init__(self, c):
            self.c = c

        def __getattr__(self, name):
            return getattr(self.c, name)

        def get_metric_history(self, run_id, key):
            if run_id == bad:
                raise ConnectionError("tracking server went away")
            return self.c.get_metric_history(run_id, key)

    sample = read_sample(uri, "hiccup", launch=parent)
    monkeypatch.setattr(su.runs, "client", lambda u: Flaky(real(u)))
    _, out = su.log_steps_to_target(uri, parent, study(reference_arm="adamw"), sample)
    assert len(out["errors"]) == 1 and "tracking server went away" in out["errors"][0] and bad in out["errors"][0]
    assert out["runs"][ref]["steps_to_target"] == 2 and bad not in out["runs"]
    monkeypatch.setattr(su.runs, "client", lambda u: (_ for _ in ()).throw(ConnectionError("down")))
    same, out = su.log_steps_to_target(uri, parent, study(reference_arm="adamw"), sample)
    assert same is sample and out["errors"] == [f"opening the tracking store of run {parent}: down"]


def test_a_launchs_sample_has_only_the_parameters_its_trials_have(store):
    # a declared report picks its x-axis by the param.* columns present (toy_figure: kappa, then t)
    uri, exp, first = new_launch(store, "two_launches")
    old = child(uri, exp, first, "sgd", 0, [(1, 1.0)], val_loss=0.5)
    runs.client(uri).log_param(old, "kappa", "2.0")
    _, _, second = new_launch(store, "two_launches")
    new = child(uri, exp, second, "sgd", 0, [(1, 1.0)], val_loss=0.4)
    runs.client(uri).log_param(new, "t", "1.0")
    both = read_sample(uri, "two_launches", all_launches=True).trials
    assert {"param.kappa", "param.t"} <= set(both.columns)
    latest = read_sample(uri, "two_launches", launch=second).trials
    assert list(latest["run_id"]) == [new] and "param.kappa" not in latest.columns
    assert latest["param.t"].tolist() == [1.0]
