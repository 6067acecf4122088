"""The README's "optimizers outside a study" snippet runs as written and does what it says."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_optimizer_snippet_trains_with_sgd_ire():
    code = _snippet("### The optimizers outside a study")
    torch.manual_seed(0)
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README snippet", "exec"), namespace)
    opt = namespace["opt"]
    assert type(opt).__name__ == "IRE" and opt.kappa == 2.0 and opt.mask_interval == 10
    assert float(namespace["loss"]) < 0.3  # digits, 200 steps of SGD-IRE from a cross-entropy of ~2.3
    assert opt.active and opt._flat_fraction == pytest.approx(0.8, abs=1e-3)  # ⌊0.8·p⌋ flat (+ ties)
    assert "opt/flat_fraction" in out.getvalue()
