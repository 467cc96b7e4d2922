"""The rollout layer: sampling G completions per prompt, decoding them, and the rollout types (`types.py`)."""
