"""The base-wrapping mechanism (flatlab.optim.wrapper): shared param_groups, checkpoints, composition."""

from __future__ import annotations

import pytest
import torch
from _optim_testlib import closure_for, mlp, roundtrip, vector_batch

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.optim.basic import ADAMW_SPEC, SGD_SPEC
from flatlab.optim.ire import IRE
from flatlab.optim.sam import SAM
from flatlab.optim.tsam import TSAM
from flatlab.optim.wrapper import wrapped_spec


def test_param_groups_are_shared_and_schedulers_act_on_the_base():
    model, batch = mlp(), vector_batch()
    opt = IRE(SAM(torch.optim.SGD(model.parameters(), lr=0.4), rho=0.05))
    assert opt.param_groups is opt.base.param_groups is opt.base.base.param_groups
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # built on the OUTER wrapper
    opt.step(closure_for(model, batch))
    sched.step()
    assert opt.base.base.param_groups[0]["lr"] == pytest.approx(0.2)
    # checkpoint reload replaces torch's group dicts: the wrapper must re-share (composer#3259)
    opt.load_state_dict(roundtrip(opt.state_dict()))
    assert opt.param_groups is opt.base.base.param_groups
    opt.step(closure_for(model, batch))
    sched.step()
    assert opt.base.base.param_groups[0]["lr"] == pytest.approx(0.1)


def test_add_param_group_goes_to_the_base():
    model = mlp()
    first, rest = list(model.parameters())[:2], list(model.parameters())[2:]
    opt = TSAM(torch.optim.SGD(first, lr=0.1), s=1)
    opt.add_param_group({"params": rest, "lr": 0.01})
    assert len(opt.base.param_groups) == 2 and opt.base.param_groups[1]["lr"] == 0.01
    assert opt.base.param_groups[1]["momentum"] == 0  # the base filled in its defaults


def test_state_dict_nests_base_state_and_wrapper_entries():
    model, batch = mlp(), vector_batch()
    opt = IRE(SAM(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), rho=0.05), mask_interval=3)
    opt.step(closure_for(model, batch))
    sd = opt.state_dict()
    assert [w["type"] for w in sd["wrappers"]] == ["sam", "ire"]
    assert "momentum_buffer" in sd["state"][0]  # the base's momentum is in the checkpoint
    ire = sd["wrappers"][1]
    assert set(ire["state"][0]) == {"mask"}  # persistent state only: no θ scratch copy
    assert ire["extra"]["since_refresh"] == 1 and ire["extra"]["active"] is True
    assert sd["wrappers"][0]["state"] == {}  # SAM keeps only scratch


def test_loading_a_foreign_state_dict_is_refused():
    model = mlp()
    sam_sd = SAM(torch.optim.SGD(model.parameters(), lr=0.1)).state_dict()
    with pytest.raises(
        ValueError, match=r"expected the outermost wrapper entry to be 'ire', found wrapper entries \['sam'\]"
    ):
        IRE(torch.optim.SGD(model.parameters(), lr=0.1)).load_state_dict(sam_sd)


def test_deepcopy_keeps_options_and_sharing():
    import copy

    opt = TSAM(torch.optim.SGD(mlp().parameters(), lr=0.1), s=4, t=7.0)
    clone = copy.deepcopy(opt)
    assert (clone.s, clone.t) == (4, 7.0) and clone.param_groups is clone.base.param_groups


def test_wrapped_spec_composes_hparams():
    extra = (HParam("zeta", 1.0, float, low=0.0),)
    spec = wrapped_spec("adamw_x", ADAMW_SPEC, extra, lambda base, zeta: base, doc="test", base_defaults={"beta2": 0.9})
    assert [h.name for h in spec.hparams] == [h.name for h in ADAMW_SPEC.hparams] + ["zeta"]
    assert spec.resolve({})["beta2"] == 0.9 and spec.base == "adamw"
    opt = spec.create(mlp().parameters(), lr=0.01)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.9)
    with pytest.raises(ValueError, match=r"hyperparameter\(s\) \['lr'\] declared by both 'sgd' and the wrapper"):
        wrapped_spec("bad", SGD_SPEC, (HParam("lr", 0.1),), lambda b, lr: b, doc="")
    with pytest.raises(ValueError, match=r"base_defaults names \['beta2'\], not hyperparameters of 'sgd'"):
        wrapped_spec("bad", SGD_SPEC, (), lambda b: b, doc="", base_defaults={"beta2": 0.9})
    with pytest.raises(ConfigError, match=r"beta2=2.0 is not allowed"):
        wrapped_spec("bad", ADAMW_SPEC, (), lambda b: b, doc="", base_defaults={"beta2": 2.0})
