"""Shared fixtures for the interpolation tests: two small models (with an integer buffer) as state dicts."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def make_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    net[1].running_mean.normal_()
    net[1].num_batches_tracked.fill_(seed + 1)  # integer buffer: copied from the nearer end
    return net


@pytest.fixture
def pair():
    """(zero-shot state dict, fine-tuned state dict, model builder)."""
    return make_net(0).state_dict(), make_net(1).state_dict(), lambda: make_net(0)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
