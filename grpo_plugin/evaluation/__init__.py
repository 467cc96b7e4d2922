"""Evaluation: the one evaluator (`evaluator.py`: during training, before/after a recipe,
`grpo-plugin eval`), its setup checks, the watch (best step, reward-hacking alarm) and the
held-out curve."""
