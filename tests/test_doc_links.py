"""The documents a user reads in a clone point only at files the clone holds."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown [text](target)
PARENT = re.compile(r"`(\.\./[^`\s]*)`")  # a `../path` in a code span, e.g. `../bench/README.md`


def _targets(doc: Path):
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        yield target.split("#")[0]


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for doc in DOCS:
        for target in _targets(doc):
            path = (doc.parent / target).resolve()
            if not path.exists() or REPO not in path.parents and path != REPO:
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, broken
    assert sum(1 for doc in DOCS for _ in _targets(doc)) > 10  # the pattern does find the documents' links


def test_every_parent_relative_path_in_code_spans_exists_in_the_repository():
    missing = []
    for doc in DOCS:
        for span in PARENT.findall(doc.read_text()):
            path = (doc.parent / span).resolve()
            if not path.exists() or REPO not in path.parents:
                missing.append(f"{doc.relative_to(REPO)}: {span}")
    assert not missing, missing
