"""A launch's ``study/`` artifacts: the study file and the Python files it imports from its folder (and
below), at their relative paths, so the downloaded folder runs again; nothing else from that folder."""

import sys
from pathlib import Path

from flatlab.study.loader import load_studies, local_files
from flatlab.study.options import RunOptions
from flatlab.study.parent_run import common_tags, open_parent_run
from flatlab.tracking import runs

STUDY_FILE = """
from flatlab import Study

from _upload_arms import ARMS
from upload_lib.more import WIDTH

STUDY = Study(name="upload", workload="digits", workload_params={"width": WIDTH}, arms=ARMS, num_trials=1, max_epochs=1)
"""

ARMS_FILE = """
from flatlab import Arm
from flatlab import space as sp

ARMS = (Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),)
"""


def _study_folder(folder: Path) -> Path:
    """A study file that imports a module beside it and one from a package below it, and an unrelated file."""
    (folder / "upload_lib").mkdir(parents=True)
    (folder / "upload_lib" / "__init__.py").write_text("")
    (folder / "upload_lib" / "more.py").write_text("WIDTH = 16\n")
    (folder / "_upload_arms.py").write_text(ARMS_FILE)
    (folder / "unrelated.py").write_text("X = 1\n")
    study = folder / "upload.py"
    study.write_text(STUDY_FILE)
    return study


def test_the_launch_run_holds_the_study_file_and_the_modules_it_imports(tmp_path, monkeypatch):
    study_file = _study_folder(tmp_path / "studies")
    (study,) = load_studies(str(study_file))
    imported = [Path("_upload_arms.py"), Path("upload_lib/__init__.py"), Path("upload_lib/more.py")]
    assert local_files(str(study_file)) == imported

    root = tmp_path / "root"
    uri = runs.default_tracking_uri(root)
    opts = RunOptions(root=root, source=str(study_file))
    _, parent, _ = open_parent_run(study, opts, uri, root, common_tags(study, opts), None, {})
    client = runs.client(uri)

    def listed(path: str):
        return sorted(a.path for a in client.list_artifacts(parent, path))

    assert listed("study") == ["study/_upload_arms.py", "study/upload.py", "study/upload_lib"]
    assert listed("study/upload_lib") == ["study/upload_lib/__init__.py", "study/upload_lib/more.py"]
    downloaded = Path(client.download_artifacts(parent, "study", str(tmp_path / "down")))
    assert (downloaded / "_upload_arms.py").read_text() == ARMS_FILE
    for name in ("_upload_arms", "upload_lib", "upload_lib.more"):  # imported again, from the download
        monkeypatch.delitem(sys.modules, name)
    assert [s.name for s in load_studies(str(downloaded / "upload.py"))] == ["upload"]  # runs again
    assert Path(sys.modules["upload_lib.more"].__file__).resolve() == (downloaded / "upload_lib" / "more.py").resolve()


def test_a_study_file_that_imports_nothing_beside_it_has_no_local_files(tmp_path):
    folder = tmp_path / "alone"
    folder.mkdir()
    (folder / "helper_not_imported.py").write_text("Y = 2\n")
    study_file = folder / "alone.py"
    study_file.write_text(
        'from flatlab import Arm, Study\nfrom flatlab import space as sp\n\nSTUDY = Study(name="alone", '
        'workload="digits", arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),), num_trials=1, max_epochs=1)\n'
    )
    load_studies(str(study_file))
    assert local_files(str(study_file)) == []
