"""Everything flatlab does with Ray's private API, in one place, for the Ray versions it was tested on.

flatlab uses Ray's public API (``ray.init``, ``ray.tune``, ``ray.train``) everywhere else. The pieces
below reach into Ray's internals, each to work around a fault or a missing option of the Ray versions
in :data:`TESTED_RAY_VERSIONS` (each function's docstring says how):

* :func:`loopback_node_ip`, :func:`init_local_ray`: a local Ray instance whose every socket listens on
  loopback only (on Linux ``ray.init`` rewrites 127.0.0.1 to the machine's network address), and a
  driver that joins a cluster on loopback as 127.0.0.1.
* :func:`route_ray_errors_to_log`: the cluster's error broadcasts ("A worker died ...") go to the
  study's log, not the terminal, even with ``log_to_driver=False``.
* :func:`refresh_auth_config`, :func:`gcs_requires_token`: token authentication, which Ray reads once
  per process.
* :func:`restored_callbacks`, :func:`tuner_scheduler`, :func:`tuner_searcher`: what a restored ``Tuner``
  pickled, so that a resume swaps in this launch's live callbacks and hooks.
* :func:`can_resume`: whether Tune saved an experiment, not only built its Tuner.
* :func:`buffered_trainable`: result buffering that ends a batch where flatlab says.
* :func:`retry_system_failures_only`: retries for a lost node or worker only, never for the trial's own
  exception.
* :func:`asha_rung_count`, :func:`train_session_storage`: ASHA's rungs; a DDP trial's Ray Train storage.

:func:`check_ray_version` says, once per process, when the installed Ray is not one of those versions;
``pyproject.toml`` allows only them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional

import numpy as np

from flatlab.lazy import lazy

grpc = lazy("grpc")  # Ray's RPC
ray = lazy("ray")
ray_constants = lazy("ray._private.ray_constants")
ray_worker = lazy("ray._private.worker")
raylet = lazy("ray._raylet")
ray_exceptions = lazy("ray.exceptions")
gcs_service_pb2 = lazy("ray.core.generated.gcs_service_pb2")
gcs_service_pb2_grpc = lazy("ray.core.generated.gcs_service_pb2_grpc")
tune = lazy("ray.tune")
experiment_state = lazy("ray.tune.execution.experiment_state")
tune_trial = lazy("ray.tune.experiment.trial")
tune_result = lazy("ray.tune.result")
function_trainable = lazy("ray.tune.trainable.function_trainable")
train_session = lazy("ray.train._internal.session")
train_v2_exceptions = lazy("ray.train.v2.api.exceptions")

#: Ray releases (major.minor) the test suite ran on with these workarounds; ``pyproject.toml`` allows these.
TESTED_RAY_VERSIONS = ("2.60",)

#: The environment variable behind ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``.
CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

LOOPBACK = "127.0.0.1"

logger = logging.getLogger("flatlab")
_warned: List[str] = []


def ray_version_problem(version: Optional[str] = None) -> Optional[str]:
    """A one-line warning when Ray ``version`` (default: the installed one) is not a tested release,
    else ``None``."""
    if version is None:
        version = ray.__version__
    major_minor = ".".join(version.split(".")[:2])
    if major_minor in TESTED_RAY_VERSIONS:
        return None
    return (
        f"Ray {version} is installed, but flatlab was tested with Ray {', '.join(TESTED_RAY_VERSIONS)} only; its "
        f"workarounds of Ray internals (flatlab.study.ray_compat: loopback-only local Ray, batched reports, resume) "
        f"may not hold: install a tested Ray (pip install 'ray[default,tune]=={TESTED_RAY_VERSIONS[-1]}.*')"
    )


def check_ray_version(console: Any = None) -> Optional[str]:
    """Log (and print to ``console``, once per process) :func:`ray_version_problem`; returns it."""
    problem = ray_version_problem()
    if problem is not None:
        logger.warning("%s", problem)
        if console is not None and problem not in _warned:
            _warned.append(problem)
            console.print(f"[yellow]warning:[/yellow] {problem}", soft_wrap=True)
    return problem


@contextlib.contextmanager
def loopback_node_ip() -> Iterator[None]:
    """Within the block, Ray takes 127.0.0.1 as this machine's node address: ``ray.init`` starts a local
    instance whose every socket (GCS, raylet, object manager, dashboard and runtime-env agents, workers,
    this driver) listens on loopback, or joins a cluster at a loopback address as 127.0.0.1 (otherwise
    Ray rewrites ``127.0.0.1:PORT`` to the machine's network address, where a loopback-only cluster does
    not answer).

    ``ENABLE_RAY_CLUSTER`` is false in the block (its environment variable too, which the raylet and
    agents inherit, so the workers they start later use loopback) and restored after it, so a later
    ``ray.init`` of the same process joins other clusters with the machine's network address.
    """
    before_const, before_env = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get(CLUSTER_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[CLUSTER_ENV] = "0"
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(CLUSTER_ENV, None)
        else:
            os.environ[CLUSTER_ENV] = before_env


def is_loopback_address(address: str) -> bool:
    """Whether a Ray address ``HOST:PORT`` / ``ray://HOST:PORT`` names this machine's loopback
    (``127.x.x.x``, ``::1``, ``localhost``)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host = rest.rpartition(":")[0].strip("[]") if ":" in rest else rest
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def init_local_ray(**kwargs: Any) -> Any:
    """``ray.init(address="local", **kwargs)`` with every socket of the new instance on 127.0.0.1
    (:func:`loopback_node_ip`). Returns what ``ray.init`` returns."""
    with loopback_node_ip():
        return ray.init(address="local", _node_ip_address=LOOPBACK, **kwargs)


def gcs_requires_token(address: str, timeout: float = 3.0) -> Optional[bool]:
    """Whether the Ray GCS at ``address`` (``HOST:PORT``) refuses a call that carries no auth token:
    ``True`` (the cluster uses token authentication), ``False`` (it does not), ``None`` (no answer within
    ``timeout`` seconds, or another error: unknown). One ``GetClusterId`` call over Ray's generated gRPC
    stubs (``ray.core.generated``)."""
    channel = grpc.insecure_channel(address)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout
        )
        return False
    except grpc.RpcError as exc:
        return True if exc.code() == grpc.StatusCode.UNAUTHENTICATED else None
    finally:
        channel.close()


def refresh_auth_config() -> None:
    """Make Ray re-read ``RAY_AUTH_MODE`` in this process (as Ray's own token set-up does), if Ray's
    core is loaded already."""
    if "ray._raylet" in sys.modules:
        raylet.Config.initialize("")


def route_ray_errors_to_log() -> bool:
    """Replace Ray's driver-side printer of cluster errors by one that logs them (``WARNING`` on the
    ``ray`` logger, which the study's log file receives) and leaves other output alone. Idempotent;
    returns ``False`` (and changes nothing) if this Ray has no ``ray._private.worker.print_to_stdstream``.
    """
    try:
        original = getattr(ray_worker, "print_to_stdstream", None)
    except ImportError:  # pragma: no cover (ray is a dependency)
        return False
    if original is None:
        return False
    if getattr(original, "flatlab_routed", False):
        return True
    ray_logger = logging.getLogger("ray")

    def print_to_stdstream(data: Dict[str, Any], ignore_prefix: bool = False, _print: Callable = original) -> None:
        if data.get("pid") != "raylet":
            return _print(data, ignore_prefix=ignore_prefix)
        for line in data.get("lines", []):
            ray_logger.warning("%s", line)

    print_to_stdstream.flatlab_routed = True  # type: ignore[attr-defined]
    print_to_stdstream.__wrapped__ = original  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream
    return True


def can_resume(experiment_path: str) -> bool:
    """Whether Tune saved the state of the experiment at ``experiment_path`` (local path or URI), so that
    ``Tuner.restore`` continues it at the budget it was launched with: ``tuner.pkl`` and at least one
    ``experiment_state-*.json`` (``ray.tune.execution.experiment_state``). False for a launch whose driver
    died after building its Tuner and before Tune's first save: it must start again (a new Tuner), not
    be restored. ``Tuner.can_restore`` answers True from ``tuner.pkl`` alone, and a Tuner restored from
    it restarts the experiment with ``num_samples=1`` (``TunerInternal._fit_resume`` passes none): a
    one-trial search."""
    return (
        bool(tune.Tuner.can_restore(experiment_path))
        and experiment_state._find_newest_experiment_checkpoint(experiment_path) is not None
    )


def restored_callbacks(tuner: Any) -> List[Any]:
    """The callbacks a restored ``tuner`` pickled with its experiment (a list Tune will use: replacing
    its items replaces them)."""
    return tuner._local_tuner.get_run_config().callbacks


def tuner_scheduler(tuner: Any) -> Any:
    """The scheduler a (restored) ``tuner`` holds (``None`` for Tune's default FIFO)."""
    return tuner._local_tuner._tune_config.scheduler


def tuner_searcher(tuner: Any) -> Any:
    """The searcher inside ``tuner`` (unwrapped from Tune's wrappers such as ``ConcurrencyLimiter``)."""
    alg = tuner._local_tuner._tune_config.search_alg
    while hasattr(alg, "searcher"):
        alg = alg.searcher
    return alg


def is_system_failure(exc: Optional[BaseException]) -> bool:
    """Whether a trial's failure ``exc`` (what Tune hands ``Trial.handle_error``) is the loss of a node,
    a worker or an actor, not an exception of the trial's own code: a ``RayActorError`` (e.g. its node
    was removed), a task error caused by one, or a Ray Train run (DDP trial) that failed because a
    worker died or was preempted."""
    if isinstance(exc, ray_exceptions.RayActorError):
        return True
    if not isinstance(exc, ray_exceptions.RayTaskError):
        return False
    cause = exc.as_instanceof_cause()
    if isinstance(cause, ray_exceptions.RayActorError):
        return True
    try:
        preemption_error = train_v2_exceptions.PreemptionError
        worker_group_error = train_v2_exceptions.WorkerGroupError
    except (ImportError, AttributeError):  # pragma: no cover (Ray Train V2 ships with the tested Ray)
        return False
    if isinstance(cause, preemption_error):
        return True
    failures = getattr(cause, "worker_failures", None) if isinstance(cause, worker_group_error) else None
    return bool(failures) and any(isinstance(f, ray_exceptions.RayActorError) for f in failures.values())


def retry_system_failures_only() -> bool:
    """Make Tune retry a trial (``FailureConfig.max_failures``, from its last checkpoint) only after a
    system failure (:func:`is_system_failure`); a trial whose own code raised fails at once, as with
    ``max_failures=0``. Tune counts both alike (``Trial.handle_error``); the patched method uses up a
    trial's remaining retries when its own code raised. Idempotent; returns ``True`` once installed."""
    trial_class = tune_trial.Trial
    original = trial_class.handle_error
    if getattr(original, "flatlab_system_only", False):
        return True

    def handle_error(self: Any, exc: Optional[BaseException] = None) -> None:
        original(self, exc)
        if exc is not None and not is_system_failure(exc) and self.max_failures >= 0:
            meta = self.run_metadata
            meta.num_failures = max(meta.num_failures, self.max_failures + 1)

    handle_error.flatlab_system_only = True  # type: ignore[attr-defined]
    handle_error.__wrapped__ = original  # type: ignore[attr-defined]
    trial_class.handle_error = handle_error
    return True


def asha_rung_count(max_t: float, grace_period: float, reduction_factor: float) -> int:
    """How many rungs Ray's ``ASHAScheduler`` gives its one bracket (``_Bracket``'s count)."""
    return int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)


def train_session_storage() -> Any:
    """The ``StorageContext`` of the running Tune trial (``ray.train._internal.session``): its
    ``trial_fs_path`` and ``storage_filesystem``, where a DDP trial keeps its Ray Train run."""
    return train_session.get_session().storage


def buffered_trainable(fn: Any, decide_at: FrozenSet[int], buffer_s: float, max_batch: int) -> type:
    """A function-trainable class of ``fn`` whose reports travel in batches of up to ``buffer_s`` seconds
    and ``max_batch`` reports (when Tune's result buffering is on). A batch ends early at the reports
    whose ``training_iteration`` is in ``decide_at``, at a checkpoint and at the end; a report that
    carries a checkpoint travels alone (the batch before it goes first). It never loses a report to an
    error: an exception raised while a batch is collected is held, the reports before it are returned,
    and the next call raises it (Tune then fails the trial with it, as without buffering).

    Why an override: Ray 2.60's controller calls ``train_buffered(buffer_length, buffer_time_s)`` while
    ``Trainable.train_buffered`` takes ``(buffer_time_s, max_buffer_length)``, so Ray's own method ends
    every batch after one report; and given a batch that
    ends with a checkpoint, that controller acts on the earlier reports' CONTINUE before the checkpoint's
    ``save`` resolves and runs two trains at once. Both are Ray 2.60 faults; when Ray fixes them this
    class can shrink to the error handling.
    """
    # Tune's result keys, read once: the class travels to the trial actors with them
    done, duplicate = tune_result.DONE, tune_result.RESULT_DUPLICATE
    should_checkpoint, iteration = tune_result.SHOULD_CHECKPOINT, tune_result.TRAINING_ITERATION

    class BatchedTrial(function_trainable.wrap_function(fn)):  # type: ignore[misc, valid-type]
        _held_error: Optional[BaseException] = None
        _held_result: Optional[Dict[str, Any]] = None

        def train_buffered(self, *_tune_args: Any, **_tune_kwargs: Any) -> list:
            if self._held_error is not None:
                error, self._held_error = self._held_error, None
                raise error
            if self._held_result is not None:
                result, self._held_result = self._held_result, None
                return [result]
            results: list = []
            send_at = time.time() + buffer_s
            while True:
                try:
                    result = self.train()
                except Exception as exc:  # deliver what was reported before it; raise it on the next call
                    if not results:
                        raise
                    self._held_error = exc
                    return results
                if result.get(should_checkpoint) and results:
                    # a checkpoint travels alone (see the docstring)
                    self._held_result = result
                    return results
                results.append(result)
                if (
                    result.get(done)
                    or result.get(should_checkpoint)
                    or result.get(duplicate)
                    or result.get(iteration) in decide_at
                    or len(results) >= max_batch
                    or time.time() >= send_at
                ):
                    return results

        def reset_config(self, new_config: Dict[str, Any]) -> bool:
            self._held_error = self._held_result = None  # a reused actor starts its next trial clean
            return super().reset_config(new_config)

    return BatchedTrial
