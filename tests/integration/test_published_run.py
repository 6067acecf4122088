"""A study that declares a published reference, end to end: a grid of fixed configurations over seeds
through Ray Tune (digits, 2 CPUs) with ``test_every_epoch``; the launch records the reference, logs
the comparison after the trials, and ``flatlab curves`` finds it by the study's name."""

import io
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from flatlab.cli.main import app
from flatlab.tracking import runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 2
# A published curve for arm "sgd": two runs whose test accuracy spans [0, 1] after every epoch (flatlab's
# mean is inside whatever it is) and whose test loss is impossibly low (flatlab's mean is above it).
CURVES = {
    "format": "flatlab-published-curves",
    "version": 1,
    "title": "digits toy",
    "citation": "nobody, never",
    "source": "hand-made",
    "first_epoch": 0,
    "metrics": {"acc": "test/accuracy", "loss": "test/loss"},
    "curves": {
        "digits/sgd": {
            "runs": [
                {"seed": 1, "values": {"acc": [0.1, 0.0, 0.0, 0.0], "loss": [2.3, 1e-9, 1e-9, 1e-9]}},
                {"seed": 2, "values": {"acc": [0.1, 1.0, 1.0, 1.0], "loss": [2.3, 2e-9, 2e-9, 2e-9]}},
            ]
        }
    },
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    import ray

    from flatlab.study.loader import load_studies
    from flatlab.study.runner import RunOptions, run_study

    root = tmp_path_factory.mktemp("root")
    folder = tmp_path_factory.mktemp("studies")
    (folder / "curves.json").write_text(json.dumps(CURVES))
    (folder / "pub.py").write_text(
        "from flatlab import Arm, Published, Study\n"
        "STUDY = Study(name='pub', workload='digits', workload_params={'width': 16},\n"
        "              arms=(Arm('sgd', space={'lr': 0.1}), Arm('adamw', space={'lr': 3e-3})),\n"
        f"              train={{'test_every_epoch': True}}, searcher='grid', scheduler='fifo', max_epochs={EPOCHS},\n"
        "              seeds=(1, 2), max_concurrent=2, "
        "published=Published('curves.json', arms={'sgd': 'digits/sgd'}))\n"
    )
    study = load_studies(str(folder / "pub.py"))[0]
    outcome = run_study(study, RunOptions(root=root, num_cpus=2, source=str(folder / "pub.py"), log_models=False))
    ray.shutdown()
    return root, folder, outcome


def test_every_epoch_is_logged_and_the_reference_recorded(launched):
    root, folder, outcome = launched
    assert not outcome.interrupted and outcome.num_errors == 0
    client = runs.client(outcome.tracking_uri)
    parent = client.get_run(outcome.parent_run_id)
    assert json.loads(parent.data.params["published"]) == {
        "path": str(folder / "curves.json"),
        "arms": {"sgd": "digits/sgd"},
        "citation": "nobody, never",
    }
    children = client.search_runs(
        [outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'"
    )
    assert len(children) == 4
    for r in children:
        assert r.data.params["train.test_every_epoch"] == "True"
        steps = sorted(m.step for m in client.get_metric_history(r.info.run_id, "test/accuracy"))
        assert steps == list(range(1, EPOCHS + 1))  # once per epoch, the last one not twice
    md = open(client.download_artifacts(outcome.parent_run_id, "published/curves.md")).read()
    assert (
        "sgd vs digits/sgd, test/accuracy: inside the published range at 2 of 2 epochs; "
        "flatlab's interval overlaps it at 2 of 2." in md
    )


def test_flatlab_curves_finds_the_declared_reference(launched):
    root, _, outcome = launched
    res = CliRunner().invoke(app, ["curves", "pub", "--root", str(root), "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(io.StringIO(res.output))
    assert rows[["arm", "metric", "epoch", "n", "where"]].values.tolist() == [
        ["sgd", "test/accuracy", 1, 2, "inside"],
        ["sgd", "test/accuracy", 2, 2, "inside"],
        ["sgd", "test/loss", 1, 2, "above"],
        ["sgd", "test/loss", 2, 2, "above"],
    ]
    client = runs.client(outcome.tracking_uri)
    sgd = [
        r
        for r in client.search_runs(
            [outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'"
        )
        if r.data.tags[runs.TAG_ARM] == "sgd"
    ]
    final = sorted(r.data.metrics["test/accuracy"] for r in sgd)  # the last epoch's values
    assert rows.loc[(rows["metric"] == "test/accuracy") & (rows["epoch"] == EPOCHS), "mean"].item() == pytest.approx(
        sum(final) / 2
    )
