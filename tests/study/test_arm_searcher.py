"""ArmSearcher tells Optuna what happened to each trial, links it to MLflow, and keeps JSON state."""

import json
import os
import pickle

import optuna
import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.analysis.selection import trial_outcome
from flatlab.errors import ConfigError
from flatlab.study.searchers import ArmSearcher, FixedSearcher
from flatlab.study.validate import validate

METRIC = "val/accuracy"


def study(**kw):
    arms = (Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5)}), Arm("adamw", space={"lr": sp.loguniform(1e-4, 1e-2)}))
    return validate(Study(name="s", workload="digits", arms=arms, num_trials=3, max_epochs=4, **kw))


def drive(searcher):
    """Two arms x 3 trials: per arm one completed, one pruned (stopped by the scheduler at epoch 2) and,
    for sgd a diverged trial, for adamw an errored one. Returns trial id -> (arm, expected state)."""
    expected = {}
    for n in range(6):
        tid = f"t{n}"
        config = searcher.suggest(tid)
        arm, kind = config["arm"], ("completed", "pruned", "failed")[n // 2]
        for epoch in range(1, 2 if kind != "completed" else 4):
            searcher.on_trial_result(tid, {"epoch": epoch, METRIC: 0.1 * epoch + 0.01 * n})
        if kind == "completed":
            searcher.on_trial_complete(tid, {"epoch": 4, METRIC: 0.5 + 0.01 * n, "completed": 1, "diverged": 0})
            expected[tid] = (arm, "COMPLETE", 0.5 + 0.01 * n)
        elif kind == "pruned":
            searcher.on_trial_complete(tid, {"epoch": 2, METRIC: 0.3, "diverged": 0})
            expected[tid] = (arm, "PRUNED", None)
        elif arm == "sgd":
            searcher.on_trial_complete(tid, {"epoch": 2, METRIC: float("-inf"), "diverged": 1})
            expected[tid] = (arm, "FAIL", None)
        else:
            searcher.on_trial_complete(tid, None, error=True)
            expected[tid] = (arm, "FAIL", None)
    return expected


def test_optuna_states_values_intermediates_and_links(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    s = ArmSearcher(study(), optuna_storage=storage, launch="L")
    s.run_id_of = lambda tid: f"run-{tid}"
    expected = drive(s)
    for arm in ("sgd", "adamw"):
        st = optuna.load_study(study_name=f"L.{arm}", storage=storage)
        assert st.metric_names == [METRIC] and st.direction == optuna.study.StudyDirection.MAXIMIZE
        assert len(st.trials) == 3
        for t in st.trials:
            tid = t.user_attrs["tune_trial_id"]
            want_arm, state, value = expected[tid]
            assert t.user_attrs["arm"] == want_arm == arm and t.user_attrs["mlflow_run_id"] == f"run-{tid}"
            assert t.user_attrs["seed"] == 0
            assert t.state.name == state, tid
            if state == "COMPLETE":
                assert t.value == pytest.approx(value)
                assert sorted(t.intermediate_values) == [1, 2, 3, 4] and t.intermediate_values[4] == pytest.approx(
                    value
                )
            if state == "PRUNED":
                assert sorted(t.intermediate_values) == [1, 2]  # the result ASHA stopped it at is recorded
        best = st.best_trial
        assert best.state.name == "COMPLETE"  # a pruned trial can never be Optuna's best


def test_state_round_trips_as_json_and_pickle_is_refused(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    s = ArmSearcher(study(), optuna_storage=storage, launch="L")
    for n in range(3):
        s.suggest(f"t{n}")
    s.on_trial_result("t0", {"epoch": 1, METRIC: 0.2})
    path = tmp_path / "searcher-state"
    s.save(str(path))
    state = json.loads(path.read_text())  # plain JSON
    assert state["_count"] == {"sgd": 2, "adamw": 1}
    fresh = ArmSearcher(study(), optuna_storage=storage, launch="L")
    fresh.restore(str(path))
    assert fresh._count == s._count and fresh._optuna == s._optuna
    fresh.on_trial_result("t0", {"epoch": 1, METRIC: 0.9})  # a step already reported is skipped, not re-told
    fresh.on_trial_result("t0", {"epoch": 2, METRIC: 0.4})
    fresh.on_trial_complete("t0", {"epoch": 4, METRIC: 0.5, "completed": 1})
    t0 = optuna.load_study(study_name="L.sgd", storage=storage).trials[0]
    assert t0.intermediate_values == {1: 0.2, 2: 0.4, 4: 0.5} and t0.state.name == "COMPLETE"

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ConfigError, match="not a flatlab searcher state"):
        fresh.restore(str(evil))
    assert not marker.exists()


def test_trial_outcome_rule():
    assert trial_outcome({"completed": 1, METRIC: 0.5}, False, METRIC) == "completed"
    assert trial_outcome({"completed": 1, METRIC: float("nan")}, False, METRIC) == "diverged"
    assert trial_outcome({"diverged": 1, METRIC: float("-inf")}, False, METRIC) == "diverged"
    assert trial_outcome({METRIC: 0.5, "epoch": 2}, False, METRIC) == "pruned"
    assert trial_outcome({"completed": 1, METRIC: 0.5}, True, METRIC) == "error"


def test_fixed_searcher_hands_out_its_configs_then_finishes(tmp_path):
    configs = [{"arm": "sgd", "seed": s, "lr": 0.1, "stage": "final"} for s in (1, 2)]
    f = FixedSearcher(configs, METRIC, "max")
    assert f.suggest("a") == configs[0]
    f.save(str(tmp_path / "st"))
    g = FixedSearcher([], METRIC, "max")
    g.restore(str(tmp_path / "st"))
    assert g.suggest("b") == configs[1] and g.suggest("c") == "FINISHED"


def test_an_errored_trial_resumed_to_completion_is_a_new_optuna_trial(tmp_path):
    """Tune resumes errored trials (--resume): the first attempt stays FAIL in Optuna, the attempt that
    completes is recorded as a new trial with the same params, its intermediate values and retry_of."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    s = ArmSearcher(study(), optuna_storage=storage, launch="L")
    s.run_id_of = lambda tid: f"run-{tid}"
    config = s.suggest("t0")
    s.on_trial_result("t0", {"epoch": 1, METRIC: 0.3})
    s.on_trial_complete("t0", None, error=True)
    s.on_trial_result("t0", {"epoch": 2, METRIC: 0.4})  # resumed from its epoch-1 checkpoint
    s.on_trial_complete("t0", {"epoch": 4, METRIC: 0.6, "completed": 1})
    trials = optuna.load_study(study_name="L.sgd", storage=storage).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    first, retry = trials
    assert first.intermediate_values == {1: 0.3}
    assert retry.params == first.params == {"lr": config["lr"]} and retry.value == pytest.approx(0.6)
    assert retry.intermediate_values == {2: 0.4, 4: 0.6} and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["mlflow_run_id"] == "run-t0" and retry.user_attrs["tune_trial_id"] == "t0"


def test_a_trial_asked_just_before_the_driver_died_is_taken_over_not_doubled(tmp_path):
    """SIGKILL right after Optuna's ``ask()`` (before the trial's attributes were written) leaves a RUNNING
    trial with no launch attribute: the resumed searcher takes it over (its drawn lr comes back) and sets
    the missing attributes, so the arm still holds num_trials trials and none stays RUNNING."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = ArmSearcher(study(), optuna_storage=storage, launch="L", experiment="E")
    done = first.suggest("t0")  # sgd
    first.on_trial_complete("t0", {"epoch": 4, METRIC: 0.6, "completed": 1})
    st = first._studies["adamw"]
    bare = st.ask()  # ... and the driver dies here
    lr = bare.suggest_float("lr", 1e-4, 1e-2, log=True)
    other = optuna.create_study(study_name="L.other", storage=storage)  # another study's RUNNING trial: not ours
    other.ask()

    second = ArmSearcher(study(), optuna_storage=storage, launch="L", experiment="E")  # nothing restored
    configs = [second.suggest(f"n{i}") for i in range(6)]
    assert second.suggest("n6") == ArmSearcher.FINISHED  # 3 per arm: none asked anew beyond them
    assert configs[0] == done  # the finished sgd trial is taken over too (its record stands)
    adamw = [c for c in configs if c["arm"] == "adamw"]
    assert adamw[0]["lr"] == lr
    trials = optuna.load_study(study_name="L.adamw", storage=storage).trials
    assert len(trials) == 3 and trials[0].number == bare.number
    assert trials[0].user_attrs["launch"] == "E" and trials[0].user_attrs["arm"] == "adamw"
    assert trials[0].user_attrs["tune_trial_id"] == "n1"
