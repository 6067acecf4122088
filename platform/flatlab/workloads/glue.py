"""``glue/<task>``: fine-tuning DistilBERT (Sanh et al. 2019) on a GLUE task (TSAM paper, GLUE table).

Tasks: ``cola`` (Matthews correlation), ``sst2``, ``mrpc`` (F1 and accuracy), ``qqp`` (F1 and
accuracy), ``stsb`` (regression: Pearson and Spearman, MSE loss), ``mnli`` (matched dev set),
``qnli``, ``rte``, ``wnli`` (accuracy). Each task is one registered workload (``glue/cola`` ...).

Data (``data_path``): the hub dataset ``nyu-mll/glue`` with the task as config, a local
``save_to_disk`` folder (a ``DatasetDict`` with ``train`` and ``validation`` splits and the task's
text columns plus ``label``), or ``"synthetic"`` (token ids generated in the model's vocabulary,
no tokenizer needed). GLUE's test labels are hidden, so: ``val`` = a random hold-out of the training
set (``val_fraction``, at most ``MAX_VAL_SIZE`` = 5,000 examples; study seed), used by the searcher; ``test`` = GLUE's
dev set, evaluated once at the end (what papers report as GLUE scores).

Text is tokenised once on the driver (``tokenizer``: a hub name or local folder, default = ``model``),
truncated to ``max_length`` and padded to the longest tokenised example; inputs are a dict
``{"input_ids", "attention_mask"}`` of ``(N, L)`` int64 tensors. Model: ``model`` (a hub name or local
folder) with ``pretrained=True``; with ``pretrained=False`` a randomly initialised
``DistilBertForSequenceClassification`` of size ``dim``/``n_layers``/``n_heads``/``hidden_dim``
(tests: a tiny one). ``transformers`` is imported lazily. IRE optimizers need class logits and do
not apply to ``stsb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload, take, to_device
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import describe_error, is_synthetic, load_hf, require_columns, require_split

transformers = lazy("transformers", extra="nlp")

DEFAULT_MODEL = "distilbert/distilbert-base-uncased"
DEFAULT_VOCAB = 30522  # DistilBERT's (uncased WordPiece)
MAX_VAL_SIZE = 5000  # cap on the validation hold-out (examples)


# --------------------------------------------------------------------------------------------------
# Metrics (numpy; checked against scikit-learn / scipy in the tests)
def matthews_corrcoef(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Matthews correlation coefficient (multiclass form, Gorodkin 2004) of ``(N,)`` integer labels.

    Returns 0.0 when it is undefined (a constant prediction or truth), as scikit-learn does.
    """
    y_true, y_pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    classes = np.union1d(y_true, y_pred)
    t = np.array([(y_true == c).sum() for c in classes], dtype=np.float64)
    p = np.array([(y_pred == c).sum() for c in classes], dtype=np.float64)
    c = float((y_true == y_pred).sum())
    s = float(len(y_true))
    denom = np.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    return 0.0 if denom == 0 else float((c * s - (p * t).sum()) / denom)


def f1_binary(y_true: np.ndarray, y_pred: np.ndarray, positive: int = 1) -> float:
    """F1 score of class ``positive`` (MRPC, QQP): 2TP / (2TP + FP + FN); 0.0 when undefined."""
    y_true, y_pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    tp = float(((y_pred == positive) & (y_true == positive)).sum())
    fp = float(((y_pred == positive) & (y_true != positive)).sum())
    fn = float(((y_pred != positive) & (y_true == positive)).sum())
    return 0.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two ``(N,)`` arrays (NaN if either is constant)."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    xc, yc = x - x.mean(), y - y.mean()
    denom = np.sqrt((xc * xc).sum() * (yc * yc).sum())
    return float("nan") if denom == 0 else float((xc * yc).sum() / denom)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    xs = x[order]
    i = 0
    while i < len(x):  # ties share the mean of their ranks (1-based)
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation: Pearson correlation of average ranks (ties averaged)."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    return pearson(_average_ranks(x), _average_ranks(y))


# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: text columns, number of labels (1 = regression), metrics, dev split name."""

    columns: Tuple[str, Optional[str]]
    num_labels: int
    metrics: Tuple[str, ...]
    dev_split: str = "validation"

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


TASKS: Dict[str, GlueTask] = {
    "cola": GlueTask(("sentence", None), 2, ("matthews", "accuracy")),
    "sst2": GlueTask(("sentence", None), 2, ("accuracy",)),
    "mrpc": GlueTask(("sentence1", "sentence2"), 2, ("f1", "accuracy")),
    "qqp": GlueTask(("question1", "question2"), 2, ("f1", "accuracy")),
    "stsb": GlueTask(("sentence1", "sentence2"), 1, ("pearson", "spearman")),
    "mnli": GlueTask(("premise", "hypothesis"), 3, ("accuracy",), dev_split="validation_matched"),
    "qnli": GlueTask(("question", "sentence"), 2, ("accuracy",)),
    "rte": GlueTask(("sentence1", "sentence2"), 2, ("accuracy",)),
    "wnli": GlueTask(("sentence1", "sentence2"), 2, ("accuracy",)),
}
PRIMARY = {"cola": "matthews", "mrpc": "f1", "qqp": "f1", "stsb": "pearson"}  # else accuracy


def task_metrics(task: GlueTask, logits: np.ndarray, targets: np.ndarray) -> Dict[str, float]:
    """The task's metrics from model outputs ``(N, C)`` (``(N,)`` for regression) and targets ``(N,)``."""
    out: Dict[str, float] = {}
    if task.regression:
        out["pearson"] = pearson(logits, targets)
        out["spearman"] = spearman(logits, targets)
        return out
    pred = logits.argmax(-1)
    for m in task.metrics:
        if m == "accuracy":
            out[m] = float((pred == targets).mean()) if len(targets) else 0.0
        elif m == "matthews":
            out[m] = matthews_corrcoef(targets, pred)
        elif m == "f1":
            out[m] = f1_binary(targets, pred)
    return out


class SequenceClassifier(nn.Module):
    """A transformers sequence-classification model taking the workload's input dict.

    ``forward({"input_ids": (N, L), "attention_mask": (N, L)})`` -> logits ``(N, C)``, or ``(N,)`` predictions
    for a regression task.
    """

    def __init__(self, hf_model: nn.Module, regression: bool) -> None:
        super().__init__()
        self.hf = hf_model
        self.regression = regression

    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.hf(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        return logits.squeeze(-1) if self.regression else logits


def _random_holdout(n: int, n_val: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng([seed, 0x61E]).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


class GlueWorkload(Workload):
    data_hparams = (
        "tokenizer",
        "max_length",
        "data_path",
        "hub_name",
        "synthetic_size",
        "val_fraction",
    )
    """Base of the ``glue/<task>`` workloads (see the module docstring)."""

    task_name: ClassVar[str]
    task: ClassVar[GlueTask]
    primary_metric: ClassVar[str]
    hparams = (
        HParam("model", DEFAULT_MODEL, str, doc="hub name or local folder of a DistilBERT checkpoint"),
        HParam("pretrained", True, bool, doc="load the checkpoint's weights (False: random init of the sizes below)"),
        HParam("tokenizer", None, str, nullable=True, doc="hub name or local folder (None: the model's)"),
        HParam("max_length", 128, int, low=8, doc="tokens per example after truncation"),
        HParam(
            "data_path", None, str, nullable=True, doc="None: hub nyu-mll/glue; a save_to_disk folder; or 'synthetic'"
        ),
        HParam("hub_name", "nyu-mll/glue", str, doc="Hugging Face dataset used when data_path is None"),
        HParam("synthetic_size", 256, int, low=8, doc="data_path='synthetic': training examples (dev: a quarter)"),
        HParam(
            "val_fraction",
            0.1,
            float,
            low=0.0,
            high=0.5,
            low_open=True,
            doc=f"share of train held out for validation (at most {MAX_VAL_SIZE} examples)",
        ),
        HParam(
            "vocab_size",
            None,
            int,
            low=16,
            nullable=True,
            doc="pretrained=False: vocabulary (None: the tokenizer's; synthetic: 30522)",
        ),
        HParam("dim", 768, int, low=8, doc="pretrained=False: hidden width"),
        HParam("n_layers", 6, int, low=1, doc="pretrained=False: transformer layers"),
        HParam("n_heads", 12, int, low=1, doc="pretrained=False: attention heads"),
        HParam("hidden_dim", 3072, int, low=8, doc="pretrained=False: feed-forward width"),
        HParam("eval_batch_size", 256, int, low=1, doc="examples per evaluation batch"),
    )
    train_defaults = TrainDefaults(batch_size=32, schedule="constant", label_smoothing=0.0)
    #: tiny offline parameters (synthetic token ids, a 1-layer width-16 DistilBERT): for tests over the registry
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "synthetic_size": 40,
        "pretrained": False,
        "vocab_size": 300,
        "dim": 16,
        "n_layers": 1,
        "n_heads": 2,
        "hidden_dim": 32,
        "max_length": 16,
    }

    # ---------------------------------------------------------------------------------------------- data
    def _tokenizer(self) -> Any:
        auto_tokenizer = transformers.AutoTokenizer  # imported here: a missing transformers is not a hub error
        name = self.params["tokenizer"] or self.params["model"]
        try:
            return auto_tokenizer.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001 - hub / file errors come in many types
            raise ConfigError(
                f"workload {self.name!r}: could not load tokenizer {name!r} ({describe_error(exc)}). "
                "Offline: save it elsewhere with AutoTokenizer.from_pretrained(name).save_pretrained(DIR) and pass "
                "tokenizer=DIR (or model=DIR), or use data_path='synthetic' with pretrained=False."
            ) from exc

    def _vocab(self) -> int:
        return self.params["vocab_size"] or DEFAULT_VOCAB

    def _synthetic(self, n: int, seed: int) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        """Token ids whose class (or score) is readable from the share of 'marker' tokens."""
        rng = np.random.default_rng([seed, 0x6C])
        length = min(32, self.params["max_length"])
        vocab = self._vocab()
        k = max(2, self.task.num_labels)
        ids = rng.integers(5, vocab, size=(n, length))
        lengths = rng.integers(length // 2, length + 1, size=n)
        mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
        band = max(1, (vocab - 5) // k)
        if self.task.regression:
            share = rng.uniform(0, 1, size=n)
            y = (5 * share).astype(np.float32)
            labels = np.zeros(n, dtype=np.int64)
        else:
            y = rng.integers(0, k, size=n)
            share = np.full(n, 0.5)
            labels = y
        marked = rng.uniform(size=(n, length)) < share[:, None]
        ids = np.where(marked, 5 + labels[:, None] * band + rng.integers(0, band, size=(n, length)), ids)
        ids[:, 0] = 1  # a [CLS]-like first token
        ids = ids * mask
        return {"input_ids": ids.astype(np.int64), "attention_mask": mask}, y

    def _tokenize(self, tok: Any, ds: Any) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        a, b = self.task.columns
        a = require_columns(ds, (a,), "text", self.name)
        lab = require_columns(ds, ("label",), "label", self.name)
        texts_b = list(ds[require_columns(ds, (b,), "second text", self.name)]) if b else None
        enc = tok(
            list(ds[a]),
            texts_b,
            truncation=True,
            max_length=self.params["max_length"],
            padding="max_length",
            return_tensors="np",
        )
        y = np.asarray(list(ds[lab]), dtype=np.float32 if self.task.regression else np.int64)
        return {
            "input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64),
        }, y

    def load_data(self, seed: int) -> Data:
        p = self.params
        if is_synthetic(p["data_path"]):
            n = p["synthetic_size"]
            x, y = self._synthetic(n + n // 4, seed=0)
            x_dev, y_dev = {k: v[n:] for k, v in x.items()}, y[n:]
            x, y = {k: v[:n] for k, v in x.items()}, y[:n]
            source = "synthetic"
        else:
            dsets = load_hf(self.name, p["hub_name"], self.task_name, p["data_path"])
            tok = self._tokenizer()
            x, y = self._tokenize(tok, require_split(dsets, ("train",), self.name, p["data_path"]))
            x_dev, y_dev = self._tokenize(
                tok, require_split(dsets, (self.task.dev_split, "validation"), self.name, p["data_path"])
            )
            source = p["data_path"] or f"{p['hub_name']}/{self.task_name}"
        if not self.task.regression and (y.min() < 0 or y.max() >= self.task.num_labels):
            raise ValueError(
                f"workload {self.name!r}: labels must lie in [0, {self.task.num_labels}), got [{y.min()}, {y.max()}]"
            )
        width = int(max(x["attention_mask"].sum(1).max(), x_dev["attention_mask"].sum(1).max()))  # longest example

        def split(inputs: Dict[str, np.ndarray], targets: np.ndarray, idx: Any = slice(None)) -> Split:
            return Split(
                {k: torch.from_numpy(np.ascontiguousarray(v[idx, :width])) for k, v in inputs.items()},
                torch.from_numpy(targets[idx]),
            )

        n_val = max(1, min(MAX_VAL_SIZE, int(round(p["val_fraction"] * len(y)))))
        tr, va = _random_holdout(len(y), n_val, seed)
        return Data(
            train=split(x, y, tr),
            val=split(x, y, va),
            test=split(x_dev, y_dev),
            meta={"source": source, "task": self.task_name, "split_seed": seed, "seq_len": width},
        )

    # ---------------------------------------------------------------------------------------------- model
    def build_model(self) -> nn.Module:
        p = self.params
        k = self.task.num_labels
        if p["pretrained"]:
            auto_model = transformers.AutoModelForSequenceClassification  # imported outside the try: not a hub error
            try:
                hf = auto_model.from_pretrained(p["model"], num_labels=k)
            except Exception as exc:  # noqa: BLE001
                raise ConfigError(
                    f"workload {self.name!r}: could not load pretrained model={p['model']!r} ({describe_error(exc)}). "
                    "Offline: save it elsewhere with .save_pretrained(DIR) and pass model=DIR, or pretrained=False."
                ) from exc
        else:
            if p["vocab_size"]:
                vocab = p["vocab_size"]
            elif is_synthetic(p["data_path"]):
                vocab = DEFAULT_VOCAB
            else:
                vocab = len(self._tokenizer())
            if p["dim"] % p["n_heads"]:
                raise ConfigError(f"workload {self.name!r}: dim={p['dim']} must be divisible by n_heads={p['n_heads']}")
            config = transformers.DistilBertConfig(
                vocab_size=vocab,
                dim=p["dim"],
                n_layers=p["n_layers"],
                n_heads=p["n_heads"],
                hidden_dim=p["hidden_dim"],
                max_position_embeddings=max(512, p["max_length"]),
                num_labels=k,
            )
            hf = transformers.DistilBertForSequenceClassification(config)
        return SequenceClassifier(hf, self.task.regression)

    # ---------------------------------------------------------------------------------------------- loss / metrics
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Cross-entropy (nats per example), or mean squared error for ``stsb`` (outputs ``(N,)``)."""
        if self.task.regression:
            return nn.functional.mse_loss(outputs.float(), targets.float())
        return super().loss(outputs, targets, label_smoothing)

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> Tuple[Any, int]:
        """As :meth:`Workload.batch_stats`; ``(0, 0)`` for the regression task (no training accuracy)."""
        if self.task.regression:
            return 0, 0  # no training accuracy for a regression task
        return super().batch_stats(outputs, targets)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """``loss`` (cross-entropy, or MSE for ``stsb``) and the task's metrics on ``split`` (eval mode)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        bs = min(batch_size, self.params["eval_batch_size"])
        outs = []
        for start in range(0, len(split), bs):
            outs.append(model(to_device(take(split.inputs, slice(start, start + bs)), device)).float().cpu())
        model.train(was_training)
        out = torch.cat(outs) if outs else torch.zeros(0)
        y = split.targets
        if self.task.regression:
            loss = float(nn.functional.mse_loss(out, y.float())) if len(y) else 0.0
        else:
            loss = float(nn.functional.cross_entropy(out, y)) if len(y) else 0.0
        return {"loss": loss, **task_metrics(self.task, out.numpy(), y.numpy())}


def _metric_names(task: GlueTask) -> Tuple[str, ...]:
    base = ["train/loss", "lr", "epoch", "time/epoch_s", "val/loss", "test/loss"]
    if not task.regression:
        base.append("train/accuracy")
    for prefix in ("val", "test"):
        base += [f"{prefix}/{m}" for m in task.metrics]
    return tuple(base)


def _register(task_name: str) -> None:
    task = TASKS[task_name]
    primary = PRIMARY.get(task_name, "accuracy")
    kind = "regression, " if task.regression else ""
    cls = type(
        f"Glue_{task_name}",
        (GlueWorkload,),
        {
            "__doc__": f"GLUE {task_name.upper()} with DistilBERT; primary metric val/{primary}.",
            "name": f"glue/{task_name}",
            "doc": f"GLUE {task_name} fine-tuning (DistilBERT); {kind}metrics {', '.join(task.metrics)}",
            "task_name": task_name,
            "task": task,
            "primary_metric": f"val/{primary}",
            "metrics": _metric_names(task),
            "__module__": __name__,
        },
    )
    register_workload(cls)
    globals()[cls.__name__] = cls  # importable by name (pickling by reference)


for _t in TASKS:
    _register(_t)
