"""The result tables in README.md and docs/ are the ones `make docs-results` saved, never hand-edited."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("docs_results", REPO / "tools" / "docs_results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_results_block_equals_its_saved_table():
    tool = _tool()
    tables = tool.saved_tables()
    seen = set()
    for path in tool.doc_files():
        for key, body in tool.blocks(path.read_text()):
            assert key in tables, f"{path.name}: block {key!r} has no docs/results/{key}.md"
            assert body == tables[key], (
                f"{path.name}: block {key!r} differs from docs/results/{key}.md; run `make docs-results`"
            )
            seen.add(key)
    assert {"fmnist_flatness", "fmnist_tuning_curves"} <= seen  # the Fashion-MNIST tables are among them


def test_every_saved_table_names_its_date_commit_and_commands():
    tool = _tool()
    tables = tool.saved_tables()
    assert tables, "docs/results/ holds no table"
    for key, text in tables.items():
        first = text.splitlines()[0]
        assert first.startswith("*Written by `make docs-results` on 20") and "at commit `" in first, key
        assert key in tool.RESULTS, f"docs/results/{key}.md is not an entry of tools/docs_results.py"
        assert "|" in text  # a table follows


def test_no_saved_table_names_an_absolute_path():
    # a path in a table is one a reader finds in a checkout, not a folder of the machine that ran the study
    absolute = re.compile(r"(?:^|[\s(`'\"=])(?:/[\w.-]+){2,}")
    for key, text in _tool().saved_tables().items():
        assert not absolute.search(text), (key, absolute.search(text))


def test_fill_replaces_only_the_named_blocks():
    tool = _tool()
    text = "a\n<!-- results:x -->\nold\n<!-- /results:x -->\nb\n<!-- results:y -->\nkeep\n<!-- /results:y -->\n"
    out = tool.fill(text, {"x": "| new |\n", "y": "keep\n"})
    assert (
        out == "a\n<!-- results:x -->\n| new |\n<!-- /results:x -->\nb\n<!-- results:y -->\nkeep\n<!-- /results:y -->\n"
    )
    assert tool.blocks(out) == [("x", "| new |\n"), ("y", "keep\n")]
    with pytest.raises(KeyError, match=r"docs/results/x\.md"):
        tool.fill(text, {"y": ""})


def test_every_entry_runs_a_study_file_of_the_repository():
    tool = _tool()
    for entry in tool.RESULTS.values():
        assert entry.table[0] in ("compare", "curves")
        for args in entry.run:
            assert args[0] == "run" and (REPO / args[1]).is_file(), args
        for study in entry.read():  # every study a table reads is run by some entry
            assert any(study == e.key for e in tool.RESULTS.values() if e.run), (entry.key, study)


def test_the_stamp_names_the_launches_a_table_reads(tmp_path):
    tool = _tool()
    import datetime as dt

    entry = tool.RESULTS["digits_fmnist_summary"]
    ran = tool.launches(entry, tmp_path)  # no launch there: said, not raised
    assert ran == [
        "digits_flatness_demo: launch not readable (FileNotFoundError)",
        "fmnist_flatness: launch not readable (FileNotFoundError)",
    ]
    line = tool.stamp(entry, dt.datetime(2026, 12, 4), "abc123", ran)
    assert line.startswith(
        "*Written by `make docs-results` on 2026-12-04 at commit `abc123`: `flatlab compare "
        "digits_flatness_demo fmnist_flatness"
    )
    assert "Runs: digits_flatness_demo: launch not readable" in line and line.endswith("*\n\n")


def test_the_stamp_gives_the_source_digest_where_the_commit_does_not_say_which_code_ran(tmp_path):
    import datetime as dt
    import json

    from flatlab.tracking import runs

    tool = _tool()
    entry = tool.RESULTS["digits_fmnist_summary"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = runs.client(uri)
    tags = {
        "digits_flatness_demo": {
            runs.TAG_COMMIT: "0123456789abcdef0123",
            runs.TAG_DIRTY: "false",
            runs.TAG_SOURCE: "aaaa000011112222",
        },
        "fmnist_flatness": {runs.TAG_COMMIT: "unknown", runs.TAG_SOURCE: "bbbb000011112222"},
    }
    for study, t in tags.items():
        exp = runs.get_or_create_experiment(uri, study, (tmp_path / "art").as_uri())
        run = c.create_run(exp, tags=t, start_time=int(dt.datetime(2026, 12, 4, 15, 42).timestamp() * 1000))
        (tmp_path / study).mkdir()
        (tmp_path / study / "launch.json").write_text(
            json.dumps({"tracking_uri": uri, "parent_run_id": run.info.run_id})
        )
    assert tool.launches(entry, tmp_path) == [
        "digits_flatness_demo launched 2026-12-04 15:42 at commit `0123456789ab`",  # clean commit: enough
        "fmnist_flatness launched 2026-12-04 15:42 at commit `unknown` (flatlab source digest `bbbb000011112222`)",
    ]
    c.set_tag(
        c.search_runs([runs.get_or_create_experiment(uri, "digits_flatness_demo")])[0].info.run_id,
        runs.TAG_DIRTY,
        "true",
    )
    assert tool.launches(entry, tmp_path)[0] == (
        "digits_flatness_demo launched 2026-12-04 15:42 at commit "
        "`0123456789ab+dirty` (flatlab source digest `aaaa000011112222`)"
    )
