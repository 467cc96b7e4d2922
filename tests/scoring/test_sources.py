"""The run's reward sources: the weights are checked before anything is loaded."""

from __future__ import annotations

import pytest
from conftest import SEVEN_DATA, char_codes, frac_sevens, tiny_config

from grpo_plugin import GRPOTrainer


def test_all_zero_weights_are_refused_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    # issue 45: with every weight 0 every advantage is 0 and nothing is learned, silently
    def no_load(*args, **kwargs):
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr("grpo_plugin.training.trainer.load_trainer_policy", no_load)
    args = tiny_config(tmp_path, reward_weights=[0.0, 0.0])
    with pytest.raises(ValueError, match=r"reward_weights=\[0.0, 0.0\] are all 0"):
        GRPOTrainer(str(tiny_model_dir), [char_codes, frac_sevens], args=args,
                    train_dataset=SEVEN_DATA)  # fmt: skip
