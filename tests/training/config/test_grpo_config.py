"""GRPOConfig: TRL names, our defaults, and contradictions rejected with the fix in the message."""

import pytest
import torch

from grpo_plugin import GRPOConfig


def make(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 defaults to True on a bf16 GPU")
def test_defaults_fit_a_cpu(tmp_path):
    c = make(tmp_path)
    assert c.bf16 is False and c.gradient_checkpointing is False
    assert c.loss_type == "dapo" and c.num_generations == 8 and c.beta == 0.0
    assert c.learning_rate == 1e-5 and c.share_prompt_prefix is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 runs on the GPU there")
def test_bf16_on_a_cpu_runs_there_and_warns_where_it_is_emulated(tmp_path, monkeypatch, caplog):
    from grpo_plugin.training.config import grpo_config as config_module

    c = make(tmp_path, bf16=True)  # transformers alone: "Your setup doesn't support bf16/gpu"
    assert c.bf16 is True and c.use_cpu is True
    monkeypatch.setattr(config_module, "cpu_has_bf16_units", lambda: False)
    with caplog.at_level("WARNING"):
        make(tmp_path, bf16=True)
    assert "without AVX512-BF16 or AMX" in caplog.text


def test_generation_batch_is_derived_like_trl(tmp_path):
    c = make(tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    assert (c.steps_per_generation, c.generation_batch_size, c.prompts_per_generation) == (2, 16, 2)
    c = make(tmp_path, per_device_train_batch_size=8, generation_batch_size=32)
    assert c.steps_per_generation == 4 and c.needs_old_logps  # 4 slices, 1 accumulation step


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"num_generations": 1}, "at least 2"),
        ({"per_device_train_batch_size": 12}, "not divisible by num_generations=8"),
        ({"loss_type": "ppo"}, "loss_type must be one of 'grpo', 'dapo'"),
        ({"importance_sampling_level": "seq"}, "importance_sampling_level"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator='ppo'"),
        ({"scale_rewards": "max"}, "scale_rewards"),
        ({"epsilon": 1.5}, r"epsilon=1.5 \(the lower clip epsilon\) must be in \(0, 1\)"),
        ({"epsilon_high": 0.0}, "epsilon_high"),
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_iterations": 0}, "num_iterations"),
        ({"generation_batch_size": 16, "steps_per_generation": 2}, "not both"),
        ({"auto_batch_memory_gb": 0.0}, "auto_batch_memory_gb=0.0 must be > 0"),
    ],
)
def test_contradictions_are_rejected(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kw)


@pytest.mark.parametrize(
    "scale, estimator, expected",
    [("group", None, "grpo"), ("batch", None, "batch"), ("none", None, "dr_grpo"),
     (False, None, "dr_grpo"), ("group", "rloo", "rloo")],
)  # fmt: skip
def test_advantage_estimator_overrides_scale_rewards(tmp_path, scale, estimator, expected):
    assert make(tmp_path, scale_rewards=scale, advantage_estimator=estimator).estimator == expected


def test_every_field_has_help():
    from dataclasses import fields

    from grpo_plugin.training.config.trl_fields import TRLArguments

    names = set(GRPOConfig.__annotations__) | set(TRLArguments.__annotations__)
    own = [f for f in fields(GRPOConfig) if f.name in names]
    assert own and all(f.metadata.get("help") for f in own)
