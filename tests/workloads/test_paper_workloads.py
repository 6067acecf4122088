"""Every paper workload in the registry (cifar*, dtd, fashion_mnist, glue/*, lm/*) trains one epoch offline with its
``smoke_params`` and reports every metric it declares (AlgoPerf-style smoke test over the registry)."""

import math

import pytest

from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import WORKLOADS, build_workload

PAPER_WORKLOADS = [
    n
    for n in WORKLOADS.names()
    if n.split("/")[0] in ("cifar10", "cifar100", "dtd", "fashion_mnist", "glue", "lm", "imagenet")
]


def test_the_paper_workloads_are_registered():
    names = set(WORKLOADS.names())
    assert {
        "cifar10",
        "cifar100",
        "dtd",
        "fashion_mnist",
        "glue/cola",
        "glue/stsb",
        "glue/mrpc",
        "glue/qqp",
        "lm/wikitext2",
        "lm/wikitext103",
        "lm/minipile",
        "lm/openwebtext",
    } <= names


@pytest.mark.parametrize("name", PAPER_WORKLOADS)
def test_workload_trains_one_epoch_on_synthetic_data(name):
    params = dict(WORKLOADS.get(name).smoke_params)
    wl = build_workload(name, **params)
    data = wl.load_data(0)
    assert len(data.train) > 0 and len(data.val) > 0
    optimizer = "sgd" if not name.startswith("lm/") else "adamw"
    spec = TrialSpec(
        workload=name,
        optimizer=optimizer,
        epochs=1,
        workload_params=params,
        optimizer_params={"lr": 1e-3},
        trainer_params={"batch_size": 16},
    )
    t = Trainer(spec, data)
    metrics = t.run_epoch()
    metrics.update(t.evaluate_test())
    expected = set(wl.metrics)
    assert expected <= set(metrics), sorted(expected - set(metrics))
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    again = Trainer(spec, data).run_epoch()  # deterministic in the seed
    assert again["train/loss"] == metrics["train/loss"]
