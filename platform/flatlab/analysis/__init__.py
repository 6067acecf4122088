"""Statistics over a study's trials, from plain typed samples (no MLflow, Ray or Optuna inside)."""
