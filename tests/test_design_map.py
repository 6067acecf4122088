"""docs/design.md maps every module of the package: each module's file name appears in the map's block for
its folder, so a new module without a line there fails here."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "flatlab"
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def _map_block() -> str:
    text = DESIGN.read_text()
    start = text.index("## Module map")
    return text[start : text.index("## How a launch flows", start)]


def _folder_entries(block: str) -> dict:
    """``{folder: text of its entry}`` from the map's code block (a folder's entry runs until the next one)."""
    code = block[
        block.index("```\nplatform/flatlab/") : block.index("\n```", block.index("```\nplatform/flatlab/") + 4)
    ]
    entries, current = {}, ""
    for line in code.splitlines()[2:]:
        m = re.match(r"  (\S+/|[\w_.]+(?:, [\w_.]+)*)\s", line)
        if m and not line.startswith("   "):
            current = m.group(1)
        entries[current] = entries.get(current, "") + " " + line
    return entries


def test_every_module_is_on_the_map():
    entries = _folder_entries(_map_block())
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        folder = f"{rel.parts[0]}/" if len(rel.parts) > 1 else ""
        stem = path.stem
        if stem == "__init__" and folder:
            continue  # a package's own docstring maps it
        text = " ".join(v for k, v in entries.items() if k == folder) if folder else " ".join(entries.values())
        if not re.search(rf"(?<![\w.]){re.escape(stem)}(\.py)?(?![\w])", text):
            missing.append(str(rel))
    assert missing == [], f"modules missing from docs/design.md's module map: {missing}"


def test_the_map_names_no_module_that_is_gone():
    block = _map_block()
    named = {n for n in re.findall(r"([a-z_]+)\.py", block) if not n.startswith("test_")}  # tests/ are not modules
    present = {p.stem for p in PACKAGE.rglob("*.py")}
    assert named - present == set()
