"""Publishing a run: the model card, its evaluation section, the reward plot and the Hub upload.
Used by `GRPOTrainer.push_to_hub` and by `grpo-plugin publish`."""
