"""`GRPOConfig`: TRL's GRPO options (same names, same meanings) plus grpo-plugin's own, in one
dataclass grouped by concern (`grpo_config.py`); its checks, by the same concerns, in `field_checks.py`."""

from .grpo_config import GRPOConfig

__all__ = ["GRPOConfig"]
