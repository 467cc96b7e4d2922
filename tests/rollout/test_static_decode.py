"""Tests for grpo_plugin.rollout.static_decode: the static-cache (and compiled) decode loop gives
the dynamic loop's tokens, and reads back to the host only at its checks."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.engine import decode
from grpo_plugin.engine.decode import DecodeSettings
from grpo_plugin.rollout import generation
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams


def _prompts(tok) -> list[list[int]]:
    return [tok("12+3=")["input_ids"], tok("a longer prompt: 7*8=")["input_ids"], [5]]


def _request(
    engine: DecodeSettings, eos: list[int], steps: int = 10, **sampling
) -> GenerationRequest:
    noise = KeyedNoise.for_prompts(RolloutKey(3, 0), range(3), 4, steps)
    return GenerationRequest(
        SamplingParams(max_new_tokens=steps, **sampling),
        num_generations=4,
        eos_token_ids=eos,
        pad_token_id=0,
        noise=noise,
        record_logprobs=True,
        engine=engine,
    )


def _early_eos(model, prompts) -> int:
    """A token some rows sample early and others late or never: rows end at different steps."""
    free = generate_groups(model, prompts, _request(DecodeSettings(), [2]))
    counts = torch.bincount(free.completion_ids[:, :4].flatten())
    return int(counts.argmax())


def _assert_same(a, b) -> None:
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.is_truncated, b.is_truncated)
    assert a.num_generated_tokens == b.num_generated_tokens
    torch.testing.assert_close(a.sampling_logps, b.sampling_logps, atol=1e-5, rtol=0)
    assert not a.sampling_logps[a.completion_mask == 0].any()  # 0 past a row's end


@pytest.mark.parametrize("check_every", [1, 3, 16])
def test_static_cache_gives_the_dynamic_loops_tokens(tiny_tokenizer, tiny_model, check_every):
    prompts = _prompts(tiny_tokenizer)
    eos = [2, _early_eos(tiny_model, prompts)]
    dynamic = generate_groups(tiny_model, prompts, _request(DecodeSettings(), eos))
    lengths = dynamic.completion_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows really end at different steps
    engine = DecodeSettings(static_cache=True, check_every=check_every)
    static = generate_groups(tiny_model, prompts, _request(engine, eos))
    _assert_same(static, dynamic)  # trimmed to the last row's end, whatever the check interval


def test_static_cache_with_penalty_top_k_and_lora(tiny_tokenizer, tiny_model):
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    prompts = _prompts(tiny_tokenizer)
    settings = {"repetition_penalty": 1.3, "top_k": 20, "temperature": 0.8}
    eos = [2, _early_eos(policy, prompts)]
    dynamic = generate_groups(policy, prompts, _request(DecodeSettings(), eos, **settings))
    static = generate_groups(
        policy, prompts, _request(DecodeSettings(static_cache=True), eos, **settings)
    )
    _assert_same(static, dynamic)


def test_static_width_rounds_prompt_plus_budget_up_to_the_bucket():
    assert decode.WIDTH_BUCKET == 64
    assert decode.static_width(39, 24) == 64
    assert decode.static_width(40, 24) == 64
    assert decode.static_width(41, 24) == 128
    assert decode.static_width(700, 64) == 768


def test_the_loop_reads_the_host_only_at_its_checks(tiny_tokenizer, tiny_model, monkeypatch):
    """Greedy, no filters, 12 steps, no row ends: with check_every=5 the loop reads back at
    steps 5 and 10, plus the one read that trims the columns after it: 3 reads in all."""
    reads = []
    for name in ("__bool__", "__int__", "item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    prompts = _prompts(tiny_tokenizer)
    engine = DecodeSettings(static_cache=True, check_every=5)
    decoded = {}

    def spy(*args, **kwargs):
        reads.clear()
        decoded["out"] = original_decode(*args, **kwargs)
        decoded["reads"] = list(reads)
        return decoded["out"]

    original_decode = generation.decode_static
    monkeypatch.setattr(generation, "decode_static", spy)
    never = len(tiny_tokenizer) + 7  # an end id no row samples
    request = _request(engine, [never], steps=12, temperature=0.0)
    batch = generate_groups(tiny_model, prompts, request)
    assert batch.completion_ids.shape[1] == 12 and bool(batch.is_truncated.all())
    assert decoded["reads"] == ["__bool__", "__bool__", "__int__"]


def test_a_cache_that_cannot_be_static_falls_back_with_one_warning(
    tiny_tokenizer, tiny_model, monkeypatch, caplog
):
    monkeypatch.setattr(decode, "static_cache_from", lambda *a: None)
    prompts = _prompts(tiny_tokenizer)
    dynamic = generate_groups(tiny_model, prompts, _request(DecodeSettings(), [2]))
    with caplog.at_level("WARNING"):
        fallback = generate_groups(
            tiny_model, prompts, _request(DecodeSettings(static_cache=True), [2])
        )
    _assert_same(fallback, dynamic)
    assert "decoding with the dynamic cache instead" in caplog.text


def test_engine_settings_are_checked():
    with pytest.raises(ValueError, match="check_every must be >= 0"):
        DecodeSettings(check_every=-1)
    assert DecodeSettings(compile=True).static  # compiling implies the static cache
    assert not DecodeSettings().static


@pytest.mark.slow
def test_the_compiled_step_samples_the_same_tokens(tiny_tokenizer, tiny_model, caplog):
    caplog.set_level("INFO", logger="grpo_plugin.engine.decode")
    prompts = _prompts(tiny_tokenizer)
    eos = [2, _early_eos(tiny_model, prompts)]
    dynamic = generate_groups(tiny_model, prompts, _request(DecodeSettings(), eos))
    compiled = generate_groups(tiny_model, prompts, _request(DecodeSettings(compile=True), eos))
    assert torch.equal(compiled.completion_ids, dynamic.completion_ids)
    assert torch.equal(compiled.completion_mask, dynamic.completion_mask)
    torch.testing.assert_close(compiled.sampling_logps, dynamic.sampling_logps, atol=1e-4, rtol=0)
    said = [r.getMessage() for r in caplog.records if r.name == "grpo_plugin.engine.decode"]
    assert len([m for m in said if "compilation included" in m]) == 1  # its one-time cost
