"""Early stopping within each arm only: ArmScheduler routes every trial to its own arm's ASHA."""

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.study.schedulers import ArmScheduler, build_scheduler

MAX_T, GRACE, RF = 9, 1, 3


def asha(_arm=None):
    return ASHAScheduler(time_attr="training_iteration", max_t=MAX_T, grace_period=GRACE, reduction_factor=RF)


def curve(arm, i, epoch):
    """Validation accuracy of trial i of an arm at an epoch: 'fast' starts high, 'slow' starts low and
    climbs late (a flat-minima optimizer against AdamW); i orders the trials of an arm."""
    if arm == "fast":
        return 0.80 + 0.01 * i + 0.001 * epoch
    return 0.10 + 0.01 * i + 0.09 * epoch


def run(scheduler, trials, ctrl=None):
    """Feed results epoch by epoch, trials interleaved as Tune would with all of them running; returns
    trial -> the epoch it ended at (stopped or completed)."""
    ended = {}
    for t in trials:
        scheduler.on_trial_add(ctrl, t)
    for epoch in range(1, MAX_T + 1):
        for t in trials:
            if t in ended:
                continue
            arm, i = t.config["arm"], t.config["i"]
            result = {"training_iteration": epoch, "val/accuracy": curve(arm, i, epoch)}
            if epoch == MAX_T:
                scheduler.on_trial_complete(ctrl, t, result)
                ended[t] = epoch
            elif scheduler.on_trial_result(ctrl, t, result) == TrialScheduler.STOP:
                scheduler.on_trial_complete(ctrl, t, result)
                ended[t] = epoch
    return ended


def make_trials():
    return [Trial("__fake", config={"arm": arm, "i": i}, stub=True) for i in range(6) for arm in ("fast", "slow")]


def test_one_shared_asha_prunes_the_slow_arm_entirely():
    shared = asha()
    shared.set_search_properties("val/accuracy", "max")
    ended = run(shared, make_trials())
    slow_completed = [t for t, e in ended.items() if t.config["arm"] == "slow" and e == MAX_T]
    assert slow_completed == []  # the failure the router exists for


def test_each_arm_gets_exactly_what_asha_on_that_arm_alone_gives():
    routed = ArmScheduler(["fast", "slow"], asha, metric="val/accuracy", mode="max")
    trials = make_trials()
    ended = run(routed, trials)
    for arm in ("fast", "slow"):
        alone = asha()
        alone.set_search_properties("val/accuracy", "max")
        mine = [Trial("__fake", config=dict(t.config), stub=True) for t in trials if t.config["arm"] == arm]
        ended_alone = run(alone, mine)
        got = sorted((t.config["i"], e) for t, e in ended.items() if t.config["arm"] == arm)
        want = sorted((t.config["i"], e) for t, e in ended_alone.items())
        assert got == want
        completed = [i for i, e in got if e == MAX_T]
        assert len(completed) >= 1, arm
    # each arm's rungs hold only its own trials
    for arm, sub in routed.arms.items():
        recorded = {tid for b in sub._brackets for rung in b._rungs for tid in rung[1]}
        own = {t.trial_id for t in trials if t.config["arm"] == arm}
        assert recorded and recorded <= own


def test_unknown_arm_is_a_clear_error():
    routed = ArmScheduler(["a"], asha, metric="val/accuracy", mode="max")
    with pytest.raises(KeyError, match="arm='b' is not one of a"):
        routed.on_trial_add(None, Trial("__fake", config={"arm": "b"}, stub=True))


def test_build_scheduler_per_study_setting():
    arms = (Arm("sgd", space={"lr": sp.loguniform(0.01, 0.1)}), Arm("adamw", space={"lr": 1e-3}))
    s = Study(name="s", workload="digits", arms=arms, max_epochs=8, grace_period=2, reduction_factor=2)
    sched = build_scheduler(s)
    assert isinstance(sched, ArmScheduler) and set(sched.arms) == {"sgd", "adamw"}
    sub = sched.arms["sgd"]
    assert isinstance(sub, ASHAScheduler) and sub._max_t == 8 and sub._metric == "val/accuracy"
    assert [r[0] for r in sub._brackets[0]._rungs] == [8, 4, 2]  # rungs at grace * rf**k (and max_t)
    fifo = build_scheduler(Study(name="s", workload="digits", arms=arms, scheduler="fifo"))
    assert isinstance(fifo, ArmScheduler) and all(type(sub) is FIFOScheduler for sub in fifo.arms.values())


def test_a_trial_that_ended_before_the_kill_gets_its_recorded_result_with_its_config():
    """A resume's trial whose run ended before the driver was killed: Tune's result for it is the recorded
    one, with the trial's config in it (``Result.config``, which the final stage picks configurations
    from); a trial Tune itself restored as TERMINATED keeps the result Tune saved."""
    from ray.tune import Result

    routed = ArmScheduler(["sgd"], asha, metric="val/accuracy", mode="max")
    asked = []
    recorded = {"epoch": 9, "training_iteration": 9, "val/accuracy": 0.9, "completed": 1}
    routed.recorded = lambda trial_id, config: asked.append((trial_id, config)) or dict(recorded)
    pending = Trial("__fake", config={"arm": "sgd", "lr": 0.1, "seed": 0}, stub=True)
    routed.on_trial_add(None, pending)
    result = Result(metrics=pending.last_result, checkpoint=None, error=None, path="")
    assert result.config == {"arm": "sgd", "lr": 0.1, "seed": 0}
    assert result.metrics["val/accuracy"] == 0.9 and result.metrics["completed"] == 1

    done = Trial("__fake", config={"arm": "sgd", "lr": 0.2, "seed": 0}, stub=True)
    done.set_status(Trial.TERMINATED)
    done.update_last_result(
        {"training_iteration": 9, "val/accuracy": 0.7, "completed": 1, "config": {"arm": "sgd", "lr": 0.2, "seed": 0}}
    )
    routed.on_trial_add(None, done)
    assert done.last_result["val/accuracy"] == 0.7 and done.last_result["config"]["lr"] == 0.2
    assert [trial_id for trial_id, _ in asked] == [pending.trial_id, done.trial_id]  # both counted as added
