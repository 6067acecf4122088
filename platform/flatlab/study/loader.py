"""Loading study files: a Python module in ``studies/`` exposing ``STUDY``, ``STUDIES`` or ``build(scale)``."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from flatlab.analysis.curve_sets import Published
from flatlab.errors import ConfigError, did_you_mean
from flatlab.extensions import USER_MODULES
from flatlab.study.spec import Arm, Resources, Study
from flatlab.study.validate import validate
from flatlab.train.config import TRAINER_HPARAMS

STUDY_MODULE_PREFIX = "flatlab_study_"  # a study file's module name: the prefix, then the file's stem


def load_module(path: str):
    """Import the study file at ``path`` as a module (not added to ``sys.modules``' package tree).

    As for a script, the file's folder is searched first for its imports while it runs (a user module
    next to it: ``from my_workload import MyWorkload``). The module, and the modules it loaded from its
    folder, are recorded in :data:`flatlab.extensions.USER_MODULES`: the workloads, optimizers and
    measures they register reach the trials' processes by value (:mod:`flatlab.extensions`). Loading a
    file again registers its entries again, which is no clash.
    """
    p = Path(path)
    if p.is_dir():
        raise ConfigError(
            f"{path!r} is a directory; give a study file, e.g. studies/digits_demo.py (`flatlab studies` lists them)"
        )
    if not p.is_file():
        raise ConfigError(f"study file {path!r} does not exist{_missing_file_hint(p)}")
    mod_name = f"{STUDY_MODULE_PREFIX}{p.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise ConfigError(f"study file {path!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses defined in the file need their module registered
    folder = str(p.resolve().parent)
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        _run_study_code(path, lambda: spec.loader.exec_module(module))  # type: ignore[union-attr]
    finally:
        sys.path.remove(folder)

    USER_MODULES.add(mod_name)
    USER_MODULES.update(
        name
        for name in set(sys.modules) - before
        if not (name == "flatlab" or name.startswith("flatlab.")) and _defined_in(sys.modules[name], folder)
    )
    return module


def local_files(path: str) -> List[Path]:
    """The Python files, in the folder of the study file at ``path`` or below it, of the modules loaded
    from there while study files were loaded (:func:`load_module`, :data:`flatlab.extensions.USER_MODULES`):
    what the study file imports beside it, e.g. ``_flatness_arms.py`` or ``lib/arms.py``. The study files
    themselves are left out. Paths are relative to that folder, sorted; ``[]`` before the file was loaded
    in this process, or when it imports nothing from its folder."""
    study = Path(path).resolve()
    folder = study.parent
    found = set()
    for name in USER_MODULES:
        file = getattr(sys.modules.get(name), "__file__", None)
        if name.startswith(STUDY_MODULE_PREFIX) or not file:
            continue
        f = Path(file).resolve()
        if f.suffix == ".py" and f != study and f.is_file() and f.is_relative_to(folder):
            found.add(f.relative_to(folder))
    return sorted(found)


def _defined_in(module: Any, folder: str) -> bool:
    """Whether ``module`` was loaded from a file in ``folder`` (or below it)."""
    path = getattr(module, "__file__", None)
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(folder)
    except (OSError, ValueError):
        return False


def _missing_file_hint(p: Path) -> str:
    """Why a study path was not found and the fix: a relative path is read from the working directory;
    name a file that exists there under another spelling (``.py`` added, the project's ``studies/``), or
    the closest name (:func:`_close_study_file`: ``studies/digit_demo.py`` -> ``studies/digits_demo.py``)."""
    cwd = Path.cwd()
    project = Path(__file__).resolve().parents[3]  # platform/flatlab/study/loader.py -> the checkout
    where = f" (a relative path is read from the working directory {cwd})"
    if not p.is_absolute():
        tries = (
            [
                cwd / p.with_suffix(".py"),
                project / p,
                project / p.with_suffix(".py"),
                project / "studies" / p.name,
                project / "studies" / p.with_suffix(".py").name,
            ]
            if p.suffix in ("", ".py")
            else [project / p]
        )
        found = next((t for t in tries if t.is_file()), None)
        if found:
            return f"{where}; did you mean {found}?"
    close = _close_study_file(p, project / "studies")
    if close:  # a relative path answered from the project's studies/: say where it was looked for
        return f"{where if close.is_absolute() and not p.is_absolute() else ''}; did you mean {close}?"
    return "" if p.is_absolute() else f"{where}; give its absolute path, or run from the folder it is relative to"


def _close_study_file(p: Path, studies: Path) -> Optional[Path]:
    """The study file whose name is closest to ``p``'s (difflib's ratio >= 0.6), among the ``*.py`` files
    of ``p``'s folder, then of ``studies`` (the project's): as ``p`` spells its folder when it is there,
    else relative to the working directory when below it, else absolute. ``None`` when nothing is close."""
    name = p.name if p.suffix else f"{p.name}.py"
    for folder, shown in ((p.parent, p.parent), (studies, None)):
        if not folder.is_dir():
            continue
        names = sorted(f.name for f in folder.glob("*.py") if not f.name.startswith("_"))  # _modules: shared code
        match = difflib.get_close_matches(name, names, n=1)
        if match:
            if shown is not None:
                return shown / match[0]
            try:
                return (folder / match[0]).relative_to(Path.cwd())
            except ValueError:
                return folder / match[0]
    return None


def _run_study_code(path: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` (executing the study file, or its ``build(scale)``), with any error it raises turned
    into ONE :class:`ConfigError` naming the file and, where known, the line: a study author gets a
    message, not a traceback."""
    try:
        return fn()
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except SyntaxError as exc:
        raise ConfigError(f"{path}, line {exc.lineno}: syntax error: {exc.msg}") from None
    except ImportError as exc:
        raise ConfigError(f"{path}{_line_in(path, exc)}: {exc}; is it installed (or spelt right)?") from None
    except Exception as exc:
        keyword = _keyword_error(path, exc) if isinstance(exc, TypeError) else None
        if keyword is not None:
            raise keyword from None
        raise ConfigError(f"{path}{_line_in(path, exc)}: {type(exc).__name__}: {exc}") from None


def _line_in(path: str, exc: BaseException) -> str:
    """``", line N"`` of the innermost traceback frame in the study file itself, else ``""``."""
    target = str(Path(path).resolve())
    line = ""
    tb = exc.__traceback__
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()) == target:
            line = f", line {tb.tb_lineno}"
        tb = tb.tb_next
    return line


_UNEXPECTED = re.compile(r"(?<![\w.])(Study|Arm|Resources)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


def _keyword_error(path: str, exc: TypeError) -> Optional[ConfigError]:
    """A ConfigError for ``Study(misspelt=...)`` (and Arm/Resources) naming the valid fields, else None."""
    m = _UNEXPECTED.search(str(exc))
    if m is None:
        return None
    cls = {"Study": Study, "Arm": Arm, "Resources": Resources}[m.group(1)]
    key = m.group(2)
    valid = [f.name for f in dataclasses.fields(cls)]
    hint = did_you_mean(key, valid)
    if cls is Study and key in {h.name for h in TRAINER_HPARAMS}:
        hint = f" ({key!r} is a trainer parameter: put it in train={{...}}, or in an arm's space)"
    return ConfigError(f"{path}: {m.group(1)}() has no field {key!r}{hint}; its fields: {', '.join(valid)}")


def load_studies(path: str, scale: Optional[str] = None) -> List[Study]:
    """The validated studies of a study file.

    A file exposes ``STUDY`` (one :class:`Study`), ``STUDIES`` (a list), or ``build(scale) -> Study | list``
    together with ``SCALES`` (names, the first one the default), e.g. ``("paper", "smoke")``.

    Raises:
        ConfigError: missing file, nothing exported, an unknown ``scale`` (naming the valid ones), or
            any invalid study (all problems listed, naming the file, arm and field).
    """
    module = load_module(path)
    scales = _scales(path, module)
    if hasattr(module, "build") and scales:
        chosen = scale or scales[0]
        if chosen not in scales:
            raise ConfigError(f"{path}: scale={chosen!r} is not defined; valid scales: {', '.join(scales)}")
        found = _run_study_code(path, lambda: module.build(chosen))
        export = f"build({chosen!r})"
    elif scale is not None:
        raise ConfigError(f"{path}: --scale {scale!r} given, but this study file defines no SCALES/build(scale)")
    elif hasattr(module, "STUDIES"):
        found, export = module.STUDIES, "STUDIES"
    elif hasattr(module, "STUDY"):
        found, export = module.STUDY, "STUDY"
    else:
        raise ConfigError(f"{path}: a study file must define STUDY, STUDIES, or SCALES with build(scale)")
    studies = [found] if isinstance(found, Study) else list(found) if isinstance(found, (list, tuple)) else None
    if not studies or not all(isinstance(s, Study) for s in studies):
        got = "nothing (None)" if found is None else f"{found!r} ({type(found).__name__})"
        raise ConfigError(
            f"{path}: {export} must be a flatlab.Study (or, for STUDIES and build(scale), "
            f"a non-empty list of them); got {got}"
        )
    names = [s.name for s in studies]
    if len(set(map(repr, names))) != len(names):
        raise ConfigError(f"{path}: study names must be unique within a file, got {names}")
    folder = Path(path).resolve().parent  # a published reference's relative path is relative to the study file
    studies = [
        dataclasses.replace(s, published=s.published.relative_to(folder)) if isinstance(s.published, Published) else s
        for s in studies
    ]
    problems = []
    for s in studies:  # every study's problems at once
        try:
            validate(s, source=path)
        except ConfigError as exc:
            problems.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - a value no check foresaw: still one message, not a traceback
            problems.append(f"{path}: study {s.name!r}: could not be validated: {type(exc).__name__}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    return studies


def _scales(path: str, module: Any) -> Tuple[str, ...]:
    """The file's ``SCALES`` (a tuple or list of names; ``()`` when absent).

    Raises:
        ConfigError: ``SCALES`` is not a list/tuple of strings.
    """
    scales = getattr(module, "SCALES", ())
    if not isinstance(scales, (list, tuple)) or not all(isinstance(x, str) for x in scales):
        raise ConfigError(
            f"{path}: SCALES={scales!r}; expected a tuple of scale names, the first the default, "
            "e.g. SCALES = ('paper', 'smoke')"
        )
    return tuple(scales)


EXPORTS = ("STUDY", "STUDIES", "build")  # what makes a file a study file (:func:`load_studies`)


@dataclasses.dataclass(frozen=True)
class FileDescription:
    """A study file as ``flatlab studies`` lists it, read from its syntax tree (nothing runs).

    Attributes:
        summary: the first paragraph of the module docstring, on one line (``""`` without one; the
            error for a file that does not parse).
        scales: its ``SCALES`` (the values of ``flatlab run --scale``, the first the default); ``()``
            without one; ``None`` when ``SCALES`` is not a literal (computed: known only by running the file).
        is_study: whether the file defines ``STUDY``, ``STUDIES`` or ``build`` at top level; ``False``: a
            module the study files next to it import (a user workload: ``studies/examples/two_moons.py``).
            A file that does not parse counts as a study file (its summary says what is wrong).
    """

    summary: str
    scales: Optional[Tuple[str, ...]]
    is_study: bool


def describe_file(path: str) -> FileDescription:
    """What ``flatlab studies`` shows of the file at ``path``: its docstring's summary, its scales and
    whether it is a study file, from its top-level statements (``SCALES = ...``, ``STUDY = ...``,
    ``def build``, or those names imported). Never imports the file, so listing is fast and safe.

    Raises:
        OSError: the file cannot be read.
    """
    try:
        tree = ast.parse(Path(path).read_text())
    except SyntaxError as exc:
        return FileDescription(f"(syntax error: {exc.msg}, line {exc.lineno})", (), True)
    doc = ast.get_docstring(tree)
    defined = {}  # top-level name -> its value's node (None: a def or an import)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            defined.update((t.id, node.value) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined[node.target.id] = node.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update(((a.asname or a.name).split(".")[0], None) for a in node.names)
    scales: Optional[Tuple[str, ...]] = ()
    if "SCALES" in defined:
        try:
            value = ast.literal_eval(defined["SCALES"]) if defined["SCALES"] is not None else None
        except (ValueError, TypeError, SyntaxError):  # a name, a call ...: not a literal
            value = None
        ok = isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value)
        scales = tuple(value) if ok else None  # type: ignore[arg-type]
    summary = " ".join((doc or "").strip().split("\n\n")[0].split())  # the first paragraph, on one line
    return FileDescription(summary, scales, any(name in defined for name in EXPORTS))
