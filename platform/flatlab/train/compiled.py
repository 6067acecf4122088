"""``torch.compile`` of a trial's model (the trainer parameter ``compile``), compatible with every optimizer."""

from __future__ import annotations

from torch import nn
from torch._functorch import config as functorch_config

from flatlab.lazy import lazy

inductor_config = lazy("torch._inductor.config")  # the compiler stack (seconds)


def compile_model(model: nn.Module) -> nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``) and return it.

    In place, so ``state_dict`` keys, evaluation and the closure's BatchNorm switches
    (:func:`flatlab.optim.protocol.frozen_bn_stats`, which flips ``track_running_stats``: the compiled
    forward is guarded on it and compiles a second graph for the extra passes) all see the same module.
    Compilation happens at the first forward (tens of seconds), once per graph variant.

    IRE's curvature pass backpropagates twice through one forward graph (the sampled-label gradient
    with ``retain_graph=True``, then the true loss), which a compiled backward that donates its saved
    buffers refuses; donation is therefore switched off, process-wide (a little more activation memory
    in compiled backward graphs). The compile caches on disk are switched off too (AOTAutograd's and
    inductor's FX graph cache): on the CPU (torch 2.14) a backward read from a cache that was compiled
    with donation gives silently wrong IRE gradients, where a fresh compile gives the eager result.
    Each process therefore compiles afresh (tens of seconds per graph). Needs a C compiler on the
    machine (inductor).
    """
    functorch_config.donated_buffer = False
    functorch_config.enable_autograd_cache = False
    inductor_config.fx_graph_cache = False
    model.compile()
    return model
