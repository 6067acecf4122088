"""What a study's trials say, computed from one typed sample of them; nothing here reads or writes a store.

* :mod:`~flatlab.analysis.sample`: the typed sample (:class:`~flatlab.analysis.sample.Sample`), built once;
* :mod:`~flatlab.analysis.selection`: the one definition of completed, best configuration and reference arm;
* :mod:`~flatlab.analysis.compare`: the paper table (seeds, paired tests, Holm), its text and plots;
* :mod:`~flatlab.analysis.tunings`: the comparison with the tuning as the unit of replication, over
  :mod:`~flatlab.analysis.replication` (two-level intervals, variance shares) and
  :mod:`~flatlab.analysis.claims` (each claim tested at the level of the tuning: Holm, equivalence,
  heterogeneity), with :mod:`~flatlab.analysis.design` (power, detectable effect, the cheapest (S, m));
* :mod:`~flatlab.analysis.tuning_curves`: expected best of n trials, median tuning curves with bands;
* :mod:`~flatlab.analysis.correlation`: whether flatness predicts generalisation (Kendall's tau, Psi);
* :mod:`~flatlab.analysis.results` and :mod:`~flatlab.analysis.query`: the tables of ``flatlab results``;
* :mod:`~flatlab.analysis.curve_sets`, :mod:`~flatlab.analysis.published`: published curves, and flatlab's
  against them;
* :mod:`~flatlab.analysis.speedup`, :mod:`~flatlab.analysis.flatness_sweep`, :mod:`~flatlab.analysis.report`:
  steps to a target, TSAM's sigma sweep, the one-row-per-arm summary.

Reading trials from MLflow is :mod:`flatlab.tracking.trials`; logging these outputs is :mod:`flatlab.reports.publish`.
"""
