"""The Trainer under data parallelism (2 ranks, gloo, 127.0.0.1): one epoch on digits equals one
single-process epoch (1079 rows in batches of 64: the last batch of 55 rows splits unevenly, 28 + 27),
and so do its metrics; a diverging trial stops on every rank at the same step; a batch size that leaves
a worker without rows, and SyncBatchNorm on CPU workers, are refused. (SyncBatchNorm itself needs GPUs:
not tested here.)"""

from __future__ import annotations

import os
import socket

import pytest
import torch

pytestmark = pytest.mark.slow

WORLD = 2
OPTIMIZERS = {
    "sgd_ire": {"lr": 0.05, "kappa": 2.0, "gamma": 0.8, "mask_interval": 3},
    "sam": {"lr": 0.05, "rho": 0.05},
    "sgd": {"lr": 1e7, "momentum": 0.9},  # diverges
}


def _spec(optimizer: str, batch_size: int = 64, cnn: bool = False):
    from flatlab.train.trainer import TrialSpec

    return TrialSpec(
        workload="digits",
        optimizer=optimizer,
        epochs=2,
        seed=3,
        workload_params={"width": 8, "model": "cnn"} if cnn else {"width": 16},
        optimizer_params=OPTIMIZERS[optimizer],
        trainer_params={"batch_size": batch_size, "sync_batchnorm": cnn},
    )


def _epoch(optimizer: str, parallel=None, cnn: bool = False):
    from flatlab.train.trainer import Trainer
    from flatlab.workloads.registry import build_workload

    data = build_workload("digits", width=16).load_data(0)
    trainer = Trainer(_spec(optimizer, cnn=cnn), data, parallel=parallel)
    metrics = trainer.run_epoch()
    # parameters and buffers (BatchNorm running statistics)
    params = torch.cat([t.detach().double().reshape(-1) for t in trainer.model.state_dict().values()])
    kinds = sorted({type(m).__name__ for m in trainer.model.modules() if "BatchNorm" in type(m).__name__})
    return params, {k: metrics[k] for k in ("train/loss", "train/accuracy", "val/loss", "val/accuracy")}, kinds


def _diverged_step(parallel=None):
    from flatlab.train.trainer import Diverged, Trainer
    from flatlab.workloads.registry import build_workload

    trainer = Trainer(_spec("sgd"), build_workload("digits", width=16).load_data(0), parallel=parallel)
    try:
        trainer.run_epoch()
    except Diverged as exc:
        return exc.step
    return None


def _rank_main(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from flatlab.errors import ConfigError
    from flatlab.train.parallel import DataParallel
    from flatlab.train.trainer import Trainer
    from flatlab.workloads.registry import build_workload

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        parallel = DataParallel(rank, WORLD)
        results = {name: _epoch(name, parallel) for name in ("sgd_ire", "sam")}
        try:
            _epoch("sam", parallel, cnn=True)
            results["sync_bn_error"] = ""
        except ConfigError as exc:
            results["sync_bn_error"] = str(exc)
        results["diverged"] = _diverged_step(parallel)
        try:  # 1079 = 7 x 154 + 1: the last batch has one row for two workers
            Trainer(_spec("sam", batch_size=7), build_workload("digits", width=16).load_data(0), parallel=parallel)
            results["error"] = ""
        except ConfigError as exc:
            results["error"] = str(exc)
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ddp_trainer"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank_main, args=(port, out), nprocs=WORLD, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD)]


@pytest.mark.parametrize("optimizer", ["sam", "sgd_ire"])
def test_two_rank_epoch_equals_one_process_epoch(ranks, optimizer):
    torch.set_num_threads(1)
    params, metrics, _ = _epoch(optimizer)
    for r in range(WORLD):
        got_params, got_metrics, _ = ranks[r][optimizer]
        torch.testing.assert_close(got_params, params, rtol=0, atol=1e-5)
        assert got_metrics["train/accuracy"] == metrics["train/accuracy"]  # counts over both ranks' rows
        for k in ("train/loss", "val/loss", "val/accuracy"):
            assert got_metrics[k] == pytest.approx(metrics[k], abs=1e-5), k


def test_sync_batchnorm_on_cpu_workers_is_refused_with_the_reason(ranks):
    # torch's SyncBatchNorm runs on GPUs only; the option is checked before anything trains
    for r in range(WORLD):
        assert "sync_batchnorm=True needs CUDA devices" in ranks[r]["sync_bn_error"]
        assert "workers train on 'cpu'" in ranks[r]["sync_bn_error"]


def test_every_rank_stops_at_the_step_one_process_diverges(ranks):
    torch.set_num_threads(1)
    step = _diverged_step()
    assert step is not None and step < 5
    assert [ranks[r]["diverged"] for r in range(WORLD)] == [step] * WORLD


def test_a_worker_without_rows_is_refused(ranks):
    for r in range(WORLD):
        assert "batch_size=7 leaves a last mini-batch of 1 rows" in ranks[r]["error"]
        assert "fewer than the 2 workers" in ranks[r]["error"]
