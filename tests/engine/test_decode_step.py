"""grpo_plugin.engine.decode_step: the lean decode step gives transformers' logits bit for bit
on the models it mirrors, proves it on each model's first step, and leaves every other model
(and any step it gets wrong) to transformers' forward."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny_model, make_tiny_tokenizer, sample_two_prompts
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from grpo_plugin._compat import cache_argument_name, output_cache, unwrap_peft
from grpo_plugin.engine import decode_step as module
from grpo_plugin.engine.decode_step import LeanDecodeStep
from grpo_plugin.engine.levers import Levers, verdict

pytestmark = pytest.mark.fast_paths  # asserts the fast path ran (or declined)


def _llama():
    return make_tiny_model(make_tiny_tokenizer(), initializer_range=0.2).eval()


def _qwen2(**options):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.2, **options,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()  # q/k/v with bias, as Qwen2's


def _reference(model):
    name = cache_argument_name(model)  # `cache` from transformers 5.24, `past_key_values` before

    def forward(ids, attention, positions, cache):
        out = model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
            **{name: cache},
        )  # fmt: skip
        return out.logits[:, -1, :].float()

    return forward


def _prefill(model, padded: bool):
    ids = torch.randint(5, 60, (3, 6))
    attention = torch.ones_like(ids)
    if padded:
        attention[0, :2] = 0  # row 0 is left-padded
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = output_cache(model(input_ids=ids, attention_mask=attention, position_ids=positions))
    return attention, cache


@pytest.mark.parametrize("build", [_llama, _qwen2], ids=["llama", "qwen2"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_the_lean_step_gives_transformers_logits_and_cache_bit_for_bit(build, padded):
    model = build()
    step = LeanDecodeStep.of(model)
    assert step is not None
    attention, lean_cache = _prefill(model, padded)
    hf_cache = copy.deepcopy(lean_cache)
    reference = _reference(model)
    token = torch.tensor([[7], [8], [9]])
    with torch.inference_mode():
        for _ in range(4):  # the first step checks itself, the rest run lean only
            attention = torch.cat([attention, torch.ones(3, 1, dtype=torch.long)], dim=1)
            positions = attention.sum(-1, keepdim=True) - 1  # (3, 1)
            lean = step(token, attention, positions, lean_cache, reference)
            expected = reference(token, attention, positions, hf_cache)
            assert torch.equal(lean, expected)
            token = expected.argmax(-1, keepdim=True)
    assert verdict("lean_decode", model) is True
    for ours, theirs in zip(lean_cache.layers, hf_cache.layers, strict=True):
        assert ours.keys.shape[2] == attention.shape[1]  # one column per step, no more
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


@pytest.mark.parametrize("breaks", ["differs", "raises"])
def test_a_step_that_is_not_exact_is_dropped_after_its_first_step(monkeypatch, breaks):
    model = _llama()
    if breaks == "differs":
        monkeypatch.setattr(module, "_rotate", lambda x, cos, sin: x * cos)  # no rotation
    else:
        monkeypatch.setattr(module, "_rotate", lambda *args: 1 / 0)
    step = LeanDecodeStep.of(model)
    attention, cache = _prefill(model, padded=True)
    hf_cache = copy.deepcopy(cache)
    calls = []
    reference = _reference(model)
    with torch.inference_mode():
        for _ in range(2):
            attention = torch.cat([attention, torch.ones(3, 1, dtype=torch.long)], dim=1)
            positions = attention.sum(-1, keepdim=True) - 1
            token = torch.tensor([[7], [8], [9]])
            logits = step(
                token, attention, positions, cache, lambda *a: calls.append(1) or reference(*a)
            )
            assert torch.equal(logits, reference(token, attention, positions, hf_cache))
    assert verdict("lean_decode", model) is False and len(calls) == 2  # the reference, both steps
    assert all(layer.keys.shape[2] == attention.shape[1] for layer in cache.layers)
    assert LeanDecodeStep.of(model) is None  # the verdict stays with the model


def _hooked():
    model = _llama()
    model.model.layers[1].mlp.register_forward_hook(lambda *args: None)
    return model


def _wrapped_forward():  # as accelerate wraps it in autocast under mixed precision
    model = _llama()
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    return model


def _lora_dropout_training():
    config = LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.1)
    return unwrap_peft(get_peft_model(_llama(), config).train())


def _eager():
    model = _llama()
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize(
    "build",
    [
        _hooked,
        _wrapped_forward,
        _lora_dropout_training,
        lambda: _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0),
        _eager,
    ],
    ids=[
        "a-hook-on-a-layer",
        "a-wrapped-forward",
        "live-lora-dropout",
        "sliding-window",
        "eager-attention",
    ],
)
def test_models_it_does_not_mirror_decode_through_transformers(build):
    assert LeanDecodeStep.of(build()) is None


def test_a_lora_policy_without_dropout_takes_it():
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    assert LeanDecodeStep.of(unwrap_peft(get_peft_model(_llama(), config))) is not None


def test_only_one_token_steps_on_a_plain_dynamic_cache_take_it():
    step = LeanDecodeStep.of(_llama())
    _, cache = _prefill(step.model, padded=False)
    assert step.takes(torch.ones(3, 1, dtype=torch.long), cache)
    assert not step.takes(torch.ones(3, 2, dtype=torch.long), cache)  # a block: a prefill
    assert not step.takes(torch.ones(3, 1, dtype=torch.long), DynamicCache())  # no layers yet


@pytest.mark.fast_paths
def test_the_decode_loop_samples_the_same_tokens_with_it_and_without():
    model, tokenizer = _llama(), make_tiny_tokenizer()
    lean = sample_two_prompts(model, tokenizer, Levers())
    assert verdict("lean_decode", model) is True  # it ran, and proved itself
    plain = sample_two_prompts(model, tokenizer, Levers.reference())
    assert torch.equal(lean.completion_ids, plain.completion_ids)
    assert torch.equal(lean.sampling_logps, plain.sampling_logps)
