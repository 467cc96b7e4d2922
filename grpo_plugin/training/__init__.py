"""The trainer: `GRPOTrainer` (`trainer.py`, orchestration only) and what only it uses: the loss
after the forward, where a rollout comes from, the inputs checked once, the loaders, callbacks,
metrics and progress, and its hooks into the run folder (`run_hooks.py`)."""
