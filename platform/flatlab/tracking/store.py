"""The MLflow store of a study: where it lives (:func:`default_tracking_uri`), its clients
(:func:`client`: a SQLite file's schema created or upgraded once, under a file lock, while other processes
may open it too), experiments, trial runs found by id, and metrics logged in batches of MLflow's size."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from filelock import FileLock, Timeout

from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.tracking.layout import EXPERIMENT_KIND, PARENT, TAG_EXPERIMENT_KIND, TAG_TRIAL

mlflow = lazy("mlflow")
mlflow_db_utils = lazy("mlflow.store.db.utils")  # private, stable since MLflow 1.x
mlflow_exceptions = lazy("mlflow.exceptions")
mlflow_sqlalchemy_store = lazy("mlflow.store.tracking.sqlalchemy_store")
mlflow_store_tracking = lazy("mlflow.store.tracking")
mlflow_tracking = lazy("mlflow.tracking")
sqlalchemy_engine = lazy("sqlalchemy.engine")
sqlalchemy_exc = lazy("sqlalchemy.exc")

# MLflowClient.set_terminated prints "🏃 View run ... / 🧪 View experiment ..." to stdout for every run
# ended on an HTTP tracking server (mlflow/tracking/_tracking_service/client.py, _log_url), one pair per
# trial: flatlab's clients turn that off (the user may set it to "false" to have them back).
SUPPRESS_URL_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def default_tracking_uri(root: Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite file ``<root>/mlflow.db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{(root / 'mlflow.db').resolve()}"


def artifact_location(root: Path) -> str:
    """Artifact root for experiments created on a local SQLite store."""
    return (root / "mlartifacts").resolve().as_uri()


_SCHEMA_READY: set = set()  # SQLite URIs whose schema this process has already opened under the lock
SCHEMA_LOCK_TIMEOUT_S = 300.0


def sqlite_file(tracking_uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:`` tracking URI (``None`` for other stores and in-memory SQLite)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    database = sqlalchemy_engine.make_url(tracking_uri).database
    return Path(database) if database and database != ":memory:" else None


def holds_run(tracking_uri: str, run_id: str, experiment_id: str, timeout_s: float = 10.0) -> bool:
    """Whether the MLflow store at ``tracking_uri`` holds run ``run_id`` in experiment ``experiment_id``,
    i.e. it is the store that run was created in, at whatever address it is reached now (a tracking
    server started again on another host over the same backend store, as a SLURM job's head node changes
    between jobs).

    Creates nothing: a ``sqlite:`` URI whose file does not exist, and a URI that is neither SQLite nor
    ``http(s)://``, answer ``False`` without being opened. A server is asked once, without MLflow's
    retries, within ``timeout_s`` seconds. Any error (no answer, no such run) answers ``False``.
    """
    if tracking_uri.startswith("sqlite:"):
        db = sqlite_file(tracking_uri)
        if db is None or not db.is_file():
            return False
    elif not tracking_uri.startswith(("http://", "https://")):
        return False
    # MLflow reads these at each request; by default it retries a silent server for minutes
    limits = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(max(1.0, timeout_s)))}
    before = {key: os.environ.get(key) for key in limits}
    os.environ.update(limits)
    try:
        run = mlflow_tracking.MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
        return run.info.experiment_id == str(experiment_id)
    except Exception:  # noqa: BLE001 - unreachable, unknown run, malformed store: not this launch's store
        return False
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _alembic_revision(db: Path) -> Optional[str]:
    """The schema revision recorded in an MLflow SQLite file (``None``: no file, or no schema yet)."""
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
        try:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _schema_stamp(db: Path) -> Optional[str]:
    revision = _alembic_revision(db)
    return None if revision is None else f"mlflow {mlflow.__version__} schema {revision}"


def existing_store(tracking_uri: str) -> str:
    """``tracking_uri``, after checking that a SQLite store file exists (read-only commands must not
    create an empty store where the user mistyped the root). Other stores are returned unchecked.

    Raises:
        ConfigError: the URI names a SQLite file that does not exist.
    """
    db = sqlite_file(tracking_uri)
    if db is not None and not db.exists():
        raise ConfigError(
            f"no MLflow store at {db}: nothing has run under this root yet; pass --root (or set FLATLAB_ROOT) "
            "to the root a study ran with, or --tracking-uri / MLFLOW_TRACKING_URI for a tracking server"
        )
    return tracking_uri


def client(tracking_uri: str):
    """An ``MlflowClient`` for ``tracking_uri``.

    For a SQLite file, MLflow creates and migrates the schema on first open without any locking, so
    two processes opening a new file at once — a study starting while ``flatlab results``, a second
    study, the trials' own workers, ``mlflow ui`` or a notebook's ``MlflowClient`` open the same root —
    both run the migration and one of them fails (``table ... already exists``). So the first open in
    each process goes through :func:`_open_sqlite_store` under an inter-process file lock
    (``<db>.lock``; it orders flatlab's processes) unless the schema is known to be settled: the
    process that opened it under the lock leaves a stamp (``<db>.schema``: MLflow version and schema
    revision), and a process with the same MLflow version that finds the file at that revision opens
    it without waiting. Where no lock file can be made (a read-only directory) the store is opened as
    MLflow would.

    Raises:
        TimeoutError: another process held the lock for more than ``SCHEMA_LOCK_TIMEOUT_S`` seconds.
    """
    os.environ.setdefault(SUPPRESS_URL_ENV, "true")  # read at each set_terminated: no "View run" lines
    db = sqlite_file(tracking_uri)
    if db is None or tracking_uri in _SCHEMA_READY:
        return mlflow_tracking.MlflowClient(tracking_uri=tracking_uri)
    stamp_file = db.with_name(db.name + ".schema")
    try:
        settled = stamp_file.read_text() == _schema_stamp(db)
    except OSError:
        settled = False
    if settled:
        _SCHEMA_READY.add(tracking_uri)
        return mlflow_tracking.MlflowClient(tracking_uri=tracking_uri)

    lock = FileLock(f"{db}.lock", timeout=SCHEMA_LOCK_TIMEOUT_S)
    try:
        lock.acquire()
    except Timeout:
        raise TimeoutError(
            f"the MLflow store {db} stayed locked ({db}.lock) for {SCHEMA_LOCK_TIMEOUT_S:.0f} s by another "
            "process creating or migrating its schema"
        ) from None
    except OSError:
        lock = None  # no lock file possible here (read-only directory): open as MLflow would
    try:
        c = (
            _open_sqlite_store(tracking_uri, db)
            if lock is not None
            else mlflow_tracking.MlflowClient(tracking_uri=tracking_uri)
        )
        if lock is not None:
            stamp = _schema_stamp(db)
            if stamp is not None:
                stamp_file.write_text(stamp)
    finally:
        if lock is not None:
            lock.release()
    _SCHEMA_READY.add(tracking_uri)
    return c


SCHEMA_SETTLE_S = 10.0  # a store file nobody has changed for this long is opened as it is
SCHEMA_OPEN_TRIES = 3


def _open_sqlite_store(tracking_uri: str, db: Path):
    """Open the SQLite store ``db`` for the first time in this process, safe against any other process
    opening it at the same moment, flatlab's or not (its lock only orders flatlab's own processes):

    * a missing file is built aside (``.<name>.<pid>.new``, MLflow's whole schema) and hard-linked into
      place, which succeeds only if no file of that name exists yet: another process sees either no
      store or a complete one, never half a schema;
    * a file that exists but is not at MLflow's schema revision is being built by another process: it
      is left alone (opening it would run the migration a second time) until it reaches the revision,
      or nothing has changed in it for ``SCHEMA_SETTLE_S`` seconds (an empty file, or one from an older
      MLflow, which MLflow then initialises or refuses as it always would);
    * an open that still fails in a way a concurrent migration causes (``table ... already exists``,
      ``duplicate column``, ``database is locked``, a schema revision mid-way) is retried, up to
      ``SCHEMA_OPEN_TRIES`` opens.

    Returns:
        An ``MlflowClient`` whose store is open (its schema built).
    Raises:
        whatever MLflow raises for a store it cannot open for another reason, or on the last try.
    """
    if not db.exists():
        _build_store_aside(db)
    for attempt in range(SCHEMA_OPEN_TRIES):
        _wait_for_schema(db)
        try:
            c = mlflow_tracking.MlflowClient(tracking_uri=tracking_uri)
            c.search_experiments(max_results=1)  # builds the store (some MLflow versions build it lazily)
            return c
        except (sqlalchemy_exc.SQLAlchemyError, mlflow_exceptions.MlflowException) as exc:
            if attempt + 1 == SCHEMA_OPEN_TRIES or not _concurrent_schema_error(exc):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


_CONCURRENT = (
    "already exists",
    "duplicate column",
    "database is locked",
    "unique constraint failed",
    "out-of-date database schema",
    "no such table",
    "can't locate revision",
)


def _concurrent_schema_error(exc: BaseException) -> bool:
    """Whether ``exc`` is what MLflow raises when another process builds the same schema at once."""
    text = str(exc).lower()
    return any(phrase in text for phrase in _CONCURRENT)


def _build_store_aside(db: Path) -> None:
    """Build MLflow's schema in a file beside ``db`` and link it into place unless ``db`` exists by then
    (another process made it first: its schema is awaited by :func:`_wait_for_schema`)."""
    new = db.with_name(f".{db.name}.{os.getpid()}.new")
    new.unlink(missing_ok=True)
    try:
        # the Default experiment's artifact root as a plain MlflowClient would give it
        default_root = mlflow_store_tracking.DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
        mlflow_sqlalchemy_store.SqlAlchemyStore(f"sqlite:///{new}", default_root).engine.dispose()
        try:
            os.link(new, db)
        except FileExistsError:
            pass
    finally:
        new.unlink(missing_ok=True)


def _head_revision() -> Optional[str]:
    """MLflow's current schema revision (``None`` where this MLflow does not say)."""
    try:
        return str(mlflow_db_utils._get_latest_schema_revision())
    except Exception:  # noqa: BLE001 - then the file's settling alone decides
        return None


def _wait_for_schema(db: Path) -> None:
    """Return once ``db`` is at MLflow's schema revision, or nothing has changed in it (revision, size,
    modification time) for ``SCHEMA_SETTLE_S`` seconds, or after ``SCHEMA_LOCK_TIMEOUT_S`` seconds."""
    head = _head_revision()
    start = last_change = time.monotonic()
    seen: Any = None
    while True:
        revision = _alembic_revision(db)
        if head is not None and revision == head:
            return
        try:
            st = db.stat()
            state: Any = (revision, st.st_size, st.st_mtime_ns)
        except OSError:
            state = (revision, None, None)
        now = time.monotonic()
        if state != seen:
            seen, last_change = state, now
        elif now - last_change >= SCHEMA_SETTLE_S or now - start >= SCHEMA_LOCK_TIMEOUT_S:
            return
        time.sleep(0.1)


def get_or_create_experiment(tracking_uri: str, name: str, artifact_root: Optional[str] = None) -> str:
    """Experiment id for ``name`` (created if missing; local SQLite stores get ``artifact_root``).

    The experiment is marked as a training experiment (tag ``mlflow.experimentKind`` =
    ``custom_model_development``), so MLflow 3's UI opens its runs, not the GenAI overview; an existing
    experiment gets the tag too."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if exp.tags.get(TAG_EXPERIMENT_KIND) != EXPERIMENT_KIND:
            c.set_experiment_tag(exp.experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
        return exp.experiment_id
    use_root = artifact_root if tracking_uri.startswith("sqlite:") else None
    return c.create_experiment(name, artifact_location=use_root, tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND})


def find_trial_run(
    tracking_uri: str, experiment_id: str, trial_id: str, parent_run_id: str, wait_s: float = 0.0
) -> Optional[str]:
    """Run id of the child run for ``trial_id`` under ``parent_run_id``; polls up to ``wait_s`` seconds."""
    c = client(tracking_uri)
    deadline = time.monotonic() + wait_s
    while True:
        runs = c.search_runs(
            [experiment_id],
            filter_string=f"tags.`{TAG_TRIAL}` = '{trial_id}' and tags.`{PARENT}` = '{parent_run_id}'",
            max_results=1,
        )
        if runs:
            return runs[0].info.run_id
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


LOG_BATCH_LIMIT = 1000  # MLflow's limit on metrics per log_batch call


def log_metrics(client: Any, run_id: str, metrics: Sequence[Any]) -> None:
    """Send ``metrics`` (``mlflow.entities.Metric``) to ``run_id`` in as few ``log_batch`` calls as
    MLflow's per-call limit allows."""
    for i in range(0, len(metrics), LOG_BATCH_LIMIT):
        client.log_batch(run_id, metrics=list(metrics[i : i + LOG_BATCH_LIMIT]))


def numeric_metrics(result: Dict) -> Dict[str, float]:
    """The metrics of a Tune result worth logging: our ``a/b`` names plus ``epoch``, ``lr``, ``diverged``
    and ``world_size`` (multi-worker trials: the number of DDP ranks)."""
    out = {}
    for k, v in result.items():
        if (
            ("/" in k or k in ("epoch", "lr", "diverged", "world_size"))
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
        ):
            out[k] = float(v)
    return out
