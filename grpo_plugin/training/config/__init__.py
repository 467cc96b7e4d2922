"""`GRPOConfig`: TRL's GRPO options (same names, same meanings) plus grpo-plugin's own, in one
dataclass grouped by concern (`grpo_config.py`); its checks, by the same concerns, in `checks.py`."""

from .grpo_config import SECRET_FIELDS, GRPOConfig

__all__ = ["SECRET_FIELDS", "GRPOConfig"]
