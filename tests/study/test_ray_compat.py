"""Ray's private API is used in one module, for the Ray versions pyproject.toml allows."""

import ast
import re
from pathlib import Path

import ray

from flatlab.study import ray_compat
from flatlab.study.ray_compat import TESTED_RAY_VERSIONS, asha_rung_count, ray_version_problem

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "platform" / "flatlab"
PRIVATE = re.compile(r"^ray\.(_private|_raylet|_common|train\._internal)|^ray\.tune\.trainable\.function_trainable")


def test_the_installed_ray_is_a_tested_one_and_pyproject_allows_exactly_those():
    assert ray_version_problem() is None, ray.__version__
    deps = (REPO / "pyproject.toml").read_text()
    spec = re.search(r'"ray\[default,tune\]>=([\d.]+),<([\d.]+)"', deps)
    assert spec is not None
    low, high = spec.groups()
    assert [low] == list(TESTED_RAY_VERSIONS)  # one tested minor release: >=2.60,<2.61
    major, minor = map(int, low.split("."))
    assert high == f"{major}.{minor + 1}"


def test_an_unknown_version_is_named_with_the_way_out():
    assert ray_version_problem("2.60.3") is None
    msg = ray_version_problem("2.61.0")
    assert msg is not None and "Ray 2.61.0 is installed" in msg and "tested with Ray 2.60 only" in msg
    assert "pip install 'ray[default,tune]==2.60.*'" in msg
    assert ray_version_problem("3.0.0") is not None


def test_asha_rung_count_is_rays():
    from ray.tune.schedulers.async_hyperband import _Bracket

    for max_t, grace, rf in ((30, 2, 3), (40, 1, 2), (9, 1, 3), (100, 4, 4), (5, 5, 2)):
        bracket = _Bracket(min_t=grace, max_t=max_t, reduction_factor=rf, s=0)
        assert asha_rung_count(max_t, grace, rf) == len(bracket._rungs), (max_t, grace, rf)
    assert asha_rung_count(30, 2, 3) == 3  # 2, 6, 18 by hand


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_no_other_module_touches_rays_private_api():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == Path(ray_compat.__file__).resolve():
            continue
        text = path.read_text()
        mods = [m for m in _imports(path) if PRIVATE.search(m)]
        if mods or "_local_tuner" in text or "train_buffered" in text.replace("``train_buffered``", ""):
            offenders.append((str(path.relative_to(PACKAGE)), mods))
    assert not offenders


def test_can_resume_needs_tunes_saved_state_not_only_tuner_pkl(tmp_path):
    """``tuner.pkl`` is written as the Tuner is built; Ray calls that restorable, but a Tuner restored
    from it restarts with ``num_samples=1``. A resume restores only once Tune saved the experiment."""
    from ray.tune import Tuner

    from flatlab.study.ray_compat import can_resume

    exp = tmp_path / "exp"
    assert not can_resume(str(exp))  # nothing there
    exp.mkdir()
    (exp / "tuner.pkl").write_bytes(b"")
    assert Tuner.can_restore(str(exp))  # Ray's answer, from tuner.pkl alone
    assert not can_resume(str(exp))
    (exp / "experiment_state-2026-12-05_16-45-22.json").write_text("{}")
    assert can_resume(str(exp))
    assert can_resume(exp.as_uri())  # a storage URI as well as a path
