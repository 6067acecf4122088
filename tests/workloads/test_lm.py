"""LM workloads: token windows, packing and caching, perplexity, model sizes, the training-loss curve."""

import math
import pickle

import numpy as np
import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload, get_workload
from flatlab.workloads.lm import perplexity
from flatlab.workloads.token_stream import TokenWindows


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_token_windows_are_inputs_and_next_token_targets():
    tokens = np.arange(23, dtype=np.int32)
    x, y = TokenWindows(tokens, 5, 0), TokenWindows(tokens, 5, 1)
    assert x.shape == (4, 5) and len(y) == 4  # (23 - 1) // 5
    assert x[1].tolist() == [5, 6, 7, 8, 9] and y[1].tolist() == [6, 7, 8, 9, 10]
    assert torch.equal(x[torch.tensor([3, 0])], torch.tensor([[15, 16, 17, 18, 19], [0, 1, 2, 3, 4]]))
    assert x[1:3].dtype == torch.int64 and x[1:3].shape == (2, 5)
    with pytest.raises(IndexError, match="window index out of range for 4 windows"):
        x[4]
    sub = TokenWindows(tokens, 5, 1, start=10, stop=21)
    assert len(sub) == 2 and sub[0].tolist() == [11, 12, 13, 14, 15]


def test_file_backed_windows_pickle_as_their_path(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(100_000, dtype=np.uint16))
    w = TokenWindows.from_file(str(path), 64, 1, start=1000, stop=50_000)
    blob = pickle.dumps(w)
    assert len(blob) < 1000
    back = pickle.loads(blob)
    assert torch.equal(back[torch.tensor([0, 5])], w[torch.tensor([0, 5])])
    mem = pickle.loads(pickle.dumps(TokenWindows(np.arange(50, dtype=np.int32), 7)))
    assert mem[6].tolist() == list(range(42, 49))


def test_perplexity_is_exp_of_the_reported_loss():
    wl = build_workload(
        "lm/wikitext2", data_path="synthetic", synthetic_tokens=600, n_layers=1, width=16, n_heads=2, context=16
    )
    d = wl.load_data(0)
    torch.manual_seed(0)
    model = wl.build_model()
    m = wl.evaluate(model, d.val)
    assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-12)
    with torch.no_grad():
        logits = model.eval()(d.val.inputs[0 : len(d.val)])
    ref = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), d.val.targets[0 : len(d.val)].reshape(-1)
    )
    assert m["loss"] == pytest.approx(float(ref), rel=1e-5)
    assert perplexity(1e4) == math.inf


@pytest.mark.parametrize(
    "model, vocab, low, high, shape",
    [
        ("transformer_2l", 50257, 6.5e6, 9e6, dict(context=512)),  # "about 8M"
        ("llama_60m", 50257, 55e6, 80e6, dict(context=150)),
        ("llama_119m", 50257, 115e6, 125e6, dict(context=512)),
        ("llama_229m", 50257, 220e6, 235e6, dict(context=1024)),
    ],
)
def test_lm_presets_have_the_documented_size(model, vocab, low, high, shape):
    wl = build_workload("lm/wikitext103", model=model, vocab_size=vocab)
    assert wl.shape()["context"] == shape["context"]
    with torch.device("meta"):
        m = wl.build_model()
    assert low <= n_params(m) <= high


@pytest.mark.parametrize(
    "model, width, heads", [("transformer_2l", 16, 2), ("llama_60m", 30, 2), ("llama_119m", 16, 2)]
)
def test_lm_output_shape(model, width, heads):
    wl = build_workload("lm/minipile", model=model, n_layers=1, width=width, n_heads=heads, context=8, vocab_size=50)
    torch.manual_seed(0)
    out = wl.build_model()(torch.randint(0, 50, (3, 8)))
    assert out.shape == (3, 8, 50)


def test_local_corpus_is_tokenised_once_and_cached(text_corpus_dir, tiny_tokenizer_dir, tmp_path, monkeypatch):
    params = dict(
        data_path=text_corpus_dir,
        tokenizer=tiny_tokenizer_dir,
        cache_dir=str(tmp_path / "cache"),
        n_layers=1,
        width=16,
        n_heads=2,
        context=8,
    )
    d = build_workload("lm/wikitext2", **params).load_data(0)
    files = sorted((tmp_path / "cache" / "lm").glob("*.npy"))
    assert len(files) == 3  # train, validation, test
    assert isinstance(d.train.inputs, TokenWindows) and d.train.inputs.path is not None
    assert d.meta["tokens"]["train"] == len(np.load(d.train.inputs.path, mmap_mode="r"))
    import datasets

    def boom(*a, **k):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(datasets.Dataset, "map", boom)
    d2 = build_workload("lm/wikitext2", **params).load_data(0)
    assert torch.equal(d2.val.inputs[0:3], d.val.inputs[0:3])
    torch.manual_seed(0)
    model = build_workload("lm/wikitext2", **params).build_model()
    assert model.hf.config.vocab_size >= 30  # the tiny tokenizer's


def test_corpus_without_validation_holds_out_the_end_of_the_stream(text_corpus_dir, tiny_tokenizer_dir, tmp_path):
    import datasets

    train_only = tmp_path / "owt"
    datasets.DatasetDict({"train": datasets.load_from_disk(text_corpus_dir)["train"]}).save_to_disk(str(train_only))
    wl = build_workload(
        "lm/openwebtext",
        data_path=str(train_only),
        tokenizer=tiny_tokenizer_dir,
        cache_dir=str(tmp_path / "c"),
        n_layers=1,
        width=16,
        n_heads=2,
        context=8,
        val_fraction=0.1,
    )
    d = wl.load_data(0)
    total = d.meta["tokens"]["train"] + d.meta["tokens"]["val"]
    assert d.meta["tokens"]["val"] == int(total * 0.1) and d.test is None
    assert d.val.inputs.start == d.meta["tokens"]["train"]  # the end of the same memory-mapped file


def _lm_spec(**wp):
    params = dict(data_path="synthetic", synthetic_tokens=640, n_layers=1, width=16, n_heads=2, context=16, **wp)
    return TrialSpec(
        workload="lm/wikitext2",
        optimizer="adamw",
        epochs=2,
        workload_params=params,
        optimizer_params={"lr": 3e-3},
        trainer_params={"batch_size": 8, "clip_norm": 1.0},
    )


def test_lm_training_curve_comes_from_the_trainer():
    """Steps-to-target is generic now (the trainer's loss curve + Study.reference_arm), not an LM feature."""
    assert "train/steps_to_target" not in get_workload("lm/wikitext2").metrics
    spec = _lm_spec()
    data = build_workload("lm/wikitext2", **spec.workload_params).load_data(0)
    t = Trainer(spec, data)
    m = t.run_epoch()
    assert "train/steps_to_target" not in m and m["train/loss"] > 0 and "train/accuracy" in m
    pts = t.curve.points()
    assert [s for s, _ in pts] == list(range(1, t.step + 1)) and t.step == 5  # 39 windows of 16 tokens / batch 8
    assert all(math.isfinite(v) and v > 0 for _, v in pts)
    assert not any(k.startswith("progress") for k in t.model.state_dict())  # no tracker buffers in the model
    with pytest.raises(ConfigError, match="target_loss"):
        build_workload("lm/wikitext2", data_path="synthetic", target_loss=2.0)


def test_checkpoints_with_the_old_progress_buffer_still_load():
    wl = build_workload("lm/wikitext2", data_path="synthetic", n_layers=1, width=16, n_heads=2, context=16)
    model = wl.build_model()
    old = dict(model.state_dict())
    old["progress"] = torch.tensor([3.0, 2.5, 0.0], dtype=torch.float64)  # written by flatlab before the loss curve
    model.load_state_dict(old)  # strict: every other key must still match
    with pytest.raises(RuntimeError, match="Unexpected key"):
        model.load_state_dict({**old, "something_else": torch.zeros(1)})
