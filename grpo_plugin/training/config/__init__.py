"""`GRPOConfig`: TRL's GRPO options (same names, same meanings) plus grpo-plugin's own."""
