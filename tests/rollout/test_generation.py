"""Tests for grpo_plugin.rollout: group sampling with a shared prompt prefix."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.sampler import (
    apply_repetition_penalty,
    filter_top_k_top_p,
    sample_inverse_cdf,
)
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams

SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty")

UNUSED_EOS = 2  # the tiny tokenizer's </s>; random tiny models rarely emit it


def _prompts(tok) -> list[list[int]]:
    return [tok("12+3=")["input_ids"], tok("a longer prompt: 7*8=")["input_ids"], [5]]


def _generate(model, prompts, **overrides):
    sampling = {"max_new_tokens": 10}
    sampling.update({k: v for k, v in overrides.items() if k in SAMPLING_FIELDS})
    kwargs = dict(
        num_generations=4,
        eos_token_ids=[UNUSED_EOS],
        pad_token_id=0,
        generator=torch.Generator().manual_seed(7),
    )
    kwargs.update({k: v for k, v in overrides.items() if k not in SAMPLING_FIELDS})
    request = GenerationRequest(sampling=SamplingParams(**sampling), **kwargs)
    return generate_groups(model, prompts, request)


def _hf_greedy(model, batch, max_new_tokens, eos_ids):
    out = model.generate(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=0,
    )
    return out[:, batch.prompt_ids.size(1) :]


def test_shared_prefix_is_exact_and_prefills_each_prompt_once(tiny_tokenizer, tiny_model):
    prompts = _prompts(tiny_tokenizer)
    shared = _generate(tiny_model, prompts, share_prompt_prefix=True)
    plain = _generate(tiny_model, prompts, share_prompt_prefix=False)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)
    distinct_tokens = sum(len(p) for p in prompts)
    assert shared.num_prefill_tokens == distinct_tokens
    assert plain.num_prefill_tokens == 4 * distinct_tokens
    # rows of a group share the prompt but (with sampling) not the completion
    assert torch.equal(shared.prompt_ids[0], shared.prompt_ids[3])
    assert not torch.equal(shared.completion_ids[0], shared.completion_ids[1])
    logps = [
        completion_logprobs(
            tiny_model, (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
        ).logps
        for b in (shared, plain)
    ]
    torch.testing.assert_close(logps[0], logps[1], atol=5e-5, rtol=0)


def test_greedy_matches_hf_generate(tiny_tokenizer, tiny_model):
    prompts = _prompts(tiny_tokenizer)
    batch = _generate(tiny_model, prompts, num_generations=1, temperature=0.0, max_new_tokens=12)
    expected = _hf_greedy(tiny_model, batch, 12, [UNUSED_EOS])
    assert torch.equal(batch.completion_ids, expected)


def test_eos_masking_truncation_and_early_stop(tiny_tokenizer, tiny_model):
    prompts = _prompts(tiny_tokenizer)
    free = _generate(tiny_model, prompts, num_generations=1, temperature=0.0, max_new_tokens=12)
    row0 = free.completion_ids[0].tolist()
    eos = row0[3]  # make a token row 0 emits greedily act as EOS
    first = row0.index(eos)
    stopped = _generate(
        tiny_model, prompts, num_generations=1, temperature=0.0, max_new_tokens=12,
        eos_token_ids=[UNUSED_EOS, eos], pad_token_id=0,
    )  # fmt: skip
    for row, tokens in enumerate(free.completion_ids.tolist()):
        hit = tokens.index(eos) if eos in tokens else None
        mask = stopped.completion_mask[row].tolist()
        assert bool(stopped.is_truncated[row]) == (hit is None)
        if hit is None:
            assert sum(mask) == 12 and stopped.completion_ids[row].tolist() == tokens
        else:  # 1 up to and including the first EOS, pad after
            assert mask == [1] * (hit + 1) + [0] * (len(mask) - hit - 1)
            assert stopped.completion_ids[row, : hit + 1].tolist() == tokens[: hit + 1]
            assert set(stopped.completion_ids[row, hit + 1 :].tolist()) <= {0}
    assert stopped.completion_mask[0].sum() == first + 1
    assert stopped.num_generated_tokens == int(stopped.completion_mask.sum())
    if not stopped.is_truncated.any():  # the loop ends once every row is done
        assert stopped.completion_ids.size(1) == int(stopped.completion_mask.sum(1).max())


def test_any_eos_id_stops_and_loop_ends_when_all_rows_finish(tiny_tokenizer, tiny_model):
    free = _generate(tiny_model, [[5, 6]], num_generations=1, temperature=0.0, max_new_tokens=12)
    first_token = int(free.completion_ids[0, 0])
    batch = _generate(
        tiny_model, [[5, 6]], num_generations=3, temperature=0.0, max_new_tokens=12,
        eos_token_ids=[UNUSED_EOS, first_token],
    )  # fmt: skip
    assert batch.completion_ids.shape == (3, 1)
    assert batch.completion_mask.tolist() == [[1], [1], [1]]
    assert not batch.is_truncated.any()


def test_inverse_cdf_sampler_matches_probabilities_and_skips_zero_mass():
    probs = torch.tensor([0.1, 0.0, 0.2, 0.7])
    logits = probs.log().expand(20000, 4)
    uniforms = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(sample_inverse_cdf(logits, uniforms), minlength=4) / 20000
    assert counts[1] == 0
    torch.testing.assert_close(counts, probs, atol=0.015, rtol=0)
    edges = sample_inverse_cdf(probs.log().expand(3, 4), torch.tensor([0.0, 0.1001, 0.9999]))
    assert edges.tolist() == [0, 2, 3]


def test_top_k_top_p_filters_match_hand_values_and_hf():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = filter_top_k_top_p(logits, top_k=None, top_p=0.75).isfinite()
    assert kept.tolist() == [[True, True, False, False]]  # 0.05 + 0.15 <= 0.25 are dropped
    kept = filter_top_k_top_p(logits, top_k=3, top_p=1.0).isfinite()
    assert kept.tolist() == [[True, True, True, False]]
    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    expected = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(10)(None, scores.clone()))
    torch.testing.assert_close(filter_top_k_top_p(scores, 10, 0.8), expected)


def test_repetition_penalty_hand_values_and_hf():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]
    scores = torch.randn(2, 20, generator=torch.Generator().manual_seed(1))
    input_ids = torch.tensor([[3, 5, 5, 9], [0, 1, 2, 19]])
    seen = torch.zeros(2, 20, dtype=torch.bool).scatter(1, input_ids, True)
    expected = RepetitionPenaltyLogitsProcessor(1.3)(input_ids, scores.clone())
    torch.testing.assert_close(apply_repetition_penalty(scores, seen, 1.3), expected)


def test_repetition_penalty_changes_sampling_but_stays_shared_exact(tiny_tokenizer, tiny_model):
    prompts = _prompts(tiny_tokenizer)
    opts = dict(repetition_penalty=3.0, top_k=20, top_p=0.9, temperature=0.8)
    shared = _generate(tiny_model, prompts, **opts)
    plain = _generate(tiny_model, prompts, share_prompt_prefix=False, **opts)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    greedy = _generate(
        tiny_model, prompts, num_generations=1, temperature=0.0, repetition_penalty=1e3
    )
    for row, length in zip(greedy.completion_ids.tolist(), greedy.completion_mask.sum(1).tolist()):
        real = row[:length]  # a huge penalty forbids repeating any token
        assert len(set(real)) == len(real)


def test_mode_is_kept_and_outputs_can_enter_autograd(tiny_tokenizer, tiny_model):
    tiny_model.train()
    batch = _generate(tiny_model, _prompts(tiny_tokenizer))
    assert tiny_model.training
    assert not batch.completion_ids.is_inference()
    logps = completion_logprobs(
        tiny_model,
        (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask),
    ).logps
    logps.sum().backward()
    assert tiny_model.lm_head.weight.grad.abs().sum() > 0


def test_model_without_pad_token_uses_eos_for_padding(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    model.config.pad_token_id = None
    free = _generate(model, [[5, 6, 7], [8]], num_generations=1, temperature=0.0)
    eos = int(free.completion_ids[0, 1])
    batch = _generate(
        model,
        [[5, 6, 7], [8]],
        num_generations=1,
        temperature=0.0,
        eos_token_ids=[eos],
        pad_token_id=None,
    )
    assert batch.prompt_ids[1, 0] == eos  # left padding uses the eos id
    hit = batch.completion_ids[0].tolist().index(eos)
    assert batch.completion_mask[0].sum() == hit + 1  # padding with eos does not count as tokens


def test_lora_generation_shared_exact(tiny_tokenizer, tiny_model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(tiny_model, config).eval()
    prompts = _prompts(tiny_tokenizer)
    shared = _generate(model, prompts)
    plain = _generate(model, prompts, share_prompt_prefix=False)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    greedy = _generate(model, prompts, num_generations=1, temperature=0.0)
    with model.disable_adapter():
        base = _generate(model, prompts, num_generations=1, temperature=0.0)
    assert not torch.equal(greedy.completion_ids, base.completion_ids)  # the adapter is used


def test_4bit_generation_matches_hf_greedy_and_keeps_weights_trainable(
    tiny_tokenizer, tiny_model_dir
):
    from bitsandbytes.nn import Linear4bit
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, quantization_config=quant, device_map="cpu"
    )
    model.eval()
    prompts = _prompts(tiny_tokenizer)
    batch = _generate(model, prompts, num_generations=1, temperature=0.0, max_new_tokens=8)
    assert torch.equal(batch.completion_ids, _hf_greedy(model, batch, 8, [UNUSED_EOS]))
    sampled = _generate(model, prompts, num_generations=3)
    assert sampled.completion_ids.shape[0] == 9
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Linear4bit)
    # bitsandbytes' CPU inference repacking (no autograd) must not have kicked in
    assert not getattr(q_proj.weight.quant_state, "packing_format_for_cpu", False)


def test_invalid_arguments_raise_with_a_fix(tiny_model):
    with pytest.raises(ValueError, match="num_generations"):
        _generate(tiny_model, [[5]], num_generations=0)
    with pytest.raises(ValueError, match="non-empty"):
        _generate(tiny_model, [[5], []])
    with pytest.raises(ValueError, match="eos"):
        _generate(tiny_model, [[5]], eos_token_ids=[])
    with pytest.raises(ValueError, match="top_p"):
        _generate(tiny_model, [[5]], top_p=0.0)


def test_dropping_finished_rows_changes_nothing(tiny_tokenizer, tiny_model, monkeypatch):
    """Rows that hit EOS leave the decode batch; the tokens must be those of the full batch."""
    prompts = _prompts(tiny_tokenizer)
    free = _generate(tiny_model, prompts, num_generations=1, temperature=0.0)
    # An EOS id that some rows emit early and others late or never: rows finish at different steps.
    eos = int(free.completion_ids[0, 2])
    compactions = []
    monkeypatch.setattr(
        "grpo_plugin.engine.decode.can_drop_cache_rows",
        lambda c: compactions.append(1) or True,
    )
    compacted = _generate(
        tiny_model, prompts, num_generations=2, temperature=0.0, eos_token_ids=[eos]
    )
    lengths = compacted.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max() and compactions  # rows really were dropped
    monkeypatch.setattr("grpo_plugin.engine.decode.can_drop_cache_rows", lambda cache: False)
    full = _generate(tiny_model, prompts, num_generations=2, temperature=0.0, eos_token_ids=[eos])
    assert torch.equal(compacted.completion_ids, full.completion_ids)
    assert torch.equal(compacted.completion_mask, full.completion_mask)
    hf = _hf_greedy(tiny_model, compacted, 10, [eos])
    masked = hf[:, : compacted.completion_ids.size(1)] * compacted.completion_mask
    assert torch.equal(masked, compacted.completion_ids * compacted.completion_mask)


def test_the_prefill_keeps_its_last_position_as_a_contiguous_gather(tiny_tokenizer):
    """`last_position_to_keep`: an index tensor for a prefill (transformers gathers a contiguous
    `(B, 1, H)`, which torch multiplies as one matrix product), 1 for a decode step; the logits
    equal the sliced path's."""
    from grpo_plugin._compat import last_position_to_keep

    assert last_position_to_keep(1) == 1
    index = last_position_to_keep(7)
    assert isinstance(index, torch.Tensor) and index.tolist() == [6]
    model = make_tiny_model(tiny_tokenizer).eval()
    ids = torch.randint(3, 50, (2, 7))
    seen = []
    head = model.get_output_embeddings()
    hook = head.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    with torch.no_grad():
        sliced = model(input_ids=ids, logits_to_keep=1).logits
        gathered = model(input_ids=ids, logits_to_keep=index).logits
    hook.remove()
    assert seen == [False, True]  # the slice is a strided view; the gather is contiguous
    torch.testing.assert_close(gathered, sliced, rtol=1e-6, atol=1e-6)
