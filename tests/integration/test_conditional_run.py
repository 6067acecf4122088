"""A conditional grid through Ray Tune and MLflow: the inactive field is absent from the trial's MLflow
params and its default applies; the results table leaves it empty."""

import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.study.validate import validate
from flatlab.tracking import runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_conditional_grid_runs_only_active_points_and_logs_only_active_params(tmp_path):
    import ray

    from flatlab.study.runner import RunOptions, run_study
    from flatlab.tracking.trials import trials_frame

    study = validate(
        Study(
            name="cond",
            workload="digits",
            workload_params={"width": 16},
            arms=(
                Arm(
                    "sgd",
                    space={
                        "lr": 0.1,
                        "momentum": sp.grid([0.0, 0.9]),
                        **sp.when("momentum", 0.9, {"nesterov": sp.grid([False, True])}),
                    },
                ),
            ),
            searcher="grid",
            max_epochs=1,
            scheduler="fifo",
            max_concurrent=2,
        )
    )
    try:
        outcome = run_study(study, RunOptions(root=tmp_path, num_cpus=2))
    finally:
        ray.shutdown()
    c = runs.client(outcome.tracking_uri)
    children = c.search_runs([outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'")
    got = sorted((r.data.params["momentum"], r.data.params.get("nesterov"), r.info.status) for r in children)
    assert got == [("0.0", None, "FINISHED"), ("0.9", "False", "FINISHED"), ("0.9", "True", "FINISHED")]
    df = trials_frame(outcome.tracking_uri, "cond")
    assert len(df) == 3 and df["param.nesterov"].isna().sum() == 1
