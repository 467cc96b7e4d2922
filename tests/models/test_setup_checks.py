"""The policy's setup, checked before it loads: the LoRA numbers and a rollout copy against the
load to come (issue 45: each failed only once the model had loaded)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import SEVEN_DATA, frac_sevens, tiny_config
from peft import LoraConfig

from grpo_plugin import GRPOTrainer
from grpo_plugin.models.policy import model_init_kwargs
from grpo_plugin.models.setup_checks import (
    check_against_model_config,
    check_copy_setup,
    check_lora,
    check_reference_setup,
)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"r": 0}, "lora: r=0 must be a positive integer"),
        ({"r": -2}, "lora: r=-2 must be a positive integer"),
        ({"r": 4, "lora_alpha": 0}, "lora_alpha=0 scales every adapter's output to 0"),
        ({"r": 4, "lora_alpha": float("nan")}, "lora_alpha=nan must be a finite number"),
        ({"r": 4, "lora_dropout": 1.0}, r"lora_dropout=1.0 must be in \[0, 1\)"),
        ({"r": 4, "bias": "nosuch"}, "lora: bias='nosuch' is not supported"),
        ({"r": 4, "init_lora_weights": "nosuch"}, "init_lora_weights='nosuch' is not one peft"),
    ],
)
def test_lora_numbers_peft_checks_only_after_the_load(kwargs, expected):
    with pytest.raises(ValueError, match=expected):
        check_lora(LoraConfig(**kwargs))
    check_lora(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1))  # a good one passes


@pytest.mark.parametrize(
    ("lora", "expected"),
    [
        ({"rr": 8}, "unknown lora key 'rr'; did you mean 'r'? (the keys are peft.LoraConfig's"),
        ({"r": 8, "target_module": "all-linear"}, "did you mean 'target_modules'?"),
        ({"zzz": 1}, "unknown lora key 'zzz' (the keys"),
    ],
)
def test_an_unknown_lora_key_gets_the_closest_one(lora, expected):
    """Issue 56: `--lora.rr 8` was peft's raw TypeError, without the recipe keys' hint."""
    from grpo_plugin.models.policy import lora_config

    with pytest.raises(ValueError, match=re.escape(expected)):
        lora_config(lora)
    assert lora_config({"r": 8, "lora_alpha": 16}).r == 8  # known keys pass


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


def test_a_reference_sync_with_a_lora_policy_is_refused(tmp_path):
    args = tiny_config(tmp_path, beta=0.04, sync_ref_model=True)
    with pytest.raises(ValueError, match="sync_ref_model=True needs a separate reference model"):
        check_reference_setup(args, LoraConfig(r=4))
    check_reference_setup(args, None)  # full fine-tuning keeps a reference of its own


def test_what_the_model_config_decides(tiny_model_dir, tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)  # a tiny Llama: no router
    kw, args = model_init_kwargs({}), tiny_config(tmp_path)
    moe = tiny_config(tmp_path, router_aux_loss_coef=0.5)
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.5 is set but this llama model"):
        check_against_model_config(moe, None, config, kw)
    with pytest.raises(ValueError, match=r"target_modules=\['nosuch'\] match no module"):
        check_against_model_config(args, LoraConfig(r=4, target_modules=["nosuch"]), config, kw)
    check_against_model_config(args, LoraConfig(r=4, target_modules=["q_proj"]), config, kw)
    head = LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    check_against_model_config(args, head, config, kw)  # an adapter on the head: allowed
    fp32_head = tiny_config(tmp_path, cast_lm_head_to_fp32=True)
    with pytest.raises(ValueError, match="cast_lm_head_to_fp32=True is not supported with a LoRA"):
        check_against_model_config(fp32_head, head, config, kw)
    # model_init_kwargs the model refuses: from_pretrained failed on them after reading the weights
    bad = model_init_kwargs({"attn_implementation": "nosuch"})
    with pytest.raises(ValueError, match=r"model_init_kwargs \['attn_implementation'\]: Spec"):
        check_against_model_config(args, None, config, bad)
    with pytest.raises(ValueError, match="unexpected keyword argument 'foo'"):
        check_against_model_config(args, None, config, model_init_kwargs({"foo": 1}))
    good = model_init_kwargs({"attn_implementation": "eager", "use_cache": False})
    check_against_model_config(args, None, config, good)  # a config attribute is set, not passed


def test_bf16_training_the_load_cannot_take_is_refused(tmp_path, monkeypatch):
    from grpo_plugin.models.setup_checks import check_train_precision_setup

    monkeypatch.setattr("grpo_plugin.config.field_checks.cpu_has_bf16_units", lambda: True)
    args, plain, lora = (
        tiny_config(tmp_path, train_precision="bf16"),
        model_init_kwargs({}),
        LoraConfig(r=4),
    )
    with pytest.raises(ValueError, match="train_precision='bf16' without a LoRA adapter"):
        check_train_precision_setup(args, None, plain)
    with pytest.raises(ValueError, match="with a quantized base"):
        check_train_precision_setup(args, lora, model_init_kwargs({}, load_in_4bit=True))
    with pytest.raises(ValueError, match="model_init_kwargs dtype=torch.bfloat16"):
        check_train_precision_setup(args, lora, model_init_kwargs({"dtype": "bfloat16"}))
    with pytest.raises(ValueError, match="lora_dropout > 0 or a LoRA variant"):
        check_train_precision_setup(args, LoraConfig(r=4, lora_dropout=0.05), plain)
    check_train_precision_setup(args, lora, plain)  # a plain LoRA over float32 weights
    for precision in (None, "fp32"):  # never refused: None falls back to fp32 itself
        check_train_precision_setup(tiny_config(tmp_path, train_precision=precision), None, plain)
