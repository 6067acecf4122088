"""Several processes opening one new SQLite tracking store at once (a study starting while
``flatlab results`` or a second study reads the same root) all get a working store."""

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from flatlab.tracking import runs, store


def _open(uri, start, out):
    start.wait()
    try:
        c = runs.client(uri)
        c.create_experiment(f"e{mp.current_process().pid}")
        out.put("ok")
    except Exception as e:  # reported to the parent, which shows it
        out.put(f"{type(e).__name__}: {str(e)[:200]}")


def test_concurrent_first_opens_of_a_new_sqlite_store_all_succeed(tmp_path):
    # Without the lock, every one of 12 such opens (3 rounds of 4 processes) failed in MLflow's unlocked
    # schema migration (table ... already exists / duplicate column / alembic row mismatch).
    uri = runs.default_tracking_uri(tmp_path)
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(uri, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    time.sleep(6.0)  # every child has imported mlflow and waits at the start line
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok"] * 4, results
    assert len(runs.client(uri).search_experiments()) == 5  # Default + one per process


def test_sqlite_file_of_tracking_uris(tmp_path):
    assert runs.sqlite_file(runs.default_tracking_uri(tmp_path)) == (tmp_path / "mlflow.db").resolve()
    assert runs.sqlite_file("sqlite:///rel/x.db") == Path("rel/x.db")
    assert runs.sqlite_file("sqlite://") is None
    assert runs.sqlite_file("http://localhost:5000") is None
    assert runs.sqlite_file("postgresql://u@h/db") is None


def test_a_settled_store_is_stamped_and_a_stale_stamp_is_not_trusted(tmp_path, monkeypatch):
    import mlflow

    uri = runs.default_tracking_uri(tmp_path)
    db = runs.sqlite_file(uri)
    runs.client(uri)
    stamp = (tmp_path / "mlflow.db.schema").read_text()
    revision = store._alembic_revision(db)
    assert revision and stamp == f"mlflow {mlflow.__version__} schema {revision}"
    # a new process (no in-process memo) with the same MLflow opens without the lock
    monkeypatch.setattr(store, "_SCHEMA_READY", set())
    monkeypatch.setattr("filelock.FileLock.acquire", lambda *a, **k: (_ for _ in ()).throw(AssertionError("locked")))
    runs.client(uri)
    # the file replaced by a new, empty one: the stamp no longer matches, so the lock is taken again
    monkeypatch.setattr(store, "_SCHEMA_READY", set())
    db.unlink()
    assert store._alembic_revision(db) is None
    with pytest.raises(AssertionError, match="locked"):
        runs.client(uri)


def _race(flatlab_side, uris, barrier, out):
    """One side of the race: open each fresh store in ``uris`` at the barrier; ``flatlab_side`` goes through
    ``runs.client`` (and its lock), the other side is a plain ``MlflowClient``, as ``mlflow ui`` or a
    notebook would open it. Reports ``ok`` or the first error, with the round."""
    import random

    from mlflow.tracking import MlflowClient

    random.seed(1 if flatlab_side else 2)
    try:
        for i, uri in enumerate(uris):
            barrier.wait(timeout=120)
            time.sleep(random.uniform(0.0, 0.3))  # who starts first, and by how much, varies by round
            c = runs.client(uri) if flatlab_side else MlflowClient(tracking_uri=uri)
            c.create_experiment(f"{'flatlab' if flatlab_side else 'plain'}-{i}")
            c.search_experiments()
        out.put("ok")
    except Exception as e:  # reported to the parent, which shows it
        out.put(f"{'flatlab' if flatlab_side else 'plain MlflowClient'}, round {i}: {type(e).__name__}: {str(e)[:300]}")


@pytest.mark.slow
def test_a_plain_mlflow_client_opening_the_fresh_store_at_the_same_moment_breaks_neither(tmp_path):
    # Measured before the fix: an outside MlflowClient that created the schema first crashed the launch
    # (OperationalError: table online_scoring_configs already exists), and the other way round.
    rounds = 20
    uris = [runs.default_tracking_uri(tmp_path / f"r{i}") for i in range(rounds)]
    for i in range(rounds):
        (tmp_path / f"r{i}").mkdir()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(side, uris, barrier, out)) for side in (True, False)]
    for p in procs:
        p.start()
    results = [out.get(timeout=1200) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == ["ok", "ok"], results
    for uri in uris:  # nothing lost: both experiments of every round are there
        names = {e.name for e in runs.client(uri).search_experiments()}
        assert {n.split("-")[0] for n in names} == {"Default", "flatlab", "plain"}, names
