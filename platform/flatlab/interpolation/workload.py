"""``clip_interpolate``: the alpha study's trial (WiSE-FT; seed paper "In Search of the Successful
Interpolation"). An evaluation-only workload (``trains = False``; its trial calls :meth:`evaluate_only`
once, :func:`flatlab.train.evaluation.evaluate_trial`) on the CLIP workloads' zero-shot model and evaluation
sets (:class:`flatlab.workloads.clip.ClipWorkload`).

It loads a fine-tuned checkpoint file (``finetuned``; in a study also an earlier study's trial,
``mlflow:<study>/<arm>?param=value&...`` resolved at launch or ``run:<run_id>``, which the platform fetches
from MLflow before the workload is built: :mod:`flatlab.tracking.checkpoints`), interpolates with the
zero-shot model at ``alpha`` (weight on the FINE-TUNED model, WiSE-FT's convention; the seed paper's alpha
is our ``1 - alpha``), and reports ID/OOD loss and accuracy; optionally adaptive average sharpness (App. A)
on a fixed OOD subset, general and per layer (Fig. 4; by default as §3.1 defines it, the fine-tuned model's
layer perturbed, then interpolated: :mod:`flatlab.interpolation.along_path`), logged under the ``flat/*``
names the flatness correlation reads; optionally layer-wise interpolation at ``alpha``, one layer group at a
time (Def. 1.1, Fig. 2); and optionally all of it after straggler pruning (Algorithm 1).
``alpha`` is then an ordinary search dimension, e.g. ``sp.grid(alpha_grid(0.05))`` with the grid searcher.
The procedures: ``docs/algorithms/rft.md``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam, resolve
from flatlab.interpolation.along_path import LAYER_SHARPNESS, finetuned_layer_sharpness
from flatlab.interpolation.state import check_compatible, interpolate
from flatlab.interpolation.stragglers import find_stragglers, prune_stragglers
from flatlab.interpolation.sweep import layerwise_alpha_sweep
from flatlab.sharpness import compute_measures, group_parameters, layerwise_sharpness, measure_subset
from flatlab.workloads.base import Data, Split, Workload
from flatlab.workloads.clip import (
    EVAL_HPARAMS,
    EVAL_METRICS,
    MODEL_HPARAMS,
    ZERO_SHOT_KEYS,
    ClipFinetune,
    ClipWorkload,
    SubsetCrossEntropy,
)
from flatlab.workloads.clip_model import load_state_file
from flatlab.workloads.registry import register_workload

_STRAGGLERS: "OrderedDict[Tuple, Tuple[List[str], Dict[str, float]]]" = OrderedDict()
_STRAGGLER_LOCK = threading.Lock()


@register_workload
class ClipInterpolate(ClipWorkload):
    """Evaluate ``theta_alpha = (1 - alpha) theta_zs + alpha theta_ft`` (WiSE-FT); no training."""

    name = "clip_interpolate"
    doc = "WiSE-FT interpolation of a fine-tuned CLIP with its zero-shot model at alpha (no training)"
    trains = False
    checkpoint_params = ("finetuned",)
    hparams = (
        MODEL_HPARAMS
        + EVAL_HPARAMS
        + (
            HParam(
                "finetuned",
                "",
                str,
                doc="fine-tuned checkpoint: a file; in a study also mlflow:<study>/<arm>?param=value&... "
                "(resolved at launch) or run:<run_id>",
            ),
            HParam(
                "alpha",
                0.5,
                float,
                low=0.0,
                high=1.0,
                doc="weight on the fine-tuned model (WiSE-FT; the seed paper's 1 - alpha)",
            ),
            HParam(
                "prune",
                False,
                bool,
                doc="zero a random half of each straggler layer of the fine-tuned model first (seed Algorithm 1)",
            ),
            HParam(
                "straggler_draws",
                5,
                int,
                low=1,
                doc="draws of the layer-wise sharpness that finds stragglers (seed: 5)",
            ),
            HParam(
                "straggler_threshold",
                1e-3,
                float,
                doc="straggler: layer-wise sharpness of the fine-tuned model below this (nats)",
            ),
            HParam(
                "sharpness_draws",
                0,
                int,
                low=0,
                doc="adaptive average sharpness draws on the OOD subset (0 = off; seed: 20)",
            ),
            HParam(
                "sharpness_rho",
                1.0,
                float,
                low=0.0,
                low_open=True,
                doc="sharpness noise scale rho, relative to |w| (seed: 1.0)",
            ),
            HParam(
                "sharpness_layerwise",
                True,
                bool,
                doc="also per layer (clip grouping), as flat/layer_sharpness/<group> (layer_sharpness=finetuned) or "
                "flat/layer_sharpness_interpolated/<group> (interpolated)",
            ),
            HParam(
                "layer_sharpness",
                "finetuned",
                str,
                choices=LAYER_SHARPNESS,
                doc="layer-wise sharpness along alpha: finetuned (seed §3.1: perturb the fine-tuned model's layer, "
                "then interpolate) or interpolated (perturb the layer of theta_alpha)",
            ),
            HParam(
                "sharpness_examples",
                1000,
                int,
                low=0,
                doc="size m of the fixed OOD subset for sharpness and stragglers (0 = all)",
            ),
            HParam(
                "sharpness_seed",
                0,
                int,
                low=0,
                doc="seed of the subset choice and of the noise (the same for every alpha)",
            ),
            HParam(
                "layerwise_interpolation",
                "",
                str,
                doc="seed Fig. 2: also evaluate layer-wise interpolation at alpha (Def. 1.1: zero-shot weights "
                "except one layer group, interpolated), one group at a time: '' = off, 'all' = every group of the "
                "clip grouping, or 'g1,g2,...'; metrics layer_interp/<split>/{accuracy,loss}/<group>",
            ),
        )
    )
    metrics = (
        Workload.metrics
        + EVAL_METRICS
        + (
            "interp/alpha",
            "flat/avg_sharpness",
            "flat/avg_sharpness_stderr",
            "flat/avg_sharpness_clean",
            "prune/n_stragglers",
        )
    )

    def load_data(self, seed: int) -> Data:
        """ID (``val``, also passed as ``train``, which is never iterated) and OOD splits.

        Raises:
            ConfigError: unreadable sources; OOD labels that are not ID labels.
        """
        val, extra, meta = self._load_eval(seed, self._transform())
        return Data(train=val, val=val, extra=extra, meta=meta)

    # ---- the trial ----------------------------------------------------------------------------
    def evaluate_only(self, model: nn.Module, data: Data) -> Dict[str, float]:
        """One trial: read ``finetuned``, optionally prune stragglers, load ``theta_alpha`` into
        ``model`` (which holds the zero-shot weights, from :meth:`build_model`), evaluate every split,
        with ``sharpness_draws > 0`` measure adaptive average sharpness and, with ``layerwise_interpolation``,
        evaluate every split with one layer group interpolated at a time (Fig. 2). ``model`` ends holding
        ``theta_alpha``.

        Returns:
            ``interp/alpha``; ``val/loss``, ``val/accuracy`` (ID), ``ood/loss``, ``ood/accuracy`` (and other OOD
            sets); with sharpness, under the measures registry's names (what the flatness correlation reads):
            ``flat/avg_sharpness`` (nats), ``flat/avg_sharpness_stderr``, ``flat/avg_sharpness_clean`` and,
            per layer group, ``flat/layer_sharpness/<group>`` (§3.1) or
            ``flat/layer_sharpness_interpolated/<group>``; with ``prune``: ``prune/n_stragglers``,
            ``prune/straggler/<group>`` = 1 and ``prune/layer_sharpness/<group>`` (the fine-tuned model's,
            that found them); with ``layerwise_interpolation``: ``layer_interp/<split>/accuracy/<group>`` and
            ``layer_interp/<split>/loss/<group>``.

        Raises:
            ConfigError: an empty ``finetuned`` or one that is not a file; a checkpoint fine-tuned from
                another zero-shot model (architecture, weights, classes or templates differ; known when
                the file comes with its trial's record, :func:`producing_trial`) or whose keys or
                shapes differ; ``layerwise_interpolation`` naming a group the model does not have.
        """
        p = self.params
        path = self._checkpoint_file()
        self._check_same_zero_shot(producing_trial(path))
        zs = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ft = load_state_file(path)
        check_compatible(zs, ft)
        metrics: Dict[str, float] = {"interp/alpha": p["alpha"]}
        needs_subset = p["prune"] or p["sharpness_draws"] > 0
        subset = loss_fn = None
        if needs_subset:
            if "ood" not in data.extra:
                raise ConfigError("sharpness and straggler pruning run on the OOD set; set ood_data")
            subset, loss_fn = self._sharpness_subset(data.extra["ood"], next(model.parameters()).device)
        if p["prune"]:
            groups = group_parameters(model, "clip")
            stragglers, layer_values = self._stragglers(model, ft, subset, loss_fn, groups, path)
            # seed 0: the same random half of each straggler layer at every alpha
            ft = prune_stragglers(ft, [k for g in stragglers for k in groups[g]], seed=0)
            metrics["prune/n_stragglers"] = float(len(stragglers))
            metrics.update({f"prune/straggler/{g}": 1.0 for g in stragglers})
            metrics.update({f"prune/layer_sharpness/{g}": v for g, v in layer_values.items()})
        model.load_state_dict(interpolate(zs, ft, p["alpha"]))
        for prefix, split in data.eval_splits().items():
            for k, v in self.evaluate(model, split).items():
                metrics[f"{prefix}/{k}"] = v
        if p["sharpness_draws"] > 0:
            metrics.update(self._sharpness(model, zs, ft, subset, loss_fn))
        if p["layerwise_interpolation"].strip():
            metrics.update(self._layerwise_interpolation(model, zs, ft, data))
        return metrics

    def _interpolated_groups(self, model: nn.Module) -> Dict[str, Tuple[str, ...]]:
        """The layer groups ``layerwise_interpolation`` names (clip grouping), in the model's order.

        Raises:
            ConfigError: a name that is not a group of the model (listing the groups).
        """
        groups = group_parameters(model, "clip")
        choice = self.params["layerwise_interpolation"].strip()
        if choice == "all":
            return dict(groups)
        wanted = [g.strip() for g in choice.split(",") if g.strip()]
        unknown = [g for g in wanted if g not in groups]
        if unknown:
            raise ConfigError(
                f"layerwise_interpolation names {unknown[0]!r}, not a layer group of this model; use 'all' or "
                f"some of: {', '.join(groups)}"
            )
        return {g: groups[g] for g in groups if g in wanted}

    def _layerwise_interpolation(self, model: nn.Module, zs, ft, data: Data) -> Dict[str, float]:
        """Layer-wise interpolation at ``alpha`` (seed Def. 1.1 and Fig. 2) on every evaluation split, one
        group at a time (:func:`~flatlab.interpolation.sweep.layerwise_alpha_sweep` at this trial's alpha);
        ``theta_alpha`` is loaded back afterwards."""
        splits = data.eval_splits()

        def evaluate(state, split: str) -> Dict[str, float]:
            model.load_state_dict(state)
            return self.evaluate(model, splits[split])

        alpha = self.params["alpha"]
        try:
            sweeps = layerwise_alpha_sweep(
                zs, ft, evaluate, self._interpolated_groups(model), alphas=(alpha,), splits=tuple(splits)
            )
        finally:
            model.load_state_dict(interpolate(zs, ft, alpha))
        return {
            f"layer_interp/{split}/{quantity}/{g}": values[split][0]
            for g, sweep in sweeps.items()
            for quantity, values in (("accuracy", sweep.accuracy), ("loss", sweep.loss))
            for split in splits
        }

    def _checkpoint_file(self) -> Path:
        """``finetuned`` as an existing file.

        Raises:
            ConfigError: ``finetuned`` is empty or not a file (an MLflow reference reaches the workload
                only as the file the platform fetched).
        """
        ref = self.params["finetuned"]
        if not ref.strip():
            raise ConfigError(
                "finetuned is empty; give a checkpoint file, or in a study run:<run_id> or "
                "mlflow:<study>/<arm>[?param=value&...] (resolved at launch)"
            )
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"finetuned={ref!r} is not a file (run: and mlflow: references are fetched by the platform before "
                f"a study's trial builds this workload: flatlab.tracking.checkpoints)"
            )
        return path

    def _check_same_zero_shot(self, trial: Dict[str, Any]) -> None:
        spec = trial.get("spec") or {}
        if spec.get("workload") != ClipFinetune.name:
            return  # a plain file or a foreign run: only keys and shapes are checked
        theirs = resolve(ClipFinetune.hparams, spec.get("workload_params", {}), "fine-tuned trial", allow_extra=True)
        diff = [
            f"{k}: fine-tuned={theirs.get(k)!r}, here={self.params.get(k)!r}"
            for k in ZERO_SHOT_KEYS
            if theirs.get(k) != self.params.get(k)
        ]
        if diff:
            raise ConfigError(
                "the fine-tuned checkpoint started from another zero-shot model; interpolating would mix unrelated "
                "weights: " + "; ".join(diff)
            )

    def _sharpness_subset(self, split: Split, device: torch.device):
        """The fixed OOD subset (seed paper App. A): ``m`` examples chosen with ``sharpness_seed``, in
        batches of ``eval_batch_size``, on ``device``; and the loss on the split's logit columns."""
        p = self.params
        subset = measure_subset(split, p["sharpness_examples"], p["sharpness_seed"], p["eval_batch_size"], device)
        return subset, SubsetCrossEntropy(getattr(split, "classes", None))

    def _stragglers(self, model, ft, subset, loss_fn, groups, path: Path) -> Tuple[List[str], Dict[str, float]]:
        """Straggler groups of the fine-tuned model: layer-wise adaptive average sharpness with
        ``straggler_draws`` draws below ``straggler_threshold`` (seed paper Algorithm 1, step 1).
        Memoised per process (every alpha of one model shares them)."""
        p = self.params
        key = (
            str(path.resolve()),
            p["straggler_draws"],
            p["sharpness_rho"],
            p["straggler_threshold"],
            p["sharpness_seed"],
            subset.m,
            self.clip_spec().cache_key(),
        )
        with _STRAGGLER_LOCK:
            if key in _STRAGGLERS:
                return _STRAGGLERS[key]
        original = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            model.load_state_dict(ft)
            values = layerwise_sharpness(
                model,
                subset,
                groups,
                rho=p["sharpness_rho"],
                n_draws=p["straggler_draws"],
                seed=p["sharpness_seed"],
                loss_fn=loss_fn,
            )
        finally:
            model.load_state_dict(original)
        result = (find_stragglers(values, threshold=p["straggler_threshold"]), {g: e.value for g, e in values.items()})
        with _STRAGGLER_LOCK:
            _STRAGGLERS[key] = result
            while len(_STRAGGLERS) > 16:
                _STRAGGLERS.popitem(last=False)
        return result

    def _sharpness(self, model, zs, ft, subset, loss_fn) -> Dict[str, float]:
        """Adaptive average sharpness (seed paper App. A) of ``model`` (holding theta_alpha), general and
        (optionally) per layer.

        The general value is the measures registry's ``avg_sharpness`` (:func:`flatlab.sharpness.compute_measures`,
        the same measure every study's ``measures=`` runs, under its own metric names). The per-layer values
        are the same estimator on one group: with ``layer_sharpness=finetuned`` the fine-tuned model's
        layer perturbed, then interpolated (§3.1, :func:`~flatlab.interpolation.finetuned_layer_sharpness`),
        with ``interpolated`` theta_alpha's layer (:func:`flatlab.sharpness.layerwise_sharpness`).
        """
        p = self.params
        measure = {"avg_sharpness": {"rho": p["sharpness_rho"], "draws": p["sharpness_draws"], "adaptive": True}}
        flat = compute_measures(model, subset, loss_fn, measure, seed=p["sharpness_seed"])
        out = {k: flat[k] for k in ("flat/avg_sharpness", "flat/avg_sharpness_clean")}
        out["flat/avg_sharpness_stderr"] = flat.get("flat/avg_sharpness_stderr", 0.0)  # absent with one draw
        if not p["sharpness_layerwise"]:
            return out
        kw = dict(rho=p["sharpness_rho"], n_draws=p["sharpness_draws"], seed=p["sharpness_seed"], loss_fn=loss_fn)
        if p["layer_sharpness"] == "finetuned":
            groups = group_parameters(model, "clip")
            values = finetuned_layer_sharpness(model, zs, ft, p["alpha"], subset, groups, **kw)
            out.update({f"flat/layer_sharpness/{g}": est.value for g, est in values.items()})
        else:
            values = layerwise_sharpness(model, subset, "clip", **kw)
            out.update({f"flat/layer_sharpness_interpolated/{g}": est.value for g, est in values.items()})
        return out


def producing_trial(path: Path) -> Dict[str, Any]:
    """The record (``trial.json``) of the trial that wrote the checkpoint file ``path``, when ``path`` lies in
    a trial's artifact layout: ``<run>/model/model.safetensors`` beside ``<run>/trial.json``, as flatlab
    uploads a trial's model and as :func:`flatlab.tracking.checkpoints.fetch_run` stores one it fetches;
    ``{}`` for any other file or an unreadable record."""
    record = path.parent.parent / "trial.json"
    if path.parent.name != "model" or not record.is_file():
        return {}
    try:
        trial = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return trial if isinstance(trial, dict) else {}
