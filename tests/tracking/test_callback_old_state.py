"""Tune pickles its callbacks into the experiment state: a state written before ``max_epochs`` was dropped
(flatlab.analysis.selection.trial_outcome decides outcomes now) must still unpickle on ``flatlab run --resume``."""

import pickle

import pytest

from flatlab.study.progress import ProgressPrinter
from flatlab.tracking.callback import MLflowTrialLogger

OLD_LOGGER = {
    "tracking_uri": "sqlite:///x.db",
    "experiment_id": "1",
    "parent_run_id": "p",
    "tags": {"k": "v"},
    "arm_optimizer": {"sgd": "sgd"},
    "max_epochs": 7,
    "metric": "val/accuracy",
    "mode": "max",
    "study": None,
}
OLD_PROGRESS = {"total": 5, "metric": "val/accuracy", "mode": "min", "every_s": 3.0, "max_epochs": 7}


def _old_pickle(cls, state, monkeypatch):
    """Bytes as the old code pickled them: the object's state dict still holds ``max_epochs``."""
    obj = cls.__new__(cls)
    obj.__setstate__({k: v for k, v in state.items() if k != "max_epochs"})
    monkeypatch.setattr(cls, "__getstate__", lambda self: dict(state))
    data = pickle.dumps(obj)
    monkeypatch.undo()
    return data


@pytest.mark.parametrize("cls,state", [(MLflowTrialLogger, OLD_LOGGER), (ProgressPrinter, OLD_PROGRESS)])
def test_old_state_with_max_epochs_unpickles(cls, state, monkeypatch):
    direct = cls.__new__(cls)
    direct.__setstate__(dict(state))
    loaded = pickle.loads(_old_pickle(cls, state, monkeypatch))
    expected = {k: v for k, v in state.items() if k != "max_epochs"}
    if cls is MLflowTrialLogger:  # nor did it hold the study's log file
        expected["log"] = None
    for obj in (direct, loaded):
        assert not hasattr(obj, "max_epochs")
        new = obj.__getstate__()
        assert new == expected
        assert "max_epochs" not in pickle.loads(pickle.dumps(obj)).__getstate__()


def test_new_pickled_state_has_no_max_epochs():
    cb = MLflowTrialLogger("sqlite:///x.db", "1", "p", {}, {"sgd": "sgd"}, metric="val/accuracy", mode="max")
    p = ProgressPrinter(5, "val/accuracy", "max", every_s=2.0)
    assert set(cb.__getstate__()) == {
        "tracking_uri",
        "experiment_id",
        "parent_run_id",
        "tags",
        "arm_optimizer",
        "metric",
        "mode",
        "study",
        "log",
    }
    assert p.__getstate__() == {"total": 5, "metric": "val/accuracy", "mode": "max", "every_s": 2.0}
    back = pickle.loads(pickle.dumps(p))
    assert (back.total, back.mode, back.every_s) == (5, "max", 2.0) and back.status().endswith("best val/accuracy -")
    with pytest.raises(TypeError, match="max_epochs"):
        ProgressPrinter(5, "val/accuracy", "max", max_epochs=3)
