"""The policy's setup, checked before it loads: the LoRA numbers and a rollout copy against the
load to come (issue 45: each failed only once the model had loaded)."""

from __future__ import annotations

import pytest
import torch
from conftest import SEVEN_DATA, frac_sevens, tiny_config
from peft import LoraConfig

from grpo_plugin import GRPOTrainer
from grpo_plugin.training.model_checks import check_copy_setup, check_lora
from grpo_plugin.training.policy import model_init_kwargs


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"r": 0}, "lora: r=0 must be a positive integer"),
        ({"r": -2}, "lora: r=-2 must be a positive integer"),
        ({"r": 4, "lora_alpha": 0}, "lora_alpha=0 scales every adapter's output to 0"),
        ({"r": 4, "lora_alpha": float("nan")}, "lora_alpha=nan must be a finite number"),
        ({"r": 4, "lora_dropout": 1.0}, r"lora_dropout=1.0 must be in \[0, 1\)"),
    ],
)
def test_lora_numbers_peft_checks_only_after_the_load(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        check_lora(LoraConfig(**kwargs))
    check_lora(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1))  # a good one passes


def _args(tmp_path, precision, **kw):
    return tiny_config(tmp_path, rollout_precision=precision, **kw)


def test_a_rollout_copy_the_load_cannot_have_is_refused(tmp_path, monkeypatch):
    four_bit = model_init_kwargs({}, load_in_4bit=True)
    with pytest.raises(ValueError, match="'bf16' with a quantized base"):
        check_copy_setup(_args(tmp_path, "bf16"), None, four_bit)
    dora = LoraConfig(r=4, use_dora=True)
    with pytest.raises(ValueError, match=r"'fp16' with a LoRA variant \(use_dora\)"):
        check_copy_setup(_args(tmp_path, "fp16"), dora, model_init_kwargs({}))
    bf16_weights = model_init_kwargs({"dtype": "bfloat16"})
    with pytest.raises(ValueError, match="'bf16' with the policy loaded in bfloat16"):
        check_copy_setup(_args(tmp_path, "bf16"), None, bf16_weights)
    check_copy_setup(_args(tmp_path, "fp16"), None, bf16_weights)  # fp16 from bf16: allowed
    for precision in ("policy", "auto"):  # never refused: 'auto' picks 'policy' itself
        check_copy_setup(_args(tmp_path, precision), dora, four_bit)
    fp16, plain = _args(tmp_path, "fp16"), model_init_kwargs({})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the policy would be on a GPU
    with pytest.raises(ValueError, match="'fp16' with the policy on cuda"):
        check_copy_setup(fp16, None, plain)


@pytest.mark.parametrize(
    ("peft", "precision", "expected"),
    [
        (LoraConfig(r=0), "policy", "lora: r=0 must be a positive integer"),
        (LoraConfig(r=4, use_dora=True), "bf16", r"with a LoRA variant \(use_dora\)"),
    ],
)
def test_the_trainer_refuses_them_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, peft, precision, expected
):
    def no_load(*args, **kwargs):
        raise AssertionError("the policy was loaded")

    monkeypatch.setattr("grpo_plugin.training.trainer.load_trainer_policy", no_load)
    with pytest.raises(ValueError, match=expected):
        GRPOTrainer(str(tiny_model_dir), frac_sevens, args=_args(tmp_path, precision),
                    train_dataset=SEVEN_DATA, peft_config=peft)  # fmt: skip
