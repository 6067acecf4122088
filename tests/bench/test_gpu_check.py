"""bench/gpu_check.py (issue 15, item 5): its CPU dry run produces every part's rows and the JSON file; on a
machine without CUDA the real run stops with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_with_a_message(tmp_path):
    proc = run("--out", "x.json", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "no CUDA device here" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_dry_run_writes_every_part(tmp_path):
    proc = run("--dry-run", "--studies", "ire_fig2,tsam_glue_stsb", "--out", "check.json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "check.json").read_text())
    rows = out["rows"]
    assert out["settings"]["dry_run"] is True and set(out["settings"]["parts_s"]) == {"a", "b", "c", "d"}
    by_part = {p: [r for r in rows if r["part"] == p] for p in "abcd"}
    assert any("SAM / SGD step ratio" in r["item"] and isinstance(r["value"], float) for r in by_part["a"])
    assert any("peak extra copies" in r["item"] for r in by_part["a"])
    ratios = [r for r in by_part["b"] if r["item"].endswith("trainer / plain")]
    assert [r["item"].split()[1] for r in ratios] == ["fp32:", "bf16:"] and all(r["value"] > 0 for r in ratios)
    assert {r["item"]: r["result"] for r in by_part["c"]}["mask select: same threshold as kthvalue"] == "ok"
    smoke = {r["item"].split(":")[0]: r for r in by_part["d"]}
    assert set(smoke) == {"ire_fig2_wrn16_cifar10", "tsam_glue_stsb"}
    assert all(r["result"] == "ok" for r in smoke.values())
    assert "all checks passed" in proc.stdout
