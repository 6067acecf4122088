"""Batched reports (Tune's result buffering) through flatlab's trainable class: a batch ends at the
epochs where ASHA decides (the same rungs as Ray's ``ASHAScheduler``), at a checkpoint, at the end, when
its time is up; a trial that raises delivers the reports batched before the error, then fails with it.

``train_buffered`` is driven with a stand-in for ``Trainable.train`` (one result per call, as the
function trainable's session hands them over); no Ray process runs."""

from __future__ import annotations

import math

import pytest
from ray.tune.result import DONE, RESULT_DUPLICATE, SHOULD_CHECKPOINT, TRAINING_ITERATION

from flatlab import Arm, Study
from flatlab.study import trainable
from flatlab.study.schedulers import build_scheduler, decision_epochs
from flatlab.study.validate import validate
from flatlab.workloads import build_workload


def study(**kw) -> Study:
    base = dict(
        name="b",
        workload="digits",
        workload_params={"model": "mlp", "width": 8, "depth": 1},
        arms=(Arm("sgd", space={"lr": 0.05}),),
        num_trials=1,
        max_epochs=30,
    )
    return validate(Study(**{**base, **kw}))


@pytest.mark.parametrize(
    "max_epochs,grace,rf", [(9, 1, 3), (10, 2, 3), (27, 1, 3), (100, 2, 2), (5, 5, 3), (30, 2, 4), (81, 3, 3)]
)
def test_decision_epochs_are_ray_ashas_rungs(max_epochs, grace, rf):
    s = study(max_epochs=max_epochs, grace_period=grace, reduction_factor=rf, scheduler="asha")
    asha = build_scheduler(s).arms["sgd"]
    rungs = {math.ceil(m) for m, _ in asha._brackets[0]._rungs}  # Ray's own milestones
    assert decision_epochs(s) == rungs


def test_decision_epochs_by_hand_and_none_for_fifo():
    assert decision_epochs(study(max_epochs=30, grace_period=2, reduction_factor=3, scheduler="asha")) == {2, 6, 18}
    assert decision_epochs(study(scheduler="fifo")) == frozenset()


class Results:
    """``Trainable.train`` as the controller sees it: epoch ``i`` on the i-th call; ``raise_at`` raises."""

    def __init__(self, n: int, raise_at: int = 0, checkpoint_at=(), clock=None) -> None:
        self.n, self.raise_at, self.checkpoint_at, self.calls, self.clock = n, raise_at, set(checkpoint_at), 0, clock

    def __call__(self):
        self.calls += 1
        if self.clock is not None:
            self.clock[0] += 1.0  # each epoch takes one (fake) second
        if self.calls == self.raise_at:
            raise RuntimeError(f"injected failure at epoch {self.calls}")
        result = {TRAINING_ITERATION: self.calls, "epoch": self.calls}
        if self.calls in self.checkpoint_at:
            result[SHOULD_CHECKPOINT] = True
        if self.calls == self.n:
            result[RESULT_DUPLICATE] = True
        return result


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits", model="mlp", width=8, depth=1).load_data(0)


def trial_object(s: Study, data, train, **batch) -> object:
    cls = trainable.make_trainable(s, data, **{"buffer_s": 3600.0, **batch})
    obj = object.__new__(cls)  # only train_buffered runs: no Ray session, no actor
    obj.train = train
    return obj


def epochs(batch) -> list:
    return [r["epoch"] for r in batch]


def test_a_batch_ends_at_each_rung_and_at_the_end(digits):
    s = study(max_epochs=30, grace_period=2, reduction_factor=3, scheduler="asha")
    obj = trial_object(s, digits, Results(30))
    batches = []
    while not batches or not batches[-1][-1].get(RESULT_DUPLICATE):
        batches.append(obj.train_buffered(1000, 1.0))  # as Ray 2.60's controller calls it
    assert [epochs(b) for b in batches] == [[1, 2], [3, 4, 5, 6], list(range(7, 19)), list(range(19, 31))]
    assert trainable.make_trainable(s, digits).__name__ == "run_trial"  # Tune names trials after it


def test_a_batch_ends_at_a_checkpoint_and_when_its_time_is_up(digits, monkeypatch):
    clock = [0.0]
    from flatlab.study import ray_compat  # where the batching trainable lives

    monkeypatch.setattr(ray_compat.time, "time", lambda: clock[0])
    train = Results(30, checkpoint_at={2}, clock=clock)  # an epoch takes 1 s
    obj = trial_object(study(scheduler="fifo"), digits, train, buffer_s=2.5)
    assert epochs(obj.train_buffered(1000, 1.0)) == [1]  # the checkpoint travels alone, after the batch
    assert epochs(obj.train_buffered(1000, 1.0)) == [2]
    assert epochs(obj.train_buffered(1000, 1.0)) == [3, 4, 5]  # the result at or after 2.5 s goes too
    assert epochs(trial_object(study(scheduler="fifo"), digits, train, buffer_s=0.0).train_buffered()) == [6]
    assert epochs(trial_object(study(scheduler="fifo"), digits, train, max_batch=5).train_buffered()) == [
        7,
        8,
        9,
        10,
        11,
    ]


def test_a_checkpoint_first_in_its_batch_ends_it_there(digits):
    obj = trial_object(study(scheduler="fifo"), digits, Results(30, checkpoint_at={1, 5, 6}))
    assert [epochs(obj.train_buffered()) for _ in range(5)] == [[1], [2, 3, 4], [5], [6], list(range(7, 31))]


def test_a_reused_actor_forgets_what_it_held(digits, monkeypatch):
    from ray.tune.trainable.function_trainable import FunctionTrainable

    monkeypatch.setattr(FunctionTrainable, "reset_config", lambda self, config: True)
    obj = trial_object(study(scheduler="fifo"), digits, Results(30, raise_at=3))
    assert epochs(obj.train_buffered()) == [1, 2]
    assert obj.reset_config({}) is True
    obj.train = Results(30, checkpoint_at={3})
    assert epochs(obj.train_buffered()) == [1, 2]  # the next trial: no error left over from the last
    assert epochs(obj.train_buffered()) == [3]


def test_the_batch_limits_are_flatlabs_not_the_controllers(digits):
    # Ray 2.60's controller passes (buffer_length, buffer_time_s) to train_buffered(buffer_time_s,
    # max_buffer_length): with Ray's own method, max_buffer_length=1.0 ends every batch after one report
    obj = trial_object(study(scheduler="fifo"), digits, Results(30))
    assert epochs(obj.train_buffered(1000, 1.0)) == list(range(1, 31))


def test_a_done_result_ends_the_batch(digits):
    def train(state=[0]):  # noqa: B006 - the default list counts the calls
        state[0] += 1
        return {TRAINING_ITERATION: state[0], "epoch": state[0], DONE: state[0] == 2}

    obj = trial_object(study(scheduler="fifo"), digits, train)
    assert epochs(obj.train_buffered(1000, 1.0)) == [1, 2]


def test_an_error_delivers_the_batch_first_then_fails_the_trial(digits):
    # Ray's own train_buffered drops the batch when train() raises: epochs 1-4 would never reach MLflow
    obj = trial_object(study(scheduler="fifo"), digits, Results(30, raise_at=5))
    assert epochs(obj.train_buffered(1000, 1.0)) == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="injected failure at epoch 5"):
        obj.train_buffered(1000, 1.0)
    assert obj.train.calls == 5  # the failing epoch is not re-run by the second call


def test_an_error_with_nothing_batched_raises_at_once(digits):
    obj = trial_object(study(scheduler="fifo"), digits, Results(30, raise_at=1))
    with pytest.raises(RuntimeError, match="epoch 1"):
        obj.train_buffered(1000, 1.0)


def test_buffering_is_on_by_default():
    assert trainable.RESULT_BUFFER_S == 1.0 or "FLATLAB_RESULT_BUFFER_S" in __import__("os").environ
    assert trainable.tune_env(1.0)["TUNE_RESULT_BUFFER_LENGTH"] == "1000"
