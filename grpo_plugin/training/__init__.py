"""The training layer: `GRPOTrainer` and its glue (config, policy loading, scoring, metrics, the run dir)."""
