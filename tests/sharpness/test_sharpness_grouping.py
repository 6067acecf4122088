"""Parameter grouping: CLIP/ViT/module groupings, custom rules, and error messages."""

from __future__ import annotations

import pytest
from torch import nn

from flatlab.errors import ConfigError, UnknownNameError
from flatlab.sharpness import Grouping, GroupRule, get_grouping, group_parameters, keys_of, select_group

CLIP_GROUPS = {
    "visual.class_embedding",
    "visual.positional_embedding",
    "visual.proj",
    "visual.conv1",
    "visual.ln_pre",
    "visual.transformer.resblocks.0",
    "visual.transformer.resblocks.1",
    "visual.ln_post",
    "positional_embedding",
    "text_projection",
    "logit_scale",
    "token_embedding",
    "transformer.resblocks.0",
    "ln_final",
    "head",
}


def test_clip_grouping_blocks_embeddings_norms_projections_head(kit):
    model = kit.TinyCLIPClassifier()
    groups = group_parameters(model, "clip")
    assert set(groups) == CLIP_GROUPS
    block = groups["visual.transformer.resblocks.1"]
    prefix = "visual.transformer.resblocks.1."
    assert set(block) == {
        prefix + s
        for s in (
            "ln_1.weight",
            "ln_1.bias",
            "attn.in_proj_weight",
            "attn.in_proj_bias",
            "attn.out_proj.weight",
            "attn.out_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.0.weight",
            "mlp.0.bias",
            "mlp.2.weight",
            "mlp.2.bias",
        )
    }
    assert groups["head"] == ("head.weight", "head.bias")
    assert groups["logit_scale"] == ("logit_scale",)
    assert groups["visual.proj"] == ("visual.proj",)
    # every parameter in exactly one group
    flat = [n for names in groups.values() for n in names]
    assert sorted(flat) == sorted(n for n, _ in model.named_parameters())


def test_clip_grouping_keeps_a_wrapper_prefix(kit):
    wrapper = nn.Module()
    wrapper.model = kit.TinyCLIPClassifier()
    groups = group_parameters(wrapper, "clip")
    assert {
        "model.visual.transformer.resblocks.0",
        "model.transformer.resblocks.0",
        "model.ln_final",
        "model.visual.ln_pre",
        "model.head",
    } <= set(groups)
    assert len(groups) == len(CLIP_GROUPS)


def test_module_grouping_keeps_weights_and_biases_together(kit):
    groups = group_parameters(kit.make_mlp(), "modules")
    assert groups == {"0": ("0.weight", "0.bias"), "2": ("2.weight", "2.bias")}
    attn = group_parameters(nn.Sequential(nn.MultiheadAttention(4, 2)))
    assert attn == {"0": ("0.in_proj_weight", "0.in_proj_bias"), "0.out_proj": ("0.out_proj.weight", "0.out_proj.bias")}


def test_vit_grouping_timm_names():
    names = [
        "cls_token",
        "pos_embed",
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "blocks.0.attn.qkv.weight",
        "blocks.0.norm1.weight",
        "blocks.11.mlp.fc1.bias",
        "norm.weight",
        "norm.bias",
        "head.weight",
        "head.bias",
    ]
    groups = group_parameters(names, "vit")
    assert groups == {
        "cls_token": ("cls_token",),
        "pos_embed": ("pos_embed",),
        "patch_embed": ("patch_embed.proj.weight", "patch_embed.proj.bias"),
        "blocks.0": ("blocks.0.attn.qkv.weight", "blocks.0.norm1.weight"),
        "blocks.11": ("blocks.11.mlp.fc1.bias",),
        "norm": ("norm.weight", "norm.bias"),
        "head": ("head.weight", "head.bias"),
    }


def test_custom_rules_prefix_regex_templates_and_unmatched_policies():
    names = ["enc.conv1.weight", "enc.conv10.weight", "enc.layers.3.w", "enc.layers.12.b", "fc.weight"]
    grouping = Grouping.from_pairs([("first", "enc.conv1"), ("layer{0}", r"re:enc\.layers\.(\d+)")])
    assert grouping.assign(names) == {
        "first": ("enc.conv1.weight",),
        "enc.conv10": ("enc.conv10.weight",),  # dotted prefix: conv10 != conv1
        "layer3": ("enc.layers.3.w",),
        "layer12": ("enc.layers.12.b",),
        "fc": ("fc.weight",),
    }
    other = Grouping.from_pairs([("first", "enc.conv1")], unmatched="other").assign(names)
    assert other == {"first": ("enc.conv1.weight",), "other": tuple(names[1:])}
    assert Grouping.from_pairs([("first", "enc.conv1")], unmatched="ignore").assign(names) == {
        "first": ("enc.conv1.weight",)
    }
    with pytest.raises(ConfigError, match=r"4 parameter\(s\) match no rule: enc.conv10.weight"):
        Grouping.from_pairs([("first", "enc.conv1")], unmatched="error").assign(names)


def test_grouping_errors_list_the_valid_values(kit):
    groups = group_parameters(kit.make_mlp())
    with pytest.raises(UnknownNameError, match=r"unknown group 'head'; valid groups: 0, 2"):
        select_group(groups, "head")
    with pytest.raises(ConfigError, match=r"non-empty string; got ''; valid groups: 0, 2"):
        select_group(groups, "")
    with pytest.raises(UnknownNameError, match=r"unknown grouping 'resnet'; valid groupings: clip, modules, vit"):
        get_grouping("resnet")
    with pytest.raises(ConfigError, match=r"not a valid regular expression"):
        GroupRule(r"blocks\.(", regex=True)
    with pytest.raises(ConfigError, match=r"unmatched='drop' is not allowed"):
        Grouping((), unmatched="drop")
    with pytest.raises(ConfigError, match=r"\(group name, pattern\) pair"):
        Grouping.from_pairs(["blocks"])
    assert keys_of(groups, ["2", "0"]) == ("2.weight", "2.bias", "0.weight", "0.bias")
    assert select_group(groups, "2") == ("2.weight", "2.bias")
