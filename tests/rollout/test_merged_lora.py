"""Tests for grpo_plugin.rollout.merged_lora: decoding on W + s*BA without touching W."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model
from peft import LoraConfig, get_peft_model

from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.merged_lora import merged_lora_weights
from grpo_plugin.rollout.types import SamplingParams

UNUSED_EOS = 2


def _lora_model(tokenizer, **lora):
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                        **lora)  # fmt: skip
    return get_peft_model(make_tiny_model(tokenizer), config).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _sample(model, prompts, temperature=1.0):
    return generate_groups(model, prompts, SamplingParams(max_new_tokens=10, temperature=temperature),
                           num_generations=4, eos_token_ids=[UNUSED_EOS], pad_token_id=0,
                           generator=torch.Generator().manual_seed(5)).completion_ids  # fmt: skip


def test_merged_logits_match_the_adapter_and_the_base_is_restored_bit_for_bit(tiny_tokenizer):
    model = _lora_model(tiny_tokenizer)
    ids = torch.tensor([tiny_tokenizer("12+3=45")["input_ids"]])
    weights = {n: p for n, p in model.named_parameters()}
    values = {n: p.detach().clone() for n, p in weights.items()}
    expected = _logits(model, ids)
    with torch.no_grad():
        with model.disable_adapter():
            base_only = _logits(model, ids)
    assert (expected - base_only).abs().max() > 1e-3  # the adapter matters
    with merged_lora_weights(model) as merged:
        assert merged
        torch.testing.assert_close(_logits(model, ids), expected, atol=1e-5, rtol=0)
    after = dict(model.named_parameters())
    assert all(after[n] is weights[n] for n in weights)  # the same Parameter objects
    assert all(torch.equal(after[n], values[n]) for n in values)  # and the same bits
    assert torch.equal(_logits(model, ids), expected)  # the adapter branch is back on


def test_merged_decoding_samples_the_same_tokens(tiny_tokenizer):
    model = _lora_model(tiny_tokenizer)
    prompts = [tiny_tokenizer("12+3=")["input_ids"], tiny_tokenizer("a longer one: 7*8=")["input_ids"]]
    for temperature in (0.0, 1.0):
        adapter = _sample(model, prompts, temperature)
        with merged_lora_weights(model):
            merged = _sample(model, prompts, temperature)
        assert torch.equal(merged, adapter)


def test_weights_are_restored_when_the_block_raises(tiny_tokenizer):
    model = _lora_model(tiny_tokenizer)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    weight = q_proj.base_layer.weight
    with pytest.raises(RuntimeError, match="decode failed"):
        with merged_lora_weights(model):
            assert q_proj.base_layer.weight is not weight
            raise RuntimeError("decode failed")
    assert q_proj.base_layer.weight is weight
    assert not q_proj.disable_adapters  # the adapter is on again


@pytest.mark.parametrize("case", ["plain model", "dora"])
def test_what_is_not_plain_lora_decodes_through_the_adapter(tiny_tokenizer, case):
    if case == "plain model":
        model = make_tiny_model(tiny_tokenizer)
    else:
        model = _lora_model(tiny_tokenizer, use_dora=True)
    weights = {n: p for n, p in model.named_parameters()}
    with merged_lora_weights(model) as merged:
        assert merged is False
        assert all(p is weights[n] for n, p in model.named_parameters())
