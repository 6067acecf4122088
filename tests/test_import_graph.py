"""The import graph of the ``flatlab`` package, read from the source with ``ast`` (nothing is imported).

1. A workload is data, model, loss and evaluation only: no module under ``flatlab/workloads`` imports
   ``flatlab.tracking``, ``flatlab.study`` or ``mlflow``, at module level or inside a function
   (checkpoints named by earlier trials are resolved at launch by ``flatlab.study.chain`` and fetched by
   ``flatlab.tracking.checkpoints``; reports over a study's trials are ``flatlab.reports.declared``').
2. No cycles among ``flatlab`` modules. An edge is every import of a flatlab module at module level AND
   inside functions: a function-level import only defers loading (a heavy library, an optional
   dependency), it is still a dependency, and a deferred import is exactly how an import cycle hides
   (``study.trainable`` <-> ``study.ddp_trial`` and ``study.space`` <-> ``study.foreign`` both did).
   Not edges: imports under ``if TYPE_CHECKING:`` (no run-time dependency); imports inside a
   module-level ``__getattr__`` (PEP 562 lazy re-exports: ``flatlab.run`` -> ``flatlab.api``, the
   package's public face for users, which its own modules never go through); and the implicit import
   of parent packages (``import flatlab.study.spec`` runs ``flatlab/__init__.py`` too, which re-exports
   ``Study`` from there: counted, every module would sit in a cycle with the package).
   ``from package import name`` where ``package.name`` is a module is an edge to that module.
   A deferred import, ``pd = lazy("pandas")`` (:mod:`flatlab.lazy`), is an import like any other.
3. Functions import nothing themselves: a module names its dependencies at its top, and defers a heavy or
   optional one with ``lazy``. Exempt: a module-level ``__getattr__`` (PEP 562 re-exports).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "flatlab"
FORBIDDEN_IN_WORKLOADS = ("flatlab.tracking", "flatlab.study", "mlflow")


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> Dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> file."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, name: str) -> Iterator[Tuple[str, int]]:
    """``(imported name, line)`` of every import in the file ``path`` of module ``name``: absolute names,
    relative ones resolved; ``from a import b`` gives ``a.b`` (the caller keeps it if ``a.b`` is a module,
    else falls back to ``a``). Skips ``if TYPE_CHECKING:`` blocks and module-level ``__getattr__``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(nodes: List[ast.stmt]) -> Iterator[ast.AST]:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                yield from walk(node.orelse)
                continue
            yield from ast.walk(node)

    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")]
    for node in walk(body):
        deferred = _lazy_target(node)
        if deferred is not None:
            yield deferred, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def _lazy_target(node: ast.AST) -> Optional[str]:
    """The module a ``lazy("name")`` call (:mod:`flatlab.lazy`) defers, else None."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    first = node.args[0]
    if called == "lazy" and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _owner(imported: str, known: Dict[str, Path]) -> Optional[str]:
    """The flatlab module ``imported`` names (itself, or the longest prefix that is a module)."""
    while imported:
        if imported in known:
            return imported
        imported = imported.rpartition(".")[0]
    return None


def graph(root: Path = PACKAGE) -> Dict[str, Set[str]]:
    """Module -> the flatlab modules it imports (see the module docstring for what counts)."""
    known = modules(root)
    out: Dict[str, Set[str]] = {}
    for name, path in known.items():
        targets = {_owner(imported, known) for imported, _ in imports(path, name)}
        out[name] = {t for t in targets if t is not None and t != name}
    return out


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def _forbidden(imported: str) -> bool:
    return any(imported == f or imported.startswith(f + ".") for f in FORBIDDEN_IN_WORKLOADS)


def test_no_workload_module_imports_tracking_study_or_mlflow():
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {imported}"
        for name, path in modules().items()
        if name == "flatlab.workloads" or name.startswith("flatlab.workloads.")
        for imported, line in imports(path, name)
        if _forbidden(imported)
    ]
    assert bad == []


SCIENCE = ("flatlab.optim", "flatlab.sharpness")
FORBIDDEN_IN_SCIENCE = ("ray", "mlflow", "optuna", "flatlab.tracking", "flatlab.study")


def test_the_optimizers_and_measures_import_no_platform():
    # the science runs in any training loop: no Ray, MLflow, Optuna or study machinery behind it
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {imported}"
        for name, path in modules().items()
        if any(name == s or name.startswith(s + ".") for s in SCIENCE)
        for imported, line in imports(path, name)
        if any(imported == f or imported.startswith(f + ".") for f in FORBIDDEN_IN_SCIENCE)
    ]
    assert len([n for n in modules() if n.startswith("flatlab.optim.")]) > 5 and bad == []


LAYERS = {
    # analysis computes from a typed sample: it reads and writes no store, knows no launch and runs no
    # model (no torch; the ranges of the quantities are handed to it: flatlab.ranges)
    "flatlab.analysis": (
        "mlflow",
        "ray",
        "optuna",
        "torch",
        "flatlab.tracking",
        "flatlab.study",
        "flatlab.cli",
        "flatlab.train",
        "flatlab.workloads",
        "flatlab.sharpness",
        "flatlab.optim",
        "flatlab.interpolation",
    ),
    # tracking is MLflow's input and output: what it needs of a launch, a trainer or a workload is passed in
    "flatlab.tracking": ("flatlab.study", "flatlab.cli", "flatlab.train", "flatlab.workloads", "flatlab.interpolation"),
    # the measures run in any training loop, on any model: no trainer, no workload
    "flatlab.sharpness": ("flatlab.train", "flatlab.workloads"),
}


def _layer_violations(layers=LAYERS, root: Path = PACKAGE) -> List[str]:
    return [
        f"{path.relative_to(root.parent)}:{line}: {imported}"
        for name, path in modules(root).items()
        for layer, forbidden in layers.items()
        if name == layer or name.startswith(layer + ".")
        for imported, line in imports(path, name)
        if any(imported == f or imported.startswith(f + ".") for f in forbidden)
    ]


def test_analysis_tracking_and_sharpness_import_nothing_above_them():
    assert {"flatlab.analysis.sample", "flatlab.tracking.trials", "flatlab.sharpness.fisher"} <= set(modules())
    assert _layer_violations() == []


def test_the_layer_check_names_each_forbidden_layer(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "flatlab/__init__.py": "",
            "flatlab/analysis/__init__.py": "",
            "flatlab/analysis/t.py": "import torch\nfrom flatlab.workloads.base import x\n",
            "flatlab/tracking/__init__.py": "",
            "flatlab/tracking/a.py": "from flatlab.train import curve\nfrom flatlab.analysis import t\n",
            "flatlab/tracking/m.py": "def load():\n    from flatlab.workloads.registry import build_workload\n",
            "flatlab/sharpness/__init__.py": "",
            "flatlab/sharpness/f.py": "def f():\n    from flatlab.train.closure import sample_labels\n",
        },
    )
    assert _layer_violations(root=pkg) == [
        "flatlab/analysis/t.py:1: torch",
        "flatlab/analysis/t.py:2: flatlab.workloads.base.x",
        "flatlab/sharpness/f.py:2: flatlab.train.closure.sample_labels",
        "flatlab/tracking/a.py:1: flatlab.train.curve",
        "flatlab/tracking/m.py:2: flatlab.workloads.registry.build_workload",
    ]


def test_the_layer_check_finds_an_import_inside_a_function(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "flatlab/__init__.py": "",
            "flatlab/analysis/__init__.py": "",
            "flatlab/analysis/t.py": "def f():\n    from flatlab.tracking import runs\n    import mlflow\n",
            "flatlab/tracking/__init__.py": "",
            "flatlab/tracking/runs.py": "from flatlab.analysis import t\n",
        },
    )
    assert _layer_violations(root=pkg) == [
        "flatlab/analysis/t.py:2: flatlab.tracking.runs",
        "flatlab/analysis/t.py:3: mlflow",
    ]


def test_no_import_cycles_among_flatlab_modules():
    edges = graph()
    assert len(edges) > 80 and "flatlab.study.spec" in edges["flatlab"]  # the graph is read
    assert cycles(edges) == []


# ---- the checks themselves, on a small package written here ---------------------------------------
def _write(root: Path, files: Dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "flatlab"


def test_function_level_imports_close_a_cycle_and_the_exemptions_do_not(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "flatlab/__init__.py": (
                "from flatlab.a import A\n\ndef __getattr__(name):\n    from flatlab import c\n    return c\n"
            ),
            "flatlab/a.py": "A = 1\n\ndef later():\n    from flatlab.b import B\n    return B\n",
            "flatlab/b.py": "from .a import A\nB = A\n",
            "flatlab/c.py": (
                "import flatlab\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from flatlab.d import D\n"
            ),
            "flatlab/d.py": "from flatlab import c\n",
            "flatlab/w/__init__.py": "",
            "flatlab/w/x.py": "import os\n\ndef f():\n    import mlflow.tracking\n    from ..tracking import runs\n",
        },
    )
    edges = graph(pkg)
    assert edges["flatlab.a"] == {"flatlab.b"} and edges["flatlab.b"] == {"flatlab.a"}  # relative import resolved
    assert edges["flatlab"] == {"flatlab.a"}  # __getattr__'s lazy import is not an edge
    assert edges["flatlab.c"] == {"flatlab"} and edges["flatlab.d"] == {"flatlab.c"}  # TYPE_CHECKING is not one
    assert cycles(edges) == [["flatlab.a", "flatlab.b"]]
    assert [i for i, _ in imports(pkg / "w" / "x.py", "flatlab.w.x") if _forbidden(i)] == [
        "mlflow.tracking",
        "flatlab.tracking.runs",
    ]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("flatlab.tracking", True),
        ("flatlab.tracking.runs", True),
        ("mlflow", True),
        ("flatlab.trackingx", False),
        ("flatlab.train.trainer", False),
    ],
)
def test_forbidden_names(name, expected):
    assert _forbidden(name) is expected


HEAVY = ("torch", "ray", "mlflow", "optuna", "pandas")


@pytest.mark.parametrize("module", ["flatlab", "flatlab.study.spec"])
def test_reading_a_study_config_loads_no_heavy_library(module):
    # a study file's configuration (Study, Arm, Resources, Published) is read without torch, Ray, MLflow,
    # Optuna or pandas; a fresh interpreter, since this test process has loaded them all already
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == ""


# ---- deferred imports: one mechanism, at the module's top -------------------------------------------
def function_level_imports(root: Path = PACKAGE) -> List[str]:
    """``file:line: name`` of every import statement inside a function or method, and of every ``lazy``
    call that is not at a module's top level (module-level ``__getattr__`` exempt)."""
    found = []
    for path in modules(root).values():
        tree = ast.parse(path.read_text(), filename=str(path))
        for top in tree.body:
            if isinstance(top, ast.FunctionDef) and top.name == "__getattr__":
                continue
            inner = [n for n in ast.walk(top) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
            for function in inner:
                for node in ast.walk(function):
                    if isinstance(node, ast.Import):
                        named = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        named = [f"{'.' * node.level}{node.module or ''}"]
                    elif _lazy_target(node) is not None:
                        named = [f"lazy({_lazy_target(node)})"]
                    else:
                        continue
                    found += [f"{path.relative_to(root.parent)}:{node.lineno}: {n}" for n in named]
    return sorted(set(found))


def test_functions_import_nothing_themselves():
    assert function_level_imports() == []


def test_a_deferred_import_is_an_edge_a_layer_check_sees_and_a_function_import_is_found(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "flatlab/__init__.py": "def __getattr__(name):\n    from flatlab import a\n    return a\n",
            "flatlab/lazy.py": "def lazy(name):\n    return name\n",
            "flatlab/analysis/__init__.py": "",
            "flatlab/analysis/t.py": (
                "from flatlab.lazy import lazy\nimport flatlab.lazy as fl\n"
                "torch = lazy('torch')\nruns = fl.lazy('flatlab.tracking.runs')\nstats = lazy('scipy.stats')\n"
            ),
            "flatlab/tracking/__init__.py": "",
            "flatlab/tracking/runs.py": (
                "class R:\n    def m(self):\n        import mlflow\n\n"
                "def f():\n    from . import other\n    pd = lazy('pandas')\n"
            ),
            "flatlab/tracking/other.py": "from flatlab.lazy import lazy\nt = lazy('flatlab.analysis.t')\n",
        },
    )
    assert _layer_violations(root=pkg) == [
        "flatlab/analysis/t.py:3: torch",
        "flatlab/analysis/t.py:4: flatlab.tracking.runs",
    ]
    assert cycles(graph(pkg)) == [["flatlab.analysis.t", "flatlab.tracking.other", "flatlab.tracking.runs"]]
    assert function_level_imports(pkg) == [
        "flatlab/tracking/runs.py:3: mlflow",
        "flatlab/tracking/runs.py:6: .",
        "flatlab/tracking/runs.py:7: lazy(pandas)",
    ]
