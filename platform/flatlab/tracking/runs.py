"""MLflow run layout shared by the driver, the workers and the result queries.

One experiment per study name; one parent run per study launch (tag ``flatlab.role=study``); one
nested child run per trial (``mlflow.parentRunId``, ``flatlab.role=trial``, ``flatlab.trial_id``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from filelock import FileLock, Timeout

from flatlab.analysis.sample import (  # noqa: F401 - the names of a trial record, read as runs.<name> too
    AT_TARGET_PREFIX,
    FLAT_PREFIX,
    STAGE_FINAL,
    STAGE_KEY,
    STAGE_SEARCH,
    TUNING_KEY,
)
from flatlab.errors import ConfigError
from flatlab.tracking.param_text import flat_params

TAG_ROLE = "flatlab.role"
TAG_TRIAL = "flatlab.trial_id"
TAG_STUDY = "flatlab.study"
TAG_ARM = "flatlab.arm"
TAG_OPT = "flatlab.optimizer"
TAG_WORKLOAD = "flatlab.workload"
TAG_SEED = "flatlab.seed"
TAG_COMMIT = "flatlab.git_commit"
TAG_DIRTY = "flatlab.git_dirty"  # "true" when the package's tracked files differ from that commit
TAG_SOURCE = "flatlab.source_digest"  # source_digest(): which flatlab code ran, with or without git
TAG_VERSION = "flatlab.version"
TAG_OUTCOME = "flatlab.outcome"  # completed | pruned | diverged | error | interrupted
TAG_TUNING = "flatlab.tuning"  # the trial's independent tuning, 1..S (flatlab.study.tunings)
TAG_STAGE = "flatlab.stage"  # search (tuning trials) | final (each arm's best configuration over fresh seeds)
TAG_ERROR = "flatlab.error"  # a failed trial's "Type: message" (full traceback: its error.txt artifact)
TAG_CONFIG = "flatlab.config_digest"  # config_digest of the trial's configuration, set as its run is created
PARENT = "mlflow.parentRunId"
# STAGE_KEY and TUNING_KEY: trial config keys (not hyperparameters; never logged as params), defined with
# the record they name (flatlab.analysis.sample)
# A trial's last report names the metrics it holds about the final model only (test/* unless the
# trainer tests every epoch, flat/*, time/measures_s, train/target_reached, train/epochs_to_target:
# what study/trainable.py's _final_metrics adds), comma-separated under this key (not a metric: no "/").
# They are logged at step 0, which is how MLflow tells a run's summary values from its curves: its UI
# draws a metric whose steps are all 0 as one bar per run, not as a one-point line on an epoch axis
# (``train/steps_to_target`` and ``train/speedup``, logged after the study by tracking/speedup.py, are
# at step 0 too). The epoch they were measured at is the run's last ``epoch``.
SUMMARY_KEY = "summary_metrics"


def summary_keys(report: Dict[str, Any]) -> frozenset:
    """The summary metrics a report names under :data:`SUMMARY_KEY` (none for a per-epoch report)."""
    return frozenset(k for k in str(report.get(SUMMARY_KEY) or "").split(",") if k)


def metric_step(key: str, epoch: int, summary: frozenset = frozenset()) -> int:
    """The MLflow step of metric ``key`` in the report of ``epoch`` whose summary metrics are ``summary``
    (:func:`summary_keys`): 0 for a summary value, else the epoch."""
    return 0 if key in summary else epoch


# A final report's key for the id of the trial's MLflow logged model (:mod:`flatlab.tracking.logged_model`),
# which the worker logs before it reports: the driver links the report's metrics to that model. Metrics
# reach a trial's run from the driver only, so a relaunch never finds epochs logged that Tune never saw.
MODEL_ID_KEY = "logged_model_id"


# The flatness measures a trial with the trainer parameter ``measure_at_train_loss`` ran on the model of the
# first epoch reaching that training loss: each ``flat/<name>`` of the measures under this prefix
# (``flat_at_target/fisher_trace``; MLflow allows letters, digits, ``_ - . /``, space and colon), their time
# as ``time/measures_at_target_s``. Summary values of the last report (step 0), like ``flat/*``; the epoch
# they were measured at is ``train/epochs_to_target``.
AT_TARGET_TIME_KEY = "time/measures_at_target_s"


def at_target(measured: Mapping[str, float]) -> Dict[str, float]:
    """The measures of a model at the training-loss target under their at-target names: ``flat/<name>``
    -> ``flat_at_target/<name>``, ``time/measures_s`` -> :data:`AT_TARGET_TIME_KEY` (anything else dropped)."""
    out = {AT_TARGET_PREFIX + k[len(FLAT_PREFIX) :]: float(v) for k, v in measured.items() if k.startswith(FLAT_PREFIX)}
    if "time/measures_s" in measured:
        out[AT_TARGET_TIME_KEY] = float(measured["time/measures_s"])
    return out


def on_split(measured: Mapping[str, float], split: str) -> Dict[str, float]:
    """The measures of a model on a study's extra split (``Study.measure_extra_splits``) under their names
    for it: ``flat/<name>`` -> ``flat_<split>/<name>`` (``flat_test/sam_objective``), ``time/measures_s`` ->
    ``time/measures_<split>_s`` (anything else dropped)."""
    out = {f"flat_{split}/{k[len(FLAT_PREFIX) :]}": float(v) for k, v in measured.items() if k.startswith(FLAT_PREFIX)}
    if "time/measures_s" in measured:
        out[f"time/measures_{split}_s"] = float(measured["time/measures_s"])
    return out


#: the prefix of the measures taken during training (``Study.measure_every``), logged with step = epoch
CURVE_PREFIX = "flat_curve"


def over_training(measured: Mapping[str, float]) -> Dict[str, float]:
    """A model's measures as a point of the curve over training: ``flat/<name>`` -> ``flat_curve/<name>``,
    ``flat_<split>/<name>`` -> ``flat_curve_<split>/<name>``, ``time/measures_s`` ->
    ``time/measures_curve_s`` (``flat_at_target/*`` and anything else dropped). Per-epoch values (MLflow
    step = epoch), never summary values, so they do not shadow the final model's ``flat/*``."""
    out: Dict[str, float] = {}
    for k, v in measured.items():
        head, sep, tail = k.partition("/")
        if sep and (head == "flat" or head.startswith("flat_")) and not k.startswith(AT_TARGET_PREFIX):
            out[f"{CURVE_PREFIX}{head[len('flat') :]}/{tail}"] = float(v)
    if "time/measures_s" in measured:
        out["time/measures_curve_s"] = float(measured["time/measures_s"])
    return out


# A report's key for the time its epoch ended (seconds since 1970, ``time.time()`` on the worker): the
# timestamp of the epoch's metrics in MLflow. Not a metric (no "/"), never logged as one.
EPOCH_END_KEY = "epoch_end_time"

# A trial's MLflow params: its config as the searcher gave it under the plain names (``arm``, ``seed``,
# ``lr`` ...: what queries such as ``params.lr`` use), and every resolved value, defaults included, under
# a prefix per section (``opt.momentum``, ``train.batch_size``, ``wl.width``). Field names never hold a
# dot, so a dotted param is always a resolved one.
RESOLVED_PREFIX = {"optimizer": "opt.", "trainer": "train.", "workload": "wl."}
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value's length (characters)

# MLflow 3's UI opens an experiment by this tag: training runs, not the GenAI (traces) overview.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

# MLflowClient.set_terminated prints "🏃 View run ... / 🧪 View experiment ..." to stdout for every run
# ended on an HTTP tracking server (mlflow/tracking/_tracking_service/client.py, _log_url), one pair per
# trial: flatlab's clients turn that off (the user may set it to "false" to have them back).
SUPPRESS_URL_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def is_resolved_param(name: str) -> bool:
    """Whether an MLflow param of a trial is one of its resolved values (``opt.*``, ``train.*``, ``wl.*``)."""
    return name.startswith(tuple(RESOLVED_PREFIX.values()))


def trial_params(config: Dict[str, Any], resolved: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, str]:
    """The MLflow params of a trial: ``config``'s entries under their own names (except the stage and the
    tuning, which are tags), then ``resolved`` (:func:`flatlab.study.trial_spec.resolved_config`) as
    ``<prefix><name>`` (:data:`RESOLVED_PREFIX`). Values are ``str(value)``, cut to MLflow's limit: the
    same config always gives the same strings, as MLflow requires of a resumed run. A mapping value is
    flattened to one param per entry (``<name>.<key>``, :func:`flatlab.tracking.param_text.flat_params`),
    never logged as a Python repr."""

    def params(values: Dict[str, Any], prefix: str = "") -> Dict[str, str]:
        out: Dict[str, str] = {}
        for k, v in sorted(values.items()):
            out.update(flat_params({k: v}, prefix) if isinstance(v, Mapping) else {f"{prefix}{k}": str(v)})
        return out

    out = params({k: v for k, v in config.items() if k not in (STAGE_KEY, TUNING_KEY)})
    for section, values in (resolved or {}).items():
        out.update(params(values, RESOLVED_PREFIX[section]))
    return {k: v[:PARAM_VALUE_LIMIT] for k, v in out.items()}


def config_digest(config: Dict[str, Any]) -> str:
    """A short digest (16 hex digits of SHA-256) of :func:`trial_params` of ``config``: the same
    configuration always gives the same digest. A trial run carries it as the tag :data:`TAG_CONFIG` from
    the moment it is created (params follow in a second call), so a resume after the driver was killed
    between the two still recognises the run (:mod:`flatlab.study.recovery`)."""
    text = json.dumps(trial_params(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_params(params: Dict[str, str]) -> Dict[str, str]:
    """A trial run's configuration among its MLflow params: what the searcher gave it, without ``arm``
    and ``seed`` and without the resolved values (:func:`is_resolved_param`)."""
    return {k: v for k, v in params.items() if k not in ("arm", "seed") and not is_resolved_param(k)}


def default_tracking_uri(root: Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite file ``<root>/mlflow.db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{(root / 'mlflow.db').resolve()}"


def artifact_location(root: Path) -> str:
    """Artifact root for experiments created on a local SQLite store."""
    return (root / "mlartifacts").resolve().as_uri()


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # platform/flatlab


def _git(args: Sequence[str], cwd: Path) -> Optional[str]:
    """``git <args>``'s stdout in ``cwd`` (stripped), or ``None`` when git is missing or fails there."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The flatlab checkout's commit (``unknown`` outside a git checkout)."""
    return _git(["rev-parse", "HEAD"], PACKAGE_DIR) or "unknown"


def git_dirty(package: Path = PACKAGE_DIR) -> Optional[bool]:
    """Whether tracked files under ``package`` differ from the checkout's commit (staged or not;
    untracked files are not counted), ``None`` outside a git checkout. A launch records it as
    :data:`TAG_DIRTY`: with ``true``, the commit alone does not say which code ran (see
    :func:`source_digest`)."""
    out = _git(["status", "--porcelain", "--untracked-files=no", "--", "."], package)
    return None if out is None else bool(out)


def source_digest(package: Path = PACKAGE_DIR) -> str:
    """16 hex digits of SHA-256 over the package's Python source: every ``*.py`` file under ``package``
    (``__pycache__`` left out), in order of relative path, each as its path and its bytes. Two launches
    with the same digest ran the same flatlab code, whether or not either came from a git checkout or a
    clean one; a launch records it as :data:`TAG_SOURCE`.

    Raises:
        FileNotFoundError: ``package`` is not a directory.
    """
    if not package.is_dir():
        raise FileNotFoundError(f"source_digest: {package} is not a directory")
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
        rel = path.relative_to(package).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def provenance_tags() -> Dict[str, str]:
    """The tags that say which flatlab code a launch ran: :data:`TAG_COMMIT`, :data:`TAG_SOURCE` and,
    inside a git checkout, :data:`TAG_DIRTY` (``true``/``false``)."""
    tags = {TAG_COMMIT: git_commit(), TAG_SOURCE: source_digest()}
    dirty = git_dirty()
    if dirty is not None:
        tags[TAG_DIRTY] = "true" if dirty else "false"
    return tags


_SCHEMA_READY: set = set()  # SQLite URIs whose schema this process has already opened under the lock
SCHEMA_LOCK_TIMEOUT_S = 300.0


def sqlite_file(tracking_uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:`` tracking URI (``None`` for other stores and in-memory SQLite)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    # SQLAlchemy on first use: importing this module stays light
    from sqlalchemy.engine import make_url

    database = make_url(tracking_uri).database
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
    # MLflow on first use: importing this module stays light
    from mlflow.tracking import MlflowClient

    # MLflow reads these at each request; by default it retries a silent server for minutes
    limits = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(max(1.0, timeout_s)))}
    before = {key: os.environ.get(key) for key in limits}
    os.environ.update(limits)
    try:
        return MlflowClient(tracking_uri=tracking_uri).get_run(run_id).info.experiment_id == str(experiment_id)
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
    # MLflow on first use: importing this module stays light
    import mlflow

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
    # MLflow on first use: importing this module stays light
    from mlflow.tracking import MlflowClient

    os.environ.setdefault(SUPPRESS_URL_ENV, "true")  # read at each set_terminated: no "View run" lines
    db = sqlite_file(tracking_uri)
    if db is None or tracking_uri in _SCHEMA_READY:
        return MlflowClient(tracking_uri=tracking_uri)
    stamp_file = db.with_name(db.name + ".schema")
    try:
        settled = stamp_file.read_text() == _schema_stamp(db)
    except OSError:
        settled = False
    if settled:
        _SCHEMA_READY.add(tracking_uri)
        return MlflowClient(tracking_uri=tracking_uri)

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
        c = _open_sqlite_store(tracking_uri, db) if lock is not None else MlflowClient(tracking_uri=tracking_uri)
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
    # MLflow on first use: importing this module stays light
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from sqlalchemy.exc import SQLAlchemyError

    if not db.exists():
        _build_store_aside(db)
    for attempt in range(SCHEMA_OPEN_TRIES):
        _wait_for_schema(db)
        try:
            c = MlflowClient(tracking_uri=tracking_uri)
            c.search_experiments(max_results=1)  # builds the store (some MLflow versions build it lazily)
            return c
        except (SQLAlchemyError, MlflowException) as exc:
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
    # MLflow on first use: importing this module stays light
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    new = db.with_name(f".{db.name}.{os.getpid()}.new")
    new.unlink(missing_ok=True)
    try:
        # the Default experiment's artifact root as a plain MlflowClient would give it
        SqlAlchemyStore(f"sqlite:///{new}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH).engine.dispose()
        try:
            os.link(new, db)
        except FileExistsError:
            pass
    finally:
        new.unlink(missing_ok=True)


def _head_revision() -> Optional[str]:
    """MLflow's current schema revision (``None`` where this MLflow does not say)."""
    try:
        # MLflow on first use: importing this module stays light
        from mlflow.store.db.utils import _get_latest_schema_revision  # private, stable since MLflow 1.x

        return str(_get_latest_schema_revision())
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
