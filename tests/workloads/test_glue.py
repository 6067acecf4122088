"""GLUE workloads: metrics against scikit-learn / scipy, local data with an offline tokenizer, STS-B regression."""

import numpy as np
import pytest
import torch

from flatlab.workloads import build_workload, get_workload
from flatlab.workloads.glue import TASKS, f1_binary, matthews_corrcoef, pearson, spearman


def test_metrics_match_scikit_learn_and_scipy_on_fixed_inputs():
    from scipy import stats
    from sklearn import metrics

    t = np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1])
    p = np.array([0, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1])
    assert matthews_corrcoef(t, p) == pytest.approx(metrics.matthews_corrcoef(t, p), abs=1e-12)
    assert f1_binary(t, p) == pytest.approx(metrics.f1_score(t, p), abs=1e-12)
    t3, p3 = np.array([0, 1, 2, 2, 1, 0, 2, 1, 0, 2]), np.array([0, 2, 2, 2, 1, 0, 1, 1, 0, 0])
    assert matthews_corrcoef(t3, p3) == pytest.approx(metrics.matthews_corrcoef(t3, p3), abs=1e-12)
    assert matthews_corrcoef(t, np.zeros_like(t)) == metrics.matthews_corrcoef(t, np.zeros_like(t)) == 0.0
    assert f1_binary(np.zeros(4, int), np.zeros(4, int)) == 0.0
    x = np.array([0.1, 2.5, 2.5, 3.0, 4.2, 1.0, 1.0, 5.0])
    y = np.array([0.0, 2.0, 3.1, 2.9, 4.8, 1.0, 0.7, 4.1])
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)  # with ties


def test_every_glue_task_is_registered_with_its_metrics():
    for task, spec in TASKS.items():
        cls = get_workload(f"glue/{task}")
        assert cls.primary_metric in cls.metrics and "val/loss" in cls.metrics
        for m in spec.metrics:
            assert f"val/{m}" in cls.metrics and f"test/{m}" in cls.metrics
    assert get_workload("glue/cola").primary_metric == "val/matthews"
    assert (
        get_workload("glue/stsb").primary_metric == "val/pearson"
        and "train/accuracy" not in get_workload("glue/stsb").metrics
    )
    assert get_workload("glue/mrpc").primary_metric == "val/f1"


@pytest.mark.parametrize("task", ["cola", "mrpc"])
def test_local_glue_data_is_tokenised_offline(task, glue_dirs, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    wl = build_workload(
        f"glue/{task}",
        data_path=glue_dirs[task],
        tokenizer=tiny_tokenizer_dir,
        pretrained=False,
        dim=16,
        n_layers=1,
        n_heads=2,
        hidden_dim=32,
        max_length=24,
        val_fraction=0.25,
    )
    d = wl.load_data(0)
    n_train, n_dev = (40, 12) if task == "cola" else (30, 10)
    assert len(d.train) + len(d.val) == n_train and len(d.val) == round(0.25 * n_train) and len(d.test) == n_dev
    ids, mask = d.train.inputs["input_ids"], d.train.inputs["attention_mask"]
    assert ids.dtype == torch.int64 and ids.shape == mask.shape and ids.shape[1] <= 24
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    assert (ids[:, 0] == tok.cls_token_id).all()
    assert (ids == tok.unk_token_id).sum() == 0 and int(ids.max()) >= 5  # real word pieces, not [UNK]
    assert int(mask.sum(1).max()) == ids.shape[1]  # padded to the longest example, no further
    if task == "mrpc":
        assert ((ids == tok.sep_token_id).sum(1) == 2).all()  # a sentence pair
    torch.manual_seed(0)
    model = wl.build_model().eval()
    assert model.hf.config.vocab_size == len(tok)
    out = model(d.test.inputs)
    assert out.shape == (len(d.test), 2)
    metrics = wl.evaluate(model, d.test, batch_size=4)
    expected = {"loss", *TASKS[task].metrics}
    assert set(metrics) == expected


def test_stsb_is_a_regression(glue_dirs, tiny_tokenizer_dir):
    wl = build_workload(
        "glue/stsb",
        data_path=glue_dirs["stsb"],
        tokenizer=tiny_tokenizer_dir,
        pretrained=False,
        dim=16,
        n_layers=1,
        n_heads=2,
        hidden_dim=32,
    )
    d = wl.load_data(0)
    assert d.train.targets.dtype == torch.float32
    torch.manual_seed(0)
    model = wl.build_model().eval()
    out = model(d.test.inputs)
    assert out.shape == (len(d.test),)
    assert wl.loss(out, d.test.targets).item() == pytest.approx(
        torch.mean((out - d.test.targets) ** 2).item(), rel=1e-6
    )
    assert wl.batch_stats(out, d.test.targets) == (0, 0)
    m = wl.evaluate(model, d.test)
    assert set(m) == {"loss", "pearson", "spearman"}
    assert m["pearson"] == pytest.approx(pearson(out.detach().numpy(), d.test.targets.numpy()), abs=1e-6)


def test_pretrained_model_offline_error_says_how_to_provide_it():
    from flatlab.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"could not load pretrained model='distilbert/distilbert-base-uncased'.*save_pretrained\(DIR\)",
    ):
        build_workload("glue/rte").build_model()
