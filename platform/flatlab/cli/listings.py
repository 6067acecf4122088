"""What there is to run: ``flatlab studies``, ``flatlab optimizers``, ``flatlab workloads``, ``flatlab measures``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import typer

from flatlab.analysis.console_table import make_table, print_table
from flatlab.cli.app import _fail, app, console
from flatlab.errors import FlatlabError
from flatlab.lazy import lazy

# torch: the registries and the study loader, imported by the command that lists them
study_loader = lazy("flatlab.study.loader")
optim_registry = lazy("flatlab.optim.registry")
train_config = lazy("flatlab.train.config")
workload_registry = lazy("flatlab.workloads.registry")
sharpness_measures = lazy("flatlab.sharpness.measures")
measure_registry = lazy("flatlab.sharpness.registry")

STUDIES_LEGEND = (
    "scales: the values of `flatlab run FILE --scale NAME`, the first the default; -: no --scale (one setting); "
    "(module): not a study file, a module the study files next to it import"
)


def _study_folders(directory: Path) -> List[Tuple[Path, List[Path]]]:
    """``directory`` and each of its subfolders (``examples/``), with their ``*.py`` files; names that
    start with ``_`` or ``.`` are skipped (shared code such as ``_flatness_arms.py``, ``__pycache__``)."""

    def listed(folder: Path) -> List[Path]:
        return sorted(p for p in folder.glob("*.py") if not p.name.startswith(("_", ".")))

    subs = (
        sorted(d for d in directory.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
        if directory.is_dir()
        else []
    )
    return [
        (folder, files) for folder, files in [(directory, listed(directory))] + [(d, listed(d)) for d in subs] if files
    ]


@app.command()
def studies(directory: Path = typer.Argument(Path("studies"), help="folder of study files")) -> None:
    """List the study files, one line each: the file, its scales (`flatlab run --scale`, the first the
    default) and its docstring's summary; then, a section each, those of the folder's
    subfolders (studies/examples/). Files are parsed, never run."""
    folders = _study_folders(directory)
    if not folders:
        _fail(FlatlabError(f"no study files in {directory} or its subfolders"))
    described = {p: study_loader.describe_file(str(p)) for _, files in folders for p in files}
    scales = {
        p: "(module)" if not d.is_study else "(computed)" if d.scales is None else ", ".join(d.scales) or "-"
        for p, d in described.items()
    }
    width = max(len(str(p)) for p in described)
    sw = max(len("scales"), *map(len, scales.values()))
    console.print(f"{'file':{width}s}  {'scales':{sw}s}  about", style="bold", markup=False)
    for i, (folder, files) in enumerate(folders):
        if i:
            console.print(f"\n{folder.name} ({folder}/):", style="bold", markup=False)
        for p in files:
            console.print(f"{str(p):{width}s}  {scales[p]:{sw}s}  {described[p].summary}", soft_wrap=True, markup=False)
    console.print(f"\n{STUDIES_LEGEND}", soft_wrap=True, markup=False)


def _fail_unknown(exc: FlatlabError, study_file: Optional[Path]) -> None:
    """Fail (exit 2) on an unknown optimizer/workload/measure name; without ``study_file``, the message
    also says how to list the entries a study file registers."""
    hint = "; one that a study file registers is listed with --study-file FILE"
    _fail(exc if study_file is not None else FlatlabError(f"{exc}{hint}"))


def _entries(registry, name: Optional[str], study_file: Optional[Path] = None) -> List[str]:
    """The names ``flatlab optimizers/workloads NAME`` shows: all without NAME; NAME itself; or, for a
    family prefix such as ``glue`` or ``lm``, its members (``glue/cola`` ...). An unknown NAME fails
    with the valid names (exit 2), and without ``study_file`` says how to list a study file's own."""
    if name is None:
        return registry.names()
    family = [n for n in registry.names() if n.startswith(f"{name}/")]
    if name not in registry and family:
        return family
    try:
        registry.get(name)
    except FlatlabError as exc:
        _fail_unknown(exc, study_file)
    return [name]


_STUDY_FILE_HELP = (
    "also the workloads, optimizers and measures this study file registers (it is run, as `flatlab run` runs it)"
)


def _load_extensions(study_file: Optional[Path]) -> None:
    """Run ``study_file`` (if given) so that the entries it registers are listed with flatlab's own
    (:func:`flatlab.study.loader.load_module`, as ``flatlab run`` loads it); a bad file fails with its
    error (exit 2)."""
    if study_file is None:
        return
    try:
        study_loader.load_module(str(study_file))
    except (FlatlabError, ValueError) as exc:
        _fail(exc)


@app.command()
def optimizers(
    name: Optional[str] = typer.Argument(None, help="show only this optimizer, e.g. tsam"),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered optimizers with their hyperparameters, defaults and allowed ranges."""
    _load_extensions(study_file)

    for entry in _entries(optim_registry.OPTIMIZERS, name, study_file):
        spec = optim_registry.OPTIMIZERS.get(entry)
        console.print(f"[bold]{entry}[/bold]  {spec.doc}")
        _hparam_table(spec.hparams)


@app.command()
def workloads(
    name: Optional[str] = typer.Argument(
        None,
        help="show only this workload (e.g. cifar10), a family (glue, lm), or 'trainer' for the trainer's parameters",
    ),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered workloads with their parameters, defaults and allowed ranges, then the
    trainer's parameters (any study or arm may set these)."""
    _load_extensions(study_file)

    names = [] if name == "trainer" else _entries(workload_registry.WORKLOADS, name, study_file)
    for n in names:
        cls = workload_registry.WORKLOADS.get(n)
        console.print(f"[bold]{n}[/bold]  {cls.doc}  metrics: {', '.join(cls.metrics)}")
        _hparam_table(cls.hparams)
    if name is None or name == "trainer":
        console.print("[bold]trainer[/bold] (any study or arm may set these)")
        _hparam_table(train_config.TRAINER_HPARAMS)
    else:
        console.print(
            "the trainer's parameters (batch_size, schedule, ...; any "
            "study or arm may set them): `flatlab workloads trainer`"
        )


@app.command()
def measures(
    name: Optional[str] = typer.Argument(None, help="show only this measure"),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered flatness measures (a study's `measures=`) with their parameters, defaults,
    allowed ranges, source and the metrics they log."""
    _load_extensions(study_file)

    try:
        names = (
            [measure_registry.get_measure(name).name] if name is not None else list(measure_registry.list_measures())
        )
    except FlatlabError as exc:
        _fail_unknown(exc, study_file)
    for n in names:
        m = measure_registry.get_measure(n)
        console.print(f"[bold]{m.name}[/bold]  {m.doc}", soft_wrap=True)
        console.print(f"  source: {m.source}", soft_wrap=True)
        console.print(f"  metrics: {', '.join(m.metrics)}", soft_wrap=True)
        _hparam_table(m.hparams)
    console.print(
        f"\nEvery trial that measures also logs {sharpness_measures.TIME_KEY}: "
        "the wall seconds all its measures took together."
    )


def _hparam_table(hparams) -> None:
    rows = [(h.name, repr(h.default), h.allowed(), h.doc) for h in hparams]
    print_table(
        console, make_table(("name", "default", "allowed", "meaning"), rows, prose=(3,), box=None, pad_edge=False)
    )
