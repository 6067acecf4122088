"""MLflow tracking: run layout, the batched driver-side logger, worker artifacts and result queries."""
