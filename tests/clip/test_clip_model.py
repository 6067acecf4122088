"""The open_clip side: tiny config, zero-shot head, the classifier module, checkpoints open_clip reloads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flatlab.errors import ConfigError
from flatlab.workloads.clip_model import (
    TINY_MODEL,
    ClipClassifier,
    ClipSpec,
    build_zero_shot_classifier,
    export_open_clip_checkpoint,
    load_clip,
    load_state_file,
    zero_shot_head,
)

NAMES = ["cat", "dog", "frog"]


def test_zero_shot_head_shape_unit_columns_and_definition():
    import open_clip

    spec = ClipSpec(TINY_MODEL)
    clip, _ = load_clip(spec)
    head = zero_shot_head(clip, spec, NAMES, "simple")
    assert head.shape == (32, 3)  # (embed_dim, n_classes)
    torch.testing.assert_close(head.norm(dim=0), torch.ones(3))
    # per class: mean over templates of the normalised text embeddings, renormalised (WiSE-FT / open_clip's
    # zero-shot classifier)
    tok = open_clip.get_tokenizer(TINY_MODEL)
    with torch.no_grad():
        col = F.normalize(clip.encode_text(tok([t("dog") for t in open_clip.SIMPLE_IMAGENET_TEMPLATES])), dim=-1).mean(
            0
        )
    torch.testing.assert_close(head[:, 1], col / col.norm(), atol=1e-5, rtol=1e-5)


def test_random_weights_follow_init_seed_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = load_clip(ClipSpec(TINY_MODEL, init_seed=0))[0].state_dict()
    after = torch.rand(3)
    b = load_clip(ClipSpec(TINY_MODEL, init_seed=0))[0].state_dict()
    c = load_clip(ClipSpec(TINY_MODEL, init_seed=1))[0].state_dict()
    assert torch.equal(expected, after)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["visual.conv1.weight"], c["visual.conv1.weight"])


def test_classifier_logits_keys_and_clip_grouping():
    from flatlab.sharpness import group_parameters

    model = build_zero_shot_classifier(ClipSpec(TINY_MODEL), NAMES, "simple")
    x = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        logits = model(x)
        feats = F.normalize(model.visual((x.float() / 255 - model.pixel_mean) / model.pixel_std), dim=-1)
    assert logits.shape == (5, 3)
    torch.testing.assert_close(logits, model.logit_scale.exp() * feats @ model.head)
    torch.testing.assert_close(model(x.float() / 255), logits)  # floats in [0, 1] are the same images
    keys = list(model.state_dict())
    assert {"head", "logit_scale", "visual.conv1.weight", "visual.transformer.resblocks.1.attn.in_proj_weight"} <= set(
        keys
    )
    assert not any(k.startswith(("transformer.", "token_embedding")) for k in keys)  # no text tower
    assert "logit_scale" not in dict(model.named_parameters())  # a buffer: never trained nor perturbed
    groups = group_parameters(model, "clip")
    assert groups["visual.transformer.resblocks.0"] == tuple(
        n for n, _ in model.named_parameters() if n.startswith("visual.transformer.resblocks.0.")
    )
    assert "head" in groups and "visual.proj" in groups


def test_quick_gelu_is_a_switch():
    from open_clip.transformer import QuickGELU

    plain = load_clip(ClipSpec(TINY_MODEL))[0]
    quick = load_clip(ClipSpec(TINY_MODEL, quick_gelu=True))[0]
    assert not isinstance(plain.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)
    assert isinstance(quick.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_checkpoint_loads_back_through_open_clip_with_identical_outputs(finetuned, tmp_path, suffix):
    import open_clip

    model = finetuned["trainer"].model.eval()
    state = load_state_file(finetuned["path"])  # what a trial uploads as model/model.safetensors
    spec = ClipSpec(TINY_MODEL)
    path = export_open_clip_checkpoint(state, spec, tmp_path / f"clip{suffix}")
    reloaded, _, _ = open_clip.create_model_and_transforms(TINY_MODEL, pretrained=str(path))
    reloaded.eval()
    x = finetuned["data"].val.inputs
    with torch.no_grad():
        ours = model.features(x)
        theirs = F.normalize(reloaded.encode_image(model.normalise_pixels(x)), dim=-1)
        assert torch.equal(ours, theirs)
        again = ClipClassifier.from_clip(reloaded, state["head"])
        assert torch.equal(again(x), model(x))
    assert torch.equal(reloaded.logit_scale.detach().reshape(()), state["logit_scale"])
    zero_shot = load_clip(spec)[0].state_dict()  # the text tower is the zero-shot one
    assert torch.equal(reloaded.state_dict()["token_embedding.weight"], zero_shot["token_embedding.weight"])
    assert not torch.equal(reloaded.state_dict()["visual.conv1.weight"], zero_shot["visual.conv1.weight"])  # trained


def test_pretrained_file_path_is_used_as_weights(finetuned, tmp_path):
    path = export_open_clip_checkpoint(
        load_state_file(finetuned["path"]), ClipSpec(TINY_MODEL), tmp_path / "w.safetensors"
    )
    loaded = load_clip(ClipSpec(TINY_MODEL, pretrained=str(path)))[0]
    assert torch.equal(loaded.visual.conv1.weight, finetuned["trainer"].model.visual.conv1.weight)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match=r"model_name='no-such-net' is not an open_clip architecture"):
        load_clip(ClipSpec("no-such-net"))
    with pytest.raises(ConfigError, match=r"cannot load open_clip model .*pretrained='/nope.pt'.*HF_HUB_OFFLINE=1"):
        load_clip(ClipSpec(TINY_MODEL, pretrained="/nope.pt"))
    with pytest.raises(ConfigError, match=r"classifier state lacks image-tower key 'visual\."):
        export_open_clip_checkpoint({"head": torch.zeros(32, 3)}, ClipSpec(TINY_MODEL), tmp_path / "x.safetensors")
    cfg = tmp_path / "other-name.json"
    cfg.write_text("{}")
    with pytest.raises(ConfigError, match=r"registers the name 'other-name'.*model_name='mine'"):
        load_clip(ClipSpec("mine", model_config=str(cfg)))
    with pytest.raises(ConfigError, match=r"checkpoint '.*missing.safetensors' does not exist"):
        load_state_file(tmp_path / "missing.safetensors")


def test_custom_json_config_is_registered(tmp_path):
    import json

    from flatlab.workloads.clip_model import TINY_CONFIG

    cfg = dict(TINY_CONFIG, embed_dim=16)
    path = tmp_path / "my-tiny.json"
    path.write_text(json.dumps(cfg))
    model = build_zero_shot_classifier(ClipSpec("my-tiny", model_config=str(path)), NAMES, "simple")
    assert model.head.shape == (16, 3)
