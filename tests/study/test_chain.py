"""Chained studies: ``sp.best_of`` resolved from a real SQLite MLflow store laid out as flatlab writes it
(one experiment per study, launch runs tagged ``flatlab.role=study``, trial runs nested under them)."""

import pytest
from mlflow.entities import Metric, Param
from typer.testing import CliRunner

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.cli.main import app
from flatlab.errors import ConfigError
from flatlab.study.chain import chained_params, describe_chained, parse_param, resolve_chained
from flatlab.study.space import BestOf, Fixed, Resolved
from flatlab.study.trial_spec import trial_spec
from flatlab.study.validate import validate
from flatlab.tracking import runs


def add_launch(uri, root, study, status, trials, metric="val/accuracy", mode="max", start=0):
    """One launch of ``study``: a parent run with ``status`` and one child per ``(arm, outcome, stage,
    value, params)``; returns ``(parent_id, [child ids])``."""
    exp = runs.get_or_create_experiment(uri, study, runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, start_time=start, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", metric), Param("mode", mode)])
    ids = []
    for arm, outcome, stage, value, params in trials:
        tags = {
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: arm,
            runs.TAG_OUTCOME: outcome,
            runs.TAG_STAGE: stage,
        }
        run = c.create_run(exp, start_time=start, tags=tags).info.run_id
        c.log_batch(
            run,
            metrics=[Metric(metric, value, 0, 1), Metric("epoch", 1, 0, 1)],
            params=[Param(k, str(v)) for k, v in {"arm": arm, **params}.items()],
        )
        c.set_terminated(run, "FINISHED" if outcome != "error" else "FAILED")
        ids.append(run)
    if status != "RUNNING":
        c.set_terminated(parent, status)
    return parent, ids


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    # the older, finished launch: tsam's best completed trial has lr 0.03 (a pruned trial scores higher,
    # a final-stage re-run higher still: neither is a candidate); erm has only a diverged trial
    _, old = add_launch(
        uri,
        root,
        "src",
        "FINISHED",
        [
            ("tsam", "completed", "search", 0.70, {"lr": 0.01, "rho": 0.05, "s": 3, "t_schedule": "constant"}),
            ("tsam", "completed", "search", 0.80, {"lr": 0.03, "rho": 0.1, "s": 5, "t_schedule": "increase"}),
            ("tsam", "pruned", "search", 0.95, {"lr": 0.3, "rho": 0.2, "s": 3, "t_schedule": "constant"}),
            ("tsam", "completed", "final", 0.99, {"lr": 1e-4, "rho": 0.2, "s": 3, "t_schedule": "constant"}),
            ("erm", "diverged", "search", 0.99, {"lr": 0.1}),
        ],
        start=1000,
    )
    # a newer launch that is still running (or was killed): never read
    add_launch(uri, root, "src", "RUNNING", [("tsam", "completed", "search", 0.9, {"lr": 0.5, "rho": 0.2})], start=2000)
    # a study minimising its metric: the lowest val/loss wins
    _, lm = add_launch(
        uri,
        root,
        "lm_src",
        "FINISHED",
        [
            ("adamw", "completed", "search", 3.2, {"lr": 1e-3}),
            ("adamw", "completed", "search", 2.9, {"lr": 6e-4}),
        ],
        metric="val/loss",
        mode="min",
        start=1000,
    )
    add_launch(uri, root, "unfinished", "KILLED", [("tsam", "completed", "search", 0.5, {"lr": 0.1})], start=1000)
    return uri, {"best_tsam": old[1], "best_lm": lm[1]}


def chained_study(**space):
    return Study(
        name="dst",
        workload="digits",
        arms=(Arm("tsam", space={"momentum": 0.9, **space}),),
        searcher="grid",
        scheduler="fifo",
        max_epochs=1,
        grace_period=1,
    )


def test_best_of_resolves_the_best_completed_search_trial_of_the_latest_finished_launch(store):
    uri, ids = store
    study = validate(
        chained_study(
            lr=sp.best_of("src", arm="tsam", param="lr"),
            rho=sp.best_of("src", "tsam", "rho"),
            s=sp.best_of("src", "tsam", "s"),
            t_schedule=sp.best_of("src", "tsam", "t_schedule"),
            t=sp.grid([1.0, 5.0]),
        )
    )
    assert study.num_total_trials() == 2  # a best_of is one grid value before it is resolved
    resolved = resolve_chained(study, uri)
    dims = resolved.arm("tsam").dims
    source = f"src/{ids['best_tsam']}"
    assert dims["lr"] == Resolved(0.03, source=source) and isinstance(dims["lr"], Fixed)
    assert dims["rho"].value == 0.1 and dims["s"].value == 5 and type(dims["s"].value) is int
    assert dims["t_schedule"].value == "increase" and dims["lr.source"] == Fixed(source)
    configs = resolved.grid(resolved.arm("tsam"))
    assert [(c["lr"], c["t"], c["lr.source"]) for c in configs] == [(0.03, 1.0, source), (0.03, 5.0, source)]
    spec = trial_spec(resolved, configs[0])
    assert spec.optimizer_params == {
        "momentum": 0.9,
        "lr": 0.03,
        "rho": 0.1,
        "s": 5,
        "t_schedule": "increase",
        "t": 1.0,
    }
    assert chained_params(resolved)["tsam.lr"] == "0.03" and chained_params(resolved)["tsam.lr.source"] == source
    assert study.arm("tsam").dims["lr"] == BestOf("src", "tsam", "lr")  # the study itself is unchanged


def test_where_restricts_the_candidates_to_trials_with_those_params(store):
    uri, _ = store
    # at s = 3 the completed trial has lr 0.01: the pruned s = 3 trial and the final-stage re-run never compete
    study = chained_study(
        lr=sp.best_of("src", "tsam", "lr", where={"s": 3}),
        rho=sp.best_of("src", "tsam", "rho", where={"s": 3.0, "t_schedule": "constant"}),
    )
    dims = resolve_chained(study, uri).arm("tsam").dims
    assert (dims["lr"].value, dims["rho"].value) == (0.01, 0.05)
    with pytest.raises(ConfigError, match=r"field 'lr': .*where=\{'s': 7\}.*no trial of arm 'tsam' with s=7$"):
        resolve_chained(chained_study(lr=sp.best_of("src", "tsam", "lr", where={"s": 7})), uri)
    with pytest.raises(
        ConfigError, match=r"no trial of arm 'erm' with lr=0.1 completed \(pruned, diverged or failed\)"
    ):
        resolve_chained(chained_study(lr=sp.best_of("src", "erm", "lr", where={"lr": 0.1})), uri)


def test_best_of_follows_the_source_studys_mode_and_gives_the_run_without_param(store):
    uri, ids = store
    study = Study(
        name="dst2", workload="digits", arms=(Arm("adamw", space={"lr": sp.best_of("lm_src", "adamw", "lr")}),)
    )
    assert resolve_chained(study, uri).arm("adamw").dims["lr"].value == 6e-4  # val/loss 2.9 < 3.2
    from flatlab.study.chain import resolve_one

    assert resolve_one(BestOf("lm_src", "adamw"), uri).value == f"run:{ids['best_lm']}"


def test_a_study_without_chained_values_is_returned_as_it_is_without_a_store(tmp_path):
    study = chained_study(lr=0.1)
    assert resolve_chained(study, f"sqlite:///{tmp_path / 'none.db'}") is study
    assert not (tmp_path / "none.db").exists()


def test_missing_or_unfinished_sources_are_one_clear_error(store, tmp_path):
    uri, _ = store
    study = chained_study(
        lr=sp.best_of("missing", "tsam", "lr"),
        rho=sp.best_of("unfinished", "tsam", "rho"),
        s=sp.best_of("src", "erm", "s"),
        t=sp.best_of("src", "sam", "t"),
        momentum=sp.best_of("src", "tsam", "momentum"),
    )
    with pytest.raises(ConfigError) as info:
        resolve_chained(study, uri)
    text = str(info.value)
    assert text.startswith("chained values cannot be resolved (nothing was started):")
    assert "arm 'tsam', field 'lr': best_of('missing', arm='tsam', param='lr'): no study 'missing' in" in text
    assert (
        "field 'rho'" in text and "study 'unfinished' has no FINISHED launch" in text and "newest first: KILLED" in text
    )
    assert "field 's'" in text and "no trial of arm 'erm' completed" in text
    assert "no trial of arm 'sam'; its arms: erm, tsam" in text
    assert "has no param 'momentum'; its params: lr, rho, s, t_schedule" in text
    with pytest.raises(ConfigError, match=r"field 'lr': best_of\('src', .*\): no MLflow store at .*none.db"):
        resolve_chained(chained_study(lr=sp.best_of("src", "tsam", "lr")), f"sqlite:///{tmp_path / 'none.db'}")
    with pytest.raises(ConfigError, match=r"names this study itself; chain to an earlier study"):
        resolve_chained(chained_study(lr=sp.best_of("dst", "tsam", "lr")), uri)


def test_a_value_the_field_does_not_allow_and_bad_best_of_arguments():
    from flatlab.hparams import HParam

    with pytest.raises(ConfigError, match=r"where: s=2.5 is not allowed; expected int in"):
        parse_param("2.5", HParam("s", 3, int, low=1), "where")
    assert (
        parse_param("True", HParam("f", False, bool), "") is True
        and parse_param("None", HParam("g", None, float, nullable=True), "") is None
    )
    with pytest.raises(
        ConfigError, match=r"arm 'tsam', field 'lr': best_of\(study, arm, param\): study=''; expected a study name"
    ):
        validate(chained_study(lr=sp.best_of("", "tsam", "lr")))
    with pytest.raises(ConfigError, match=r"is resolved at launch .* not sampled"):
        sp.best_of("src", "tsam", "lr").to_optuna()


def test_run_study_raises_before_anything_starts(tmp_path):
    from flatlab.study.runner import RunOptions, run_study

    with pytest.raises(ConfigError, match=r"no MLflow store at|no study 'missing'"):
        run_study(chained_study(lr=sp.best_of("missing", "tsam", "lr")), RunOptions(root=tmp_path))
    assert not (tmp_path / "dst" / "launch.json").exists()


def test_dry_run_says_what_it_would_resolve(store, tmp_path, monkeypatch):
    uri, ids = store
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    f = tmp_path / "chained.py"
    f.write_text(
        "from flatlab import Arm, Study\nfrom flatlab import space as sp\n"
        "STUDY = Study(name='dst', workload='digits', arms=(Arm('sgd', space={'lr': sp.best_of('src', 'tsam', 'lr'), "
        "'momentum': sp.best_of('missing', 'sgd', 'momentum')}),), searcher='grid', scheduler='fifo', max_epochs=1)\n"
    )
    res = CliRunner().invoke(app, ["run", str(f), "--dry-run", "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert (
        f"chained: arm 'sgd', lr = best_of('src', arm='tsam', param='lr'), resolved at launch; now 0.03 from "
        f"src/{ids['best_tsam']}"
    ) in out
    assert (
        "chained: arm 'sgd', momentum = best_of('missing', arm='sgd', param='momentum'), resolved at launch; "
        "not available now: no study 'missing' in" in out
    )
    assert describe_chained(chained_study(lr=0.1), uri) == []


def test_clip_references_read_the_same_latest_finished_launch(store):
    from flatlab.study.chain import find_trial_run

    uri, ids = store
    assert find_trial_run(uri, "src", "tsam", {"lr": "0.03"}).info.run_id == ids["best_tsam"]
    with pytest.raises(
        ConfigError, match=r"no FINISHED trial of study 'src', arm 'tsam' \(latest finished launch\) has lr=0.5"
    ):
        find_trial_run(uri, "src", "tsam", {"lr": "0.5"})  # only in the newer launch, still running
    with pytest.raises(ConfigError, match=r"study 'unfinished' has no FINISHED launch"):
        find_trial_run(uri, "unfinished", "tsam", {})


def test_a_source_of_several_tunings_is_one_pool_of_their_search_trials(tmp_path):
    """The documented rule for ``best_of`` over a multi-tuning study: every search trial of the arm, all
    tunings together, ranked by the one rule; the best here is in tuning 2 (a final-stage trial of tuning
    1 scores higher still and is never a candidate)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trials = [
        ("sgd", "completed", "search", 0.80, {"lr": 0.1}),
        ("sgd", "completed", "search", 0.85, {"lr": 0.2}),
        ("sgd", "completed", "search", 0.90, {"lr": 0.3}),
        ("sgd", "completed", "search", 0.70, {"lr": 0.4}),
        ("sgd", "completed", "final", 0.99, {"lr": 0.2}),
    ]
    _, ids = add_launch(uri, tmp_path, "multi", "FINISHED", trials)
    client = runs.client(uri)
    for run_id, tuning in zip(ids, (1, 1, 2, 2, 1)):
        client.set_tag(run_id, runs.TAG_TUNING, str(tuning))
    resolved = resolve_chained(validate(chained_study(lr=sp.best_of("multi", arm="sgd", param="lr"))), uri)
    assert resolved.arm("tsam").dims["lr"] == Resolved(0.3, source=f"multi/{ids[2]}")
