"""``torch.compile`` of a trial's model (the trainer parameter ``compile``), compatible with every optimizer."""

from __future__ import annotations

from torch import nn


def compile_model(model: nn.Module) -> nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``) and return it.

    In place, so ``state_dict`` keys, evaluation and the closure's BatchNorm switches
    (:func:`flatlab.optim.protocol.frozen_bn_stats`, which flips ``track_running_stats``: the compiled
    forward is guarded on it and compiles a second graph for the extra passes) all see the same module.
    Compilation happens at the first forward (tens of seconds), once per graph variant.

    IRE's curvature pass backpropagates twice through one forward graph (the sampled-label gradient
    with ``retain_graph=True``, then the true loss), which a compiled backward that donates its saved
    buffers refuses; donation is therefore switched off, process-wide (a little more activation memory
    in compiled backward graphs). Needs a C compiler on the machine (inductor).
    """
    from torch._functorch import config as functorch_config

    functorch_config.donated_buffer = False
    model.compile()
    return model
