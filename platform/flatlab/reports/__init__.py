"""What a launch reports once its trials ended, in one place: the post-study pipeline
(:mod:`~flatlab.reports.post_study`: the trials read once, each report computed by :mod:`flatlab.analysis`
and written to the launch's MLflow run through :mod:`flatlab.tracking`), the comparison and analysis
artifacts (:mod:`~flatlab.reports.publish`), steps to target (:mod:`~flatlab.reports.speedup`), the
published-curve comparison (:mod:`~flatlab.reports.published_runs`), the study report
(:mod:`~flatlab.reports.study_report`) and the reports a study declares (:mod:`~flatlab.reports.declared`).
It sits above ``tracking/`` and ``analysis/`` and below ``study/``, whose launch hands it a
:class:`~flatlab.reports.launched.Launched`."""
