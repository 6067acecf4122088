"""A study's own workload, optimizer and flatness measure (studies/examples/extensions.py and the module
next to it): loading the file twice is no clash, a real clash names both definitions, the entries reach
a process that never imported the study file, and the example optimizer and measure compute what their
sources say."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.extensions import USER_MODULES, capture
from flatlab.optim.registry import OPTIMIZERS, get_optimizer, register_optimizer
from flatlab.registry import Registry
from flatlab.sharpness.measures import MEASURES, get_measure, register_measure
from flatlab.study.loader import load_module, load_studies
from flatlab.workloads.base import Workload
from flatlab.workloads.registry import WORKLOADS, get_workload

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "studies" / "examples" / "extensions.py"


@pytest.fixture
def registries():
    """The registries (built-ins loaded) and modules as they were before the test: its own registrations
    and the study files' modules do not leak into other tests."""
    saved = [(r, r.names() and dict(r._entries)) for r in (WORKLOADS, OPTIMIZERS, MEASURES)]
    user = set(USER_MODULES)
    yield
    for r, entries in saved:
        r._entries.clear()
        r._entries.update(entries)
    for name in USER_MODULES - user:  # the study files and the modules they imported from their folders
        sys.modules.pop(name, None)
    USER_MODULES.intersection_update(user)


def test_a_study_file_loaded_twice_keeps_its_registrations(registries):
    first = load_studies(str(EXAMPLE))
    lion, moons = get_optimizer("lion"), get_workload("two_moons")
    second = load_studies(str(EXAMPLE))  # the CLI loads a file more than once (--resume, budgets ...)
    assert [s.name for s in first] == [s.name for s in second] == ["extensions_demo"]
    assert get_optimizer("lion") is not lion and get_optimizer("lion").build.__qualname__ == "build_lion"
    assert get_workload("two_moons") is moons  # the module next to it is imported once, as any module
    assert get_measure("param_norm").metrics == ("flat/param_norm",)
    assert set(capture()) == {"workload", "optimizer", "measure"}
    assert set(capture()["optimizer"]) == {"lion"} and set(capture()["workload"]) == {"two_moons"}


def test_two_different_definitions_under_one_name_are_an_error_naming_both(registries, tmp_path):
    for i in (1, 2):
        (tmp_path / f"w{i}.py").write_text(f"""
from flatlab.workloads.base import Workload
from flatlab.workloads.registry import register_workload

@register_workload
class Clash{i}(Workload):
    name = "clash"
    def load_data(self, seed): ...
    def build_model(self): ...
STUDY = None
""")
    load_module(str(tmp_path / "w1.py"))
    with pytest.raises(
        ConfigError,
        match=r"w2\.py, line 5: ValueError: workload 'clash' is already registered by "
        r"flatlab_study_w1\.Clash1 \(.*w1\.py\); "
        r"flatlab_study_w2\.Clash2 \(.*w2\.py\) cannot take the same name: rename one",
    ):
        load_module(str(tmp_path / "w2.py"))
    registry = Registry("thing")
    registry.register("x", Clash := type("Clash", (), {}))
    registry.register("x", Clash)  # the very same object: fine
    with pytest.raises(ValueError, match="thing 'x' is already registered by"):
        registry.register("x", type("Other", (), {}))


def test_the_decorators_register_and_return_the_function(registries):
    def build(params, *, lr, weight_decay):
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)

    from flatlab.optim.registry import common

    assert register_optimizer(name="plain_sgd", hparams=common(), doc="SGD")(build) is build
    model = torch.nn.Linear(2, 1)
    opt = get_optimizer("plain_sgd").create(model.parameters(), lr=0.5)
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["lr"] == 0.5
    with pytest.raises(ValueError, match=r"needs the optimizer's name"):
        register_optimizer(hparams=common())

    def zero(model, subset, loss_fn, params, seed):
        return {"flat/zero": 0.0}

    assert register_measure(name="zero", doc="0", source="none", metrics=("flat/zero",))(zero) is zero
    assert get_measure("zero").compute is zero and get_measure("zero").metrics == ("flat/zero",)
    assert set(OPTIMIZERS.extensions()) == {"plain_sgd"} and set(MEASURES.extensions()) == {"zero"}
    assert "sgd" in OPTIMIZERS.names()  # flatlab's own are no extensions


def test_lion_two_steps_by_hand(registries):
    load_studies(str(EXAMPLE))
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = get_optimizer("lion").create([p], lr=0.1, weight_decay=0.01, beta1=0.9, beta2=0.99)
    g1, g2 = torch.tensor([0.3, -0.2, 0.0]), torch.tensor([-1.0, -0.1, 0.4])
    p.grad = g1.clone()
    opt.step()
    # c = 0.1 * g1 -> sign (1, -1, 0); theta -= 0.1 * (sign(c) + 0.01 * theta); m = 0.01 * g1
    t1 = torch.tensor([1.0 - 0.1 * (1 + 0.01), -2.0 - 0.1 * (-1 - 0.02), 0.5 - 0.1 * 0.005])
    assert torch.allclose(p.detach(), t1)
    p.grad = g2.clone()
    opt.step()
    c = 0.9 * 0.01 * g1 + 0.1 * g2  # (-0.0973, -0.0118, 0.04): signs (-1, -1, 1)
    t2 = t1 - 0.1 * (torch.sign(c) + 0.01 * t1)
    assert torch.allclose(p.detach(), t2) and torch.equal(torch.sign(c), torch.tensor([-1.0, -1.0, 1.0]))
    assert torch.allclose(opt.state[p]["exp_avg"], 0.99 * 0.01 * g1 + 0.01 * g2)


def test_param_norm_by_hand(registries):
    load_studies(str(EXAMPLE))
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 0.0]]))
        model.bias.fill_(4.0)
    out = get_measure("param_norm").compute(model, None, None, {}, 0)
    assert out == {"flat/param_norm": 5.0}


WORKER = """
import sys
from ray import cloudpickle
from flatlab.extensions import install
from flatlab.optim.registry import get_optimizer
from flatlab.sharpness.measures import get_measure
from flatlab.workloads.registry import get_workload
assert not any(m.startswith(("flatlab_study_", "two_moons")) for m in sys.modules)
install(cloudpickle.loads(sys.stdin.buffer.read()))
w = get_workload("two_moons")(n=60, width=4)
data = w.load_data(0)
model = w.build_model()
opt = get_optimizer("lion").create(model.parameters(), lr=1e-3)
print(type(opt).__name__, len(data.train), tuple(model(data.train.inputs).shape), get_measure("param_norm").metrics)
"""


def test_the_entries_reach_a_process_that_never_imported_the_study_file(registries, tmp_path):
    load_studies(str(EXAMPLE))
    from ray import cloudpickle

    payload = cloudpickle.dumps(capture())  # what the driver binds to the trainable
    res = subprocess.run([sys.executable, "-c", WORKER], input=payload, capture_output=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert res.stdout.decode().split() == ["Lion", "36", "(36,", "2)", "('flat/param_norm',)"]


def test_the_examples_workload_is_a_workload(registries):
    load_studies(str(EXAMPLE))
    cls = get_workload("two_moons")
    assert issubclass(cls, Workload) and cls.data_hparams == ("n", "noise")
    a, b = cls(n=100).load_data(3), cls(n=100).load_data(3)
    assert torch.equal(a.train.inputs, b.train.inputs) and (len(a.train), len(a.val), len(a.test)) == (60, 20, 20)
    assert set(a.train.targets.tolist()) == {0, 1}


def test_every_code_block_of_the_extensions_guide_is_in_the_tested_example():
    import re

    guide = (REPO / "docs" / "extensions.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    example = EXAMPLE.read_text() + (EXAMPLE.parent / "two_moons.py").read_text()
    assert len(blocks) == 5  # the imports, the workload, its import, the optimizer, the measure
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Your own workload") : readme.index("## Everyday commands")]
    blocks += re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 6  # and the README's measure
    for block in blocks:
        assert block in example, block


def test_listings_show_a_study_file_s_own_entries_with_study_file(registries, tmp_path):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["workloads", "two_moons"])  # not registered without the file: says how
    assert res.exit_code == 2 and "unknown workload 'two_moons'" in res.output
    assert "--study-file FILE" in " ".join(res.output.split())
    for command, name, shown in (
        ("workloads", "two_moons", "noise"),
        ("optimizers", "lion", "beta2"),
        ("measures", "param_norm", "flat/param_norm"),
    ):
        res = runner.invoke(app, [command, name, "--study-file", str(EXAMPLE)])
        assert res.exit_code == 0 and res.output.startswith(name) and shown in res.output, res.output
    res = runner.invoke(app, ["measures", "--study-file", str(EXAMPLE)])  # the whole listing, built-ins too
    assert "param_norm" in res.output and "hessian_trace" in res.output
    res = runner.invoke(app, ["measures", "--study-file", str(tmp_path / "nope.py")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_dry_run_says_the_measure_subset_is_capped_by_the_split(registries, tmp_path, monkeypatch):
    # two_moons trains on 240 rows (n = 400 by the study, 60 %): the plan (it loads no data) says 512 at most
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", str(EXAMPLE), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "param_norm on 512 train examples (all of them if the split is smaller; seed 0)" in " ".join(
        res.output.split()
    )


def test_a_workload_without_its_methods_is_refused_when_the_study_file_loads(registries, tmp_path, monkeypatch):
    # the class the extensions guide shows, without load_data / build_model: the dry run used to pass and
    # the run to crash on the first trial's instantiation; now the file's loading says what is missing
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    study = tmp_path / "s.py"
    study.write_text(
        "from flatlab.workloads import Workload, register_workload\n\n"
        "@register_workload\n"
        "class Half(Workload):\n"
        "    name = 'half_workload'\n"
        "    doc = 'no data, no model'\n"
    )
    monkeypatch.chdir(tmp_path)
    for args in (["run", str(study), "--dry-run"], ["run", str(study)]):
        res = CliRunner().invoke(app, args)
        text = " ".join(res.output.split())
        assert res.exit_code == 2, res.output
        assert "workload 'half_workload'" in text and "does not define build_model, load_data" in text
        assert not (tmp_path / "flatlab-runs").exists()  # nothing started, nothing written
    assert "half_workload" not in WORKLOADS.names()
    with pytest.raises(ValueError, match="not a subclass of flatlab.workloads.Workload"):
        from flatlab.workloads.registry import register_workload

        register_workload(type("NotAWorkload", (), {"name": "nope"}))
