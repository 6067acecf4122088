"""docs/papers.md, the table of coverage of the three papers: every row names a study file that exists in
studies/ (or says why it has none, ``none: <reason>``), every paper study file appears in it, and each
paper has its section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "papers.md"


def rows():
    """``(section, item, study cell)`` of every table row of the document (header rows left out)."""
    section, out = "", []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0] not in ("item", "---"):
            out.append((section, cells[0], cells[1]))
    return out


def test_every_row_names_an_existing_study_or_says_why_not():
    found = rows()
    assert len(found) >= 25
    for section, item, study in found:
        if study.startswith("none:"):
            assert len(study) > len("none: ") + 10, (section, item)  # a reason, not a bare "none"
            continue
        names = re.findall(r"`([\w.]+\.py)`", study)
        assert names, (section, item, study)
        for name in names:
            assert (ROOT / "studies" / name).is_file(), (section, item, name)


def test_every_paper_study_file_has_a_row_and_every_paper_a_section():
    named = {n for _, _, study in rows() for n in re.findall(r"`([\w.]+\.py)`", study)}
    papers = {p.name for p in (ROOT / "studies").glob("*.py") if p.name.startswith(("ire_", "tsam_", "toy_", "rft_"))}
    assert papers <= named, papers - named
    sections = {s for s, _, _ in rows()}
    assert sections == {
        'TSAM: "Reweighting Local Minima with Tilted SAM"',
        'IRE: "Improving Generalization and Convergence by Enhancing Implicit Regularization"',
        'CLIP: "In Search of the Successful Interpolation"',
    }
