"""``flatlab run FILE --resume`` of a launch that already finished: it says so, where the results are and
how to see them, exits 0, and neither runs the post-study steps nor logs anything to the launch's run."""

from mlflow.entities import Metric
from typer.testing import CliRunner

import flatlab.study.runner as runner_mod
from flatlab.cli.main import app
from flatlab.study.launches import Launch
from flatlab.tracking import runs

STUDY_FILE = """
from flatlab import Arm, Study
from flatlab import space as sp

STUDY = Study(
    name="fin",
    workload="digits",
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),),
    num_trials=1,
    max_epochs=1,
    seeds=(0,),
    final_seeds=(),
)
"""


def _finished_launch(root):
    """A store with the study's launch run (a metric, an artifact) and launch.json saying it finished."""
    uri = runs.default_tracking_uri(root)
    exp = runs.get_or_create_experiment(uri, "fin", runs.artifact_location(root))
    client = runs.client(uri)
    parent = client.create_run(exp, tags={runs.TAG_ROLE: "study", runs.TAG_STUDY: "fin"}).info.run_id
    client.log_batch(parent, metrics=[Metric("train/speedup", 1.0, 0, 0)])
    client.log_dict(parent, {"x": 1}, "plan.json")
    client.set_terminated(parent, status="FINISHED")
    Launch(
        path=root / "fin" / "launch.json",
        experiment_name="fin-1",
        parent_run_id=parent,
        experiment_id=exp,
        tracking_uri=uri,
        status="finished",
        overrides={"trials": None, "epochs": None, "final_seeds": None, "tunings": None, "scale": None},
    ).write()
    return client, parent


def _logged(client, parent):
    run = client.get_run(parent)
    return run.data.metrics, run.data.params, [a.path for a in client.list_artifacts(parent)], run.info.status


def test_resuming_a_finished_launch_does_nothing_and_says_where_its_results_are(tmp_path, monkeypatch):
    root = tmp_path / "root"
    study = tmp_path / "fin.py"
    study.write_text(STUDY_FILE)
    client, parent = _finished_launch(root)
    before = _logged(client, parent)

    def no_post_study(launched):
        raise AssertionError("post-study ran for a launch that had already finished")

    monkeypatch.setattr(runner_mod, "post_study", no_post_study)
    res = CliRunner().invoke(app, ["run", str(study), "--resume", "--root", str(root)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "fin: its latest launch already finished; nothing to resume" in text
    assert f"`flatlab compare fin --root {root}`" in text and f"MLflow run {parent}" in text
    assert "ran " not in text and "best trial per arm" not in text  # no launch summary
    assert len(res.output.strip().splitlines()) <= 4
    assert _logged(client, parent) == before
