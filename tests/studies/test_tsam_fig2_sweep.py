"""TSAM Fig. 2 end to end: the smoke study trains ERM, SAM and TSAM, measures the sigma sweep, and the
figure's data logged on the launch run equal a direct computation on each trial's stored model."""

import math
from pathlib import Path

import pytest

from flatlab.study.loader import load_studies
from flatlab.tracking import runs
from flatlab.tracking.logged_model import download_weights

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STUDY_FILE = Path(__file__).resolve().parents[2] / "studies" / "tsam_fig2_flatness.py"


def test_figure_data_equal_a_direct_computation_on_the_stored_models(smoke_root, tmp_path):
    import pandas as pd
    from safetensors.torch import load_file

    from flatlab.sharpness import measure_subset
    from flatlab.sharpness.average import neighbourhood_loss
    from flatlab.study.runner import RunOptions, run_study
    from flatlab.workloads import build_workload

    study = load_studies(str(STUDY_FILE), "smoke")[0]
    outcome = run_study(study, RunOptions(root=smoke_root, num_cpus=2, source=str(STUDY_FILE), log_models=True))
    assert not outcome.interrupted and outcome.num_errors == 0
    client = runs.client(outcome.tracking_uri)
    logged = {a.path for a in client.list_artifacts(outcome.parent_run_id, "flatness_sweep")}
    assert logged == {
        "flatness_sweep/neighbourhood_loss_vs_sigma.csv",
        "flatness_sweep/neighbourhood_loss_vs_sigma.png",
    }
    table = pd.read_csv(
        client.download_artifacts(
            outcome.parent_run_id, "flatness_sweep/neighbourhood_loss_vs_sigma.csv", str(tmp_path)
        )
    )
    params = study.measures["neighbourhood_loss"]
    assert sorted(table["arm"].unique()) == ["erm", "sam", "tsam"] and sorted(table["sigma"].unique()) == sorted(
        params["sigmas"]
    )
    assert (table["seeds"] == 1).all()  # the smoke scale runs one seed

    wl = build_workload(study.workload, **dict(study.workload_params))
    subset = measure_subset(wl.load_data(study.seed).train, study.measure_examples, study.measure_seed)
    children = client.search_runs(
        [outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'"
    )
    assert len(children) == 3
    for run in children:
        arm = run.data.tags[runs.TAG_ARM]
        model = wl.build_model()
        path = download_weights(client, run.info.run_id, str(tmp_path / arm))
        model.load_state_dict(load_file(path))
        for sigma in params["sigmas"]:
            direct = neighbourhood_loss(
                model,
                subset,
                sigma=sigma,
                n_draws=params["draws"],
                seed=study.measure_seed,
                loss_fn=lambda out, y: wl.loss(out, y, 0.0),
            )
            row = table[(table["arm"] == arm) & (table["sigma"] == sigma)].iloc[0]
            assert math.isfinite(direct.mean)
            assert row["mean"] == pytest.approx(direct.mean, rel=1e-4), (arm, sigma)
            assert row["var"] == pytest.approx(direct.variance, rel=1e-3, abs=1e-9), (arm, sigma)
