"""``lm/<corpus>``: causal language-model pre-training from scratch (IRE paper, Fig. 3 and Fig. 4).

Corpora (:data:`CORPORA`; ``data_path``: hub by default, a local folder, or ``"synthetic"``):
``lm/wikitext2``, ``lm/wikitext103``, ``lm/minipile``, ``lm/openwebtext``. Model size presets
(:data:`PRESETS`; ``n_layers``/``width``/``n_heads``/``intermediate``/``context`` override them):
``transformer_2l`` (GPT-2 blocks, 6.9 M parameters), ``llama_60m`` (73.2 M with GPT-2's vocabulary),
``llama_119m``, ``llama_229m`` (RoPE, untied embeddings).

Data: each split is tokenised once (``tokenizer``, default GPT-2's BPE) with ``datasets.map``, packed
into one token stream written to ``cache_dir`` as a ``.npy`` file and memory-mapped; a split is the
stream cut every ``context`` tokens (:class:`~flatlab.workloads.token_stream.TokenWindows`: inputs
``(N, context)``, targets shifted by one token). Synthetic data: a random sparse Markov chain over
``vocab_size`` (default 256) tokens.

Metrics: ``val/loss`` (nats per token), ``val/perplexity`` = exp(``val/loss``), ``val/accuracy``
(next-token top-1), the same for ``test``. Recipe (IRE paper, Fig. 4): AdamW betas (0.9, 0.95), weight
decay 0.1, gradient clipping 1.0, warm-up then cosine to lr_max / 20; ``clip_norm`` and
``final_lr_factor`` are trainer parameters the study files set.

The corpora and their splits, each preset's shape and parameter count, the data pipeline and how the
paper's "2x speed-up" is measured: ``docs/workloads.md`` (Language models).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import describe_error, get_split, is_synthetic, load_hf, require_columns, require_split
from flatlab.workloads.token_stream import Stream, markov_tokens

transformers = lazy("transformers", extra="nlp")

DEFAULT_TOKENIZER = "openai-community/gpt2"
SYNTHETIC_VOCAB = 256


@dataclass(frozen=True)
class LMPreset:
    """A model size: ``kind`` (``gpt2`` = learned absolute positions, ``llama`` = RoPE) and its shape."""

    kind: str
    n_layers: int
    width: int
    n_heads: int
    context: int
    intermediate: int = 0  # 0: 4 x width (GPT-2 blocks)


PRESETS: Dict[str, LMPreset] = {
    "transformer_2l": LMPreset("gpt2", 2, 128, 8, 512),
    "llama_60m": LMPreset("llama", 16, 410, 10, 150, 1093),
    "llama_119m": LMPreset("llama", 6, 768, 12, 512, 2048),
    "llama_229m": LMPreset("llama", 16, 768, 12, 1024, 3072),
}


@dataclass(frozen=True)
class Corpus:
    """A pre-training corpus: hub location, splits, whether documents are separated by end-of-text."""

    hub: str
    config: Optional[str]
    model: str
    doc_eos: bool
    has_eval_splits: bool = True


CORPORA: Dict[str, Corpus] = {
    "wikitext2": Corpus("Salesforce/wikitext", "wikitext-2-raw-v1", "transformer_2l", doc_eos=False),
    "wikitext103": Corpus("Salesforce/wikitext", "wikitext-103-raw-v1", "llama_60m", doc_eos=False),
    "minipile": Corpus("JeanKaddour/minipile", None, "llama_119m", doc_eos=True),
    "openwebtext": Corpus("Skylion007/openwebtext", None, "llama_229m", doc_eos=True, has_eval_splits=False),
}


# --------------------------------------------------------------------------------------------------
class CausalLM(nn.Module):
    """A transformers causal LM: ``forward((B, T) int64 ids) -> (B, T, V)`` float logits.

    Loading drops a ``progress`` buffer from the state dict (:func:`_drop_legacy_progress`), so a checkpoint
    that holds one resumes; the steps to a target are the trainer's loss curve's
    (:class:`flatlab.train.curve.LossCurve`).
    """

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model
        self._register_load_state_dict_pre_hook(_drop_legacy_progress)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids, use_cache=False).logits


def _drop_legacy_progress(state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    state_dict.pop(prefix + "progress", None)


def _chunked_ce(logits: torch.Tensor, targets: torch.Tensor, chunk: int = 8192) -> Tuple[float, int]:
    """Summed cross-entropy (nats) and token count, in chunks of rows to bound the float32 copy."""
    flat, y = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    total = 0.0
    for s in range(0, y.numel(), chunk):
        total += float(nn.functional.cross_entropy(flat[s : s + chunk].float(), y[s : s + chunk], reduction="sum"))
    return total, int(y.numel())


def _cache_root(cache_dir: Optional[str]) -> Path:
    return Path(cache_dir or os.environ.get("FLATLAB_CACHE") or Path.home() / ".cache" / "flatlab") / "lm"


class LMWorkload(Workload):
    data_hparams = (
        "tokenizer",
        "data_path",
        "hub_name",
        "cache_dir",
        "synthetic_tokens",
        "val_fraction",
        "max_train_tokens",
        "context",
    )
    """Base of the ``lm/<corpus>`` workloads (see the module docstring). Metric ``val/loss`` (min)."""

    corpus_name: ClassVar[str]
    corpus: ClassVar[Corpus]
    metrics = (
        "train/loss",
        "train/accuracy",
        "val/loss",
        "val/perplexity",
        "val/accuracy",
        "test/loss",
        "test/perplexity",
        "test/accuracy",
        "lr",
        "epoch",
        "time/epoch_s",
    )
    train_defaults = TrainDefaults(batch_size=32, schedule="cosine", label_smoothing=0.0)
    #: tiny offline parameters (a synthetic token stream, a 1-layer width-16 model): for tests over the registry
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "synthetic_tokens": 1024,
        "n_layers": 1,
        "width": 16,
        "n_heads": 2,
        "intermediate": 32,
        "context": 16,
    }

    @classmethod
    def _hparams(cls, corpus: Corpus) -> Tuple[HParam, ...]:
        return (
            HParam("model", corpus.model, str, choices=tuple(PRESETS), doc="size preset (module docstring)"),
            HParam("n_layers", None, int, low=1, nullable=True, doc="override the preset's layers"),
            HParam("width", None, int, low=2, nullable=True, doc="override the preset's hidden width"),
            HParam("n_heads", None, int, low=1, nullable=True, doc="override the preset's attention heads"),
            HParam("intermediate", None, int, low=1, nullable=True, doc="override the preset's FFN width (Llama)"),
            HParam("context", None, int, low=2, nullable=True, doc="override the preset's context (tokens per window)"),
            HParam("dropout", 0.0, float, low=0.0, high=1.0, high_open=True, doc="dropout (pre-training: 0)"),
            HParam("tokenizer", DEFAULT_TOKENIZER, str, doc="hub name or local folder of the tokenizer"),
            HParam(
                "vocab_size",
                None,
                int,
                low=2,
                nullable=True,
                doc="model vocabulary (None: the tokenizer's; synthetic: 256)",
            ),
            HParam("data_path", None, str, nullable=True, doc="None: hub; a save_to_disk folder; or 'synthetic'"),
            HParam("hub_name", corpus.hub, str, doc="Hugging Face dataset used when data_path is None"),
            HParam(
                "cache_dir",
                None,
                str,
                nullable=True,
                doc="packed token streams (None: $FLATLAB_CACHE or ~/.cache/flatlab)",
            ),
            HParam(
                "synthetic_tokens",
                8192,
                int,
                low=64,
                doc="data_path='synthetic': training tokens (val, test: a quarter)",
            ),
            HParam(
                "val_fraction",
                0.0005,
                float,
                low=0.0,
                high=0.5,
                low_open=True,
                doc="share of the stream held out when the corpus has no validation split",
            ),
            HParam(
                "max_train_tokens", None, int, low=2, nullable=True, doc="use only the first this many training tokens"
            ),
            HParam("eval_batch_size", 16, int, low=1, doc="windows per evaluation batch"),
        )

    # ---------------------------------------------------------------------------------------------- shape
    def shape(self) -> Dict[str, int]:
        """The model's resolved shape: preset values with the overrides applied."""
        pre = PRESETS[self.params["model"]]
        out = {
            "n_layers": self.params["n_layers"] or pre.n_layers,
            "width": self.params["width"] or pre.width,
            "n_heads": self.params["n_heads"] or pre.n_heads,
            "context": self.params["context"] or pre.context,
        }
        out["intermediate"] = self.params["intermediate"] or pre.intermediate or 4 * out["width"]
        if out["width"] % out["n_heads"]:
            raise ConfigError(
                f"workload {self.name!r}: width={out['width']} must be divisible by n_heads={out['n_heads']}"
            )
        return out

    # ---------------------------------------------------------------------------------------------- data
    def _tokenizer(self) -> Any:
        auto_tokenizer = transformers.AutoTokenizer  # imported here: a missing transformers is not a hub error
        name = self.params["tokenizer"]
        try:
            return auto_tokenizer.from_pretrained(name)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                f"workload {self.name!r}: could not load tokenizer={name!r} ({describe_error(exc)}). "
                "Offline: AutoTokenizer.from_pretrained(name).save_pretrained(DIR) elsewhere and pass tokenizer=DIR, "
                "or use data_path='synthetic'."
            ) from exc

    def _packed(self, ds: Any, split: str, tok: Any) -> "Stream":
        """The split's token stream, from the cache or tokenised now (then cached); memory-mapped."""
        p = self.params
        key = json.dumps(
            [p["data_path"] or p["hub_name"], self.corpus.config, split, p["tokenizer"], self.corpus.doc_eos, len(tok)]
        )
        root = _cache_root(p["cache_dir"])
        path = root / f"{self.corpus_name}-{split}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npy"
        if not path.exists():
            column = require_columns(ds, ("text",), "text", self.name)
            eos = [tok.eos_token_id] if (self.corpus.doc_eos and tok.eos_token_id is not None) else []

            def encode(batch: Dict[str, Any]) -> Dict[str, Any]:
                ids = tok(batch[column], add_special_tokens=False)["input_ids"]
                return {"ids": [x + eos for x in ids], "n": [len(x) + len(eos) for x in ids]}

            enc = ds.map(
                encode,
                batched=True,
                remove_columns=ds.column_names,
                desc=f"tokenising {split}",
            )
            total = int(np.sum(list(enc["n"])))
            dtype = np.uint16 if len(tok) <= np.iinfo(np.uint16).max else np.int32
            root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(total,))
            pos = 0
            for start in range(0, len(enc), 10_000):
                for ids in enc[start : start + 10_000]["ids"]:
                    out[pos : pos + len(ids)] = ids
                    pos += len(ids)
            out.flush()
            del out
            os.replace(tmp, path)  # atomic: concurrent loaders never see a partial file
        return Stream(np.load(path, mmap_mode="r"), str(path))

    def load_data(self, seed: int) -> Data:
        p = self.params
        ctx = self.shape()["context"]
        streams: Dict[str, Stream] = {}
        if is_synthetic(p["data_path"]):
            n, q = p["synthetic_tokens"], p["synthetic_tokens"] // 4
            full = Stream(markov_tokens(n + 2 * q, p["vocab_size"] or SYNTHETIC_VOCAB, seed=0))
            streams["train"], rest = full.cut(n)
            streams["val"], streams["test"] = rest.cut(q)
            source = "synthetic"
        else:
            dsets = load_hf(self.name, p["hub_name"], self.corpus.config, p["data_path"])
            tok = self._tokenizer()
            streams["train"] = self._packed(require_split(dsets, ("train",), self.name, p["data_path"]), "train", tok)
            val_ds = get_split(dsets, ("validation", "valid", "val"))
            test_ds = get_split(dsets, ("test",))
            if val_ds is not None:
                streams["val"] = self._packed(val_ds, "validation", tok)
            else:  # hold out the end of the training stream (openwebtext)
                full = streams["train"]
                streams["train"], streams["val"] = full.cut(
                    len(full) - max(ctx + 1, int(len(full) * p["val_fraction"]))
                )
            if test_ds is not None:
                streams["test"] = self._packed(test_ds, "test", tok)
            source = p["data_path"] or p["hub_name"]
        if p["max_train_tokens"]:
            streams["train"] = streams["train"].head(p["max_train_tokens"])
        for k, s in streams.items():
            if len(s) < ctx + 1:
                raise ValueError(
                    f"workload {self.name!r}: split {k!r} has {len(s)} tokens, fewer than context + 1 = {ctx + 1}"
                )
        return Data(
            train=streams["train"].windows(ctx),
            val=streams["val"].windows(ctx),
            test=streams["test"].windows(ctx) if "test" in streams else None,
            meta={"source": source, "context": ctx, "tokens": {k: len(v) for k, v in streams.items()}},
        )

    # ---------------------------------------------------------------------------------------------- model
    def build_model(self) -> nn.Module:
        p = self.params
        s = self.shape()
        if p["vocab_size"]:
            vocab = p["vocab_size"]
        elif is_synthetic(p["data_path"]):
            vocab = SYNTHETIC_VOCAB
        else:
            vocab = len(self._tokenizer())
        kind = PRESETS[p["model"]].kind
        if kind == "gpt2":
            eos = min(50256, vocab - 1)  # GPT-2's end-of-text id, inside small test vocabularies
            cfg = transformers.GPT2Config(
                bos_token_id=eos,
                eos_token_id=eos,
                vocab_size=vocab,
                n_positions=s["context"],
                n_embd=s["width"],
                n_layer=s["n_layers"],
                n_head=s["n_heads"],
                n_inner=s["intermediate"],
                resid_pdrop=p["dropout"],
                embd_pdrop=p["dropout"],
                attn_pdrop=p["dropout"],
            )
            hf = transformers.GPT2LMHeadModel(cfg)
        else:
            head_dim = s["width"] // s["n_heads"]
            extra: Dict[str, Any] = {}
            if head_dim % 2:  # RoPE rotates pairs of dims: round an odd head dim down (llama_60m: 41 -> 40)
                extra["head_dim"] = head_dim - 1
            cfg = transformers.LlamaConfig(
                vocab_size=vocab,
                hidden_size=s["width"],
                intermediate_size=s["intermediate"],
                num_hidden_layers=s["n_layers"],
                num_attention_heads=s["n_heads"],
                num_key_value_heads=s["n_heads"],
                max_position_embeddings=s["context"],
                tie_word_embeddings=False,
                attention_dropout=p["dropout"],
                **extra,
            )
            hf = transformers.LlamaForCausalLM(cfg)
        return CausalLM(hf)

    # ---------------------------------------------------------------------------------------------- metrics
    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """``loss`` (nats per token), ``perplexity`` = exp(loss) and next-token ``accuracy`` on ``split``."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        bs = min(batch_size, self.params["eval_batch_size"])
        total, count, correct = 0.0, 0, 0
        for start in range(0, len(split), bs):
            x = split.inputs[start : start + bs].to(device)  # type: ignore[index]
            y = split.targets[start : start + bs].to(device)
            out = model(x)
            t, n = _chunked_ce(out, y)
            total, count = total + t, count + n
            correct += int((out.argmax(-1) == y).sum())
        model.train(was_training)
        loss = total / max(1, count)
        return {"loss": loss, "perplexity": perplexity(loss), "accuracy": correct / max(1, count)}


def perplexity(loss: float) -> float:
    """exp(``loss``) for a mean loss in nats per token (``inf`` beyond float range)."""
    return math.exp(loss) if loss < 709.0 else float("inf")


def _register(corpus_name: str) -> None:
    corpus = CORPORA[corpus_name]
    cls = type(
        f"LM_{corpus_name}",
        (LMWorkload,),
        {
            "__doc__": f"Causal LM pre-training on {corpus_name} ({corpus.hub}); metric val/loss (min).",
            "name": f"lm/{corpus_name}",
            "doc": f"causal LM pre-training on {corpus_name} (HF {corpus.hub}), default model {corpus.model}",
            "corpus_name": corpus_name,
            "corpus": corpus,
            "hparams": LMWorkload._hparams(corpus),
            "__module__": __name__,
        },
    )
    register_workload(cls)
    globals()[cls.__name__] = cls


for _c in CORPORA:
    _register(_c)
