"""flatlab.lazy: a deferred import behaves as an import written where the module is first used."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from flatlab.lazy import lazy, load

PLATFORM = Path(__file__).resolve().parents[1] / "platform"


def _fresh(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLATFORM), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout


def test_nothing_is_imported_until_a_name_is_read():
    out = _fresh(
        "import sys\nfrom flatlab.lazy import lazy\nm = lazy('fractions')\n"
        "print('fractions' in sys.modules, repr(m))\nprint(m.Fraction(1, 3) * 3)\n"
        "print('fractions' in sys.modules, repr(m))\n"
    )
    assert out.splitlines() == [
        "False <lazy module 'fractions' (not yet imported)>",
        "1",
        "True <lazy module 'fractions' (imported)>",
    ]


def test_reads_are_forwarded_so_a_rebound_name_and_a_swapped_module_are_seen(monkeypatch):
    fake = types.ModuleType("flatlab_lazy_fake")
    fake.value = 1
    monkeypatch.setitem(sys.modules, "flatlab_lazy_fake", fake)
    m = lazy("flatlab_lazy_fake")
    assert m.value == 1
    fake.value = 2  # the library rebinds a global: no stale copy
    assert m.value == 2
    other = types.ModuleType("flatlab_lazy_fake")
    other.value = 3
    monkeypatch.setitem(sys.modules, "flatlab_lazy_fake", other)  # a test swaps the module
    assert m.value == 3
    m.value = 4  # a write reaches the module, as `import m; m.value = 4` would
    assert other.value == 4 and "value" not in vars(m)
    del m.value
    assert not hasattr(other, "value")
    with pytest.raises(AttributeError, match="missing"):
        _ = m.missing


def test_a_missing_library_fails_at_first_use_naming_the_extra():
    m = lazy("flatlab_no_such_library", extra="clip")  # defining it is fine
    with pytest.raises(ImportError, match=r"flatlab_no_such_library .*pip install 'flatlab\[clip\]'"):
        _ = m.anything
    assert not hasattr(m, "__file__")  # introspection does not try the import


def test_a_submodule_and_a_pickle_round_trip():
    path = lazy("os.path")
    assert path.join("a", "b") == os.path.join("a", "b") and "join" in dir(path)
    back = pickle.loads(pickle.dumps(lazy("json", extra="x")))
    assert back.loads("[1]") == [1] and repr(back).startswith("<lazy module 'json'")


@pytest.mark.parametrize("name", ["", ".relative"])
def test_a_name_must_be_absolute(name):
    with pytest.raises(ValueError, match="absolute module name"):
        lazy(name)


def test_load_imports_now_and_raises_the_imports_own_error(monkeypatch):
    fake = types.ModuleType("flatlab_lazy_loaded")
    monkeypatch.setitem(sys.modules, "flatlab_lazy_loaded", fake)
    assert load(lazy("flatlab_lazy_loaded")) is fake and load(os) is os
    with pytest.raises(ImportError, match="^No module named 'flatlab_no_such_library'$"):
        load(lazy("flatlab_no_such_library", extra="clip"))  # unwrapped: the caller words its own error
