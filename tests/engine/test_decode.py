"""The engine's decode levers (engine/decode.py): each is admitted once per model by a check
against the dynamic, every-row path, and a lever whose check fails is turned off with one warning
and the rollout comes out as the reference path's."""

from __future__ import annotations

import pytest
import torch

from grpo_plugin.engine import decode
from grpo_plugin.engine.decode import DecodeSettings
from grpo_plugin.engine.levers import verdict
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams
from tests.conftest import make_tiny_model

LEVER_LOG = "grpo_plugin.engine.levers"


def _request(settings: DecodeSettings, share: bool = True) -> GenerationRequest:
    return GenerationRequest(
        SamplingParams(max_new_tokens=8),
        num_generations=3,
        eos_token_ids=[2],
        pad_token_id=0,
        noise=KeyedNoise.for_prompts(RolloutKey(5, 0), range(2), 3, 8),
        share_prompt_prefix=share,
        engine=settings,
    )


def _prompts(tok) -> list[list[int]]:
    return [tok("12+3=")["input_ids"], tok("a longer prompt: 7*8=")["input_ids"]]


def _same(a, b) -> None:
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)


def test_the_shared_prefill_is_admitted_once_and_prefills_each_prompt_once(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    shared = generate_groups(model, prompts, _request(DecodeSettings()))
    assert verdict("shared_prefill", model) is True
    assert shared.num_prefill_tokens == sum(len(p) for p in prompts)  # each prompt once
    every_row = generate_groups(model, prompts, _request(DecodeSettings(shared_prefill=False)))
    assert every_row.num_prefill_tokens == 3 * sum(len(p) for p in prompts)
    _same(shared, every_row)


def test_a_shared_prefill_that_differs_is_turned_off_and_every_row_is_prefilled(
    tiny_tokenizer, monkeypatch, caplog
):
    """A cache expansion that scrambles the rows (here: the wrong logits for the group): the
    check sees it, the lever turns off, the rollout is the every-row prefill's."""
    model = make_tiny_model(tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    reference = generate_groups(model, prompts, _request(DecodeSettings(shared_prefill=False)))
    original = decode.Decoder.__call__

    def skewed(self, ids, mask, positions, cache=None):
        logits, cache = original(self, ids, mask, positions, cache)
        return (logits + 1.0 if ids.shape[0] == len(prompts) else logits), cache

    monkeypatch.setattr(decode.Decoder, "__call__", skewed)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    out = generate_groups(model, prompts, _request(DecodeSettings()))
    assert verdict("shared_prefill", model) is False
    assert "fast path 'shared_prefill' turned off" in caplog.text
    assert out.num_prefill_tokens == reference.num_prefill_tokens
    _same(out, reference)


@pytest.mark.parametrize("lever", ["static_decode"])
def test_the_static_decoder_is_admitted_against_the_dynamic_step(tiny_tokenizer, lever):
    model = make_tiny_model(tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    dynamic = generate_groups(model, prompts, _request(DecodeSettings()))
    static = generate_groups(model, prompts, _request(DecodeSettings(static_cache=True)))
    assert verdict(lever, model) is True
    _same(static, dynamic)


def test_a_static_step_that_differs_is_turned_off_and_the_dynamic_loop_runs(
    tiny_tokenizer, monkeypatch, caplog
):
    model = make_tiny_model(tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    dynamic = generate_groups(model, prompts, _request(DecodeSettings()))
    calls = []
    original = decode._decode_step

    def wrong(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs) * 1.5  # a static step that computes something else

    monkeypatch.setattr(decode, "_decode_step", wrong)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    out = generate_groups(model, prompts, _request(DecodeSettings(static_cache=True)))
    assert verdict("static_decode", model) is False and calls == [1]  # the check's step only
    assert "fast path 'static_decode' turned off" in caplog.text
    _same(out, dynamic)
