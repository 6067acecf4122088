"""No function in ``platform/flatlab`` runs longer than :data:`MAX_BODY_LINES`, except those named in
:data:`EXCEPTIONS`, each with its reason.

A function's length is that of its body, read with ``ast``: from its first statement after the
docstring to its last line, comments and blank lines inside included; a nested function counts in its
parent and on its own. The signature and the docstring are not counted: a long parameter list (a
Typer command's options) or a thorough docstring is no reason to split a function.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, Tuple

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "flatlab"
MAX_BODY_LINES = 60

EXCEPTIONS: Dict[str, str] = {
    "train/trainer.py::Trainer.__init__": (
        "the trainer's set-up kept whole: model, precision, data parallelism, optimizer and schedule, each "
        "built from the one before"
    ),
    "train/closure.py::BatchClosure._pass": (
        "numerical kernel kept whole: the forward and backward pass over a chunked batch, with its "
        "sampled-label gradients and loss scaling"
    ),
}


def body_lines(node: ast.AST) -> int:
    """Lines of ``node``'s body without its docstring (0 for a function that is only a docstring)."""
    body = list(node.body)
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:
        return 0
    return node.end_lineno - body[0].lineno + 1


def functions(root: Path = PACKAGE) -> Iterator[Tuple[str, int]]:
    """``("<file>::<Class>.<function>", body lines)`` of every function and method under ``root``."""
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, n in _visit(tree, ""):
            yield f"{path.relative_to(root).as_posix()}::{name}", n


def _visit(node: ast.AST, prefix: str) -> Iterator[Tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            yield name, body_lines(child)
            yield from _visit(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _visit(child, f"{prefix}{child.name}.")
        else:
            yield from _visit(child, prefix)


def test_no_function_is_longer_than_the_limit():
    lengths = dict(functions())
    assert len(lengths) > 500  # the package is read
    too_long = {name: n for name, n in lengths.items() if n > MAX_BODY_LINES and name not in EXCEPTIONS}
    assert too_long == {}, f"split these (or list them in EXCEPTIONS with a reason): {too_long}"


def test_every_exception_is_still_needed_and_has_a_reason():
    lengths = dict(functions())
    assert all(reason.strip() for reason in EXCEPTIONS.values())
    stale = {name: lengths.get(name) for name in EXCEPTIONS if lengths.get(name, 0) <= MAX_BODY_LINES}
    assert stale == {}, f"no longer over {MAX_BODY_LINES} lines (or gone): remove them from EXCEPTIONS"


def test_the_count_leaves_out_the_docstring_and_counts_nested_functions(tmp_path):
    (tmp_path / "m.py").write_text(
        "class A:\n"
        "    def f(self):\n"
        '        """Doc.\n\n        More.\n        """\n'
        "        x = 1\n"
        "\n"
        "        def g():\n"
        "            return x\n"
        "        return g\n"
        "\n"
        "def h():\n"
        '    """Only a docstring."""\n'
    )
    assert dict(functions(tmp_path)) == {"m.py::A.f": 5, "m.py::A.f.g": 1, "m.py::h": 0}
