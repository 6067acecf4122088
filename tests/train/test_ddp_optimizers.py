"""Every optimizer under data parallelism (DDP, gloo, 2 ranks on 127.0.0.1) against one process.

One spawn of 2 processes runs every case: 5 steps of ``opt`` on 2 x (B/2) rows (each rank its slice of
each global batch of B = 8, through :class:`BatchClosure` over a DDP model) and writes each rank's final
parameters; the reference runs the same 5 steps on the B rows in this process.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.slow

B = 8
STEPS = 5
WORLD = 2

# name -> (registered optimizer, hyperparameters)
CASES = {
    "sgd": ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    "adamw": ("adamw", {"lr": 1e-2, "weight_decay": 0.01}),
    "sam": ("sam", {"lr": 0.1, "rho": 0.1}),
    "sam_local": ("sam", {"lr": 0.1, "rho": 0.1, "ascent": "local"}),
    "asam": ("asam", {"lr": 0.1, "rho": 0.5}),
    "sgd_ire": ("sgd_ire", {"lr": 0.1, "kappa": 2.0, "gamma": 0.7, "mask_interval": 2}),
    "adamw_ire": ("adamw_ire", {"lr": 1e-2, "kappa": 2.0, "gamma": 0.7, "mask_interval": 2}),
    "tsam": ("tsam", {"lr": 0.1, "rho": 0.1, "s": 3, "t": 5.0, "noise_radius": 0.05}),
    # micro-batches of 2 rows on each rank (the trainer's micro_batch_size): the same steps
    "sam_ire_micro": ("sam_ire", {"lr": 0.1, "rho": 0.1, "kappa": 2.0, "gamma": 0.7, "mask_interval": 2}),
}
MICRO = {"sam_ire_micro": 2}
EQUAL_TO_ONE_PROCESS = ("sgd", "adamw", "sam", "asam", "sgd_ire", "adamw_ire", "tsam", "sam_ire_micro")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))


def _batches():
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(B, 6, generator=g), torch.randint(0, 4, (B,), generator=g)) for _ in range(STEPS)]


def _train(name: str, parallel=None) -> torch.Tensor:
    """5 steps of case ``name``; with ``parallel`` on this rank's slice of each batch through DDP."""
    # the single-process reference runs whole batches (chunking changes only the float rounding)
    return _train_with(*CASES[name], parallel=parallel, micro=MICRO.get(name) if parallel is not None else None)


def _train_with(opt_name: str, hp: dict, parallel=None, micro=None) -> torch.Tensor:
    from flatlab.optim.registry import get_optimizer
    from flatlab.train.closure import BatchClosure

    model = _model()
    net = model if parallel is None else parallel.wrap(model, torch.device("cpu"))
    opt = get_optimizer(opt_name).create(model.named_parameters(), **hp)
    torch.manual_seed(1)  # IRE's labels and TSAM's noise: the same stream on every rank and here
    for x, y in _batches():
        shard = None
        if parallel is not None:
            shard = parallel.shard_of(B)
            rows = parallel.shard(B)
            x, y = x[rows], y[rows]
        closure = BatchClosure(
            net, nn.functional.cross_entropy, x, y, micro_batch=micro, parallel=parallel, shard=shard
        )
        opt.step(closure)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank_main(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from flatlab.train.parallel import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        parallel = DataParallel(rank, WORLD)
        results = {name: _train(name, parallel) for name in CASES}
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ddp"))
    torch.multiprocessing.spawn(_rank_main, args=(_free_port(), out), nprocs=WORLD, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(WORLD)]


@pytest.mark.parametrize("name", EQUAL_TO_ONE_PROCESS)
def test_ddp_steps_equal_one_process_steps_on_the_global_batch(ranks, name):
    torch.set_num_threads(1)
    single = _train(name)
    start = torch.cat([p.detach().reshape(-1) for p in _model().parameters()])
    assert (single - start).abs().max() > 1e-3  # the steps moved the parameters
    for r in range(WORLD):
        torch.testing.assert_close(ranks[r][name], single, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["tsam", "sam_local"])
def test_every_rank_holds_bitwise_the_same_parameters(ranks, name):
    assert torch.equal(ranks[0][name], ranks[1][name])


def test_local_ascent_differs_from_global_ascent(ranks):
    # m-sharpness with m = B/2: each rank's ε comes from its own half, so the step is not global SAM's
    diff = (ranks[0]["sam_local"] - ranks[0]["sam"]).abs().max()
    assert diff > 1e-5


def test_ire_masks_are_not_trivial():
    # the IRE cases above change the step: SGD-IRE after 5 steps is not SGD
    torch.set_num_threads(1)
    plain = _train_with("sgd", {"lr": 0.1, "momentum": 0.9})
    ire = _train_with("sgd_ire", {"lr": 0.1, "momentum": 0.9, "kappa": 2.0, "gamma": 0.7, "mask_interval": 2})
    assert (plain - ire).abs().max() > 1e-4
