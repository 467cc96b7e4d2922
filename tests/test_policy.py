"""Policy wrapping and the reference policy: adapter-off for LoRA, a frozen copy for full FT."""

import copy

import pytest
import torch
from conftest import make_tiny_model
from peft import LoraConfig

from grpo_plugin import GRPOConfig
from grpo_plugin.logprobs import completion_logprobs
from grpo_plugin.policy import build_reference, reference_mode, wrap_policy


def logps(model, prompt, completion):
    pm, cm = torch.ones_like(prompt), torch.ones_like(completion)
    with torch.no_grad():
        return completion_logprobs(model, prompt, pm, completion, cm)[0]


def test_reference_is_the_base_model_with_the_adapter_off(tiny_tokenizer, tmp_path):
    base = make_tiny_model(tiny_tokenizer)
    untouched = copy.deepcopy(base)
    args = GRPOConfig(output_dir=str(tmp_path), beta=0.04)
    policy = wrap_policy(base, LoraConfig(r=4, target_modules="all-linear"), args)
    with torch.no_grad():  # make the adapter matter
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert build_reference(policy, beta=0.04) is None  # no second copy for LoRA
    prompt, completion = torch.tensor([[5, 6, 7, 8]] * 2), torch.tensor([[9, 10, 11]] * 2)
    expected = logps(untouched, prompt, completion)
    assert (logps(policy, prompt, completion) - expected).abs().max() > 1e-2
    with reference_mode(policy, None) as ref:
        torch.testing.assert_close(logps(ref, prompt, completion), expected, atol=1e-6, rtol=0)
    # the adapter is back on afterwards
    assert (logps(policy, prompt, completion) - expected).abs().max() > 1e-2


def test_full_finetuning_gets_a_frozen_copy(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    assert build_reference(model, beta=0.0) is None  # beta == 0: no reference at all
    ref = build_reference(model, beta=0.1)
    assert ref is not model and not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not torch.equal(next(model.parameters()), next(ref.parameters()))


def test_quantized_model_without_adapter_is_refused(tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer)
    model.is_loaded_in_4bit = True  # what transformers sets on a bitsandbytes model
    with pytest.raises(ValueError, match="pass a peft_config"):
        wrap_policy(model, None, GRPOConfig(output_dir=str(tmp_path)))
