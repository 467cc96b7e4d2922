"""Tests for grpo_plugin.logprobs: chunked completion log-probs and the prefix-shared forward."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import group_batch, pre_admitted

from grpo_plugin import _logging
from grpo_plugin.engine.forward import completion_logprobs

GROUP = 3


def _group_batch(prompt_lengths=(7, 3), width=6, real_lengths=None, seed=0):
    return group_batch(prompt_lengths, width, real_lengths, seed, group=GROUP)


def _naive(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0):
    """Full-logits reference: log_softmax(model(...).logits / T) gathered at completion tokens."""
    mask = torch.cat([prompt_mask, completion_mask], 1)
    logits = model(
        input_ids=torch.cat([prompt_ids, completion_ids], 1),
        attention_mask=mask,
        position_ids=(mask.cumsum(1) - 1).clamp(min=0),
    ).logits
    logits = logits[:, prompt_ids.size(1) - 1 : -1].float() / temperature  # (N, Tc, V)
    logp = logits.log_softmax(-1)
    token_logp = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp * completion_mask, entropy * completion_mask


def _lora(model, seed=0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(
        seed
    )  # init_lora_weights=False: B is random too, so every LoRA matrix gets grads
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.0)
    return get_peft_model(model, config)


def _logps_and_lora_grads(model, batch, share):
    model.zero_grad()
    logps = completion_logprobs(
        model, batch, chunk_size=5, group_size=GROUP, share_prompt_prefix=share
    ).logps
    (logps * torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logps.detach(), grads


def _assert_grads_close(plain, shared, rel=1e-4):
    assert plain.keys() == shared.keys() and len(plain) > 0
    for name, grad in plain.items():
        assert grad.norm() > 0, name
        assert (grad - shared[name]).norm() / grad.norm() < rel, name


@pytest.mark.parametrize("chunk_size", [1, 7, 1024])
def test_chunked_logprobs_equal_naive_full_logits(tiny_model, chunk_size):
    batch = _group_batch()
    with torch.no_grad():
        logps, entropy, aux = completion_logprobs(
            tiny_model, batch, temperature=0.7, chunk_size=chunk_size, return_entropy=True
        )
        assert aux is None  # not asked for
        expected, expected_entropy = _naive(tiny_model, *batch, temperature=0.7)
    assert logps.dtype == torch.float32 and logps.shape == batch[2].shape
    torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=0)
    assert not entropy.requires_grad


def test_padding_is_trimmed_and_padded_back_with_zeros(tiny_model):
    prompts, prompt_mask, completions, completion_mask = _group_batch(width=4)
    padded = (
        torch.nn.functional.pad(prompts, (5, 0)),  # 5 all-pad prompt columns on the left
        torch.nn.functional.pad(prompt_mask, (5, 0)),
        torch.nn.functional.pad(completions, (0, 3)),  # 3 all-pad completion columns
        torch.nn.functional.pad(completion_mask, (0, 3)),
    )
    seen_widths = []
    hook = tiny_model.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen_widths.append(kwargs["input_ids"].size(1)),
        with_kwargs=True,
    )
    with torch.no_grad():
        logps = completion_logprobs(tiny_model, padded).logps
        reference = completion_logprobs(
            tiny_model, (prompts, prompt_mask, completions, completion_mask)
        ).logps
    hook.remove()
    assert seen_widths[0] == prompts.size(1) + 4  # the model never saw the extra columns
    assert logps.shape == (prompts.size(0), 7)
    assert torch.all(logps[:, 4:] == 0) and torch.all(logps[padded[3] == 0] == 0)
    torch.testing.assert_close(logps[:, :4], reference, atol=1e-6, rtol=0)


@pytest.mark.fast_paths
def test_prefix_shared_forward_matches_plain_logps_and_lora_grads(tiny_model):
    model = pre_admitted(_lora(tiny_model).train())  # its forwards are counted
    batch = _group_batch(prompt_lengths=(9, 4, 6), width=7)
    calls = []
    body = model.get_base_model().model
    hook = body.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    plain_logps, plain_grads = _logps_and_lora_grads(model, batch, share=False)
    shared_logps, shared_grads = _logps_and_lora_grads(model, batch, share=True)
    hook.remove()
    assert calls == [(9, 9 + 7), (3, 8), (9, 7)]  # plain; then 3 distinct prefixes + N suffixes
    torch.testing.assert_close(shared_logps, plain_logps, atol=5e-5, rtol=0)
    _assert_grads_close(plain_grads, shared_grads)


@pytest.mark.fast_paths
def test_gradient_checkpointing_falls_back_with_one_warning(tiny_model, caplog):
    tiny_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = _lora(tiny_model).train()
    batch = _group_batch()
    _logging._warned.discard("train-share")
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        plain_logps, plain_grads = _logps_and_lora_grads(model, batch, share=False)
        shared_logps, shared_grads = _logps_and_lora_grads(model, batch, share=True)
        _logps_and_lora_grads(model, batch, share=True)
    messages = [r.getMessage() for r in caplog.records if "share_prompt_prefix" in r.getMessage()]
    assert len(messages) == 1 and "gradient checkpointing" in messages[0]
    torch.testing.assert_close(shared_logps, plain_logps, atol=1e-6, rtol=0)
    _assert_grads_close(plain_grads, shared_grads, rel=1e-6)


def test_misaligned_groups_fall_back_to_plain(tiny_model):
    prompts, prompt_mask, completions, completion_mask = _group_batch()
    prompts[1, -1] = 77  # row 1 no longer shares prompt 0
    batch = (prompts, prompt_mask, completions, completion_mask)
    with torch.no_grad():
        logps = completion_logprobs(
            tiny_model, batch, group_size=GROUP, share_prompt_prefix=True
        ).logps
        expected, _ = _naive(tiny_model, *batch)
    torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)


def test_no_full_vocab_logits_are_saved_for_backward(tiny_model):
    batch = _group_batch(width=6)
    vocab = tiny_model.config.vocab_size
    saved_vocab_sized = []

    def pack(tensor):
        if tensor.dim() and tensor.size(-1) == vocab:
            saved_vocab_sized.append(tensor.numel() // vocab)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logps = completion_logprobs(tiny_model, batch, chunk_size=4).logps
    logps.sum().backward()
    assert tiny_model.lm_head.weight.grad.abs().sum() > 0
    # only the (V, H) head weight itself; no (positions, V) logits from the chunked head
    assert max(saved_vocab_sized, default=0) <= tiny_model.config.hidden_size


def _4bit_lora(model_dir):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    base = AutoModelForCausalLM.from_pretrained(
        model_dir, quantization_config=quant, device_map="cpu"
    )
    return _lora(base)


def test_4bit_lora_shared_forward_matches_plain_after_an_eval_pass(tiny_model_dir):
    batch = _group_batch()
    fresh = _4bit_lora(tiny_model_dir).train()
    fresh_logps, fresh_grads = _logps_and_lora_grads(fresh, batch, share=False)
    model = _4bit_lora(tiny_model_dir).eval()
    with (
        torch.no_grad()
    ):  # lets bitsandbytes repack CPU weights (dropping their grads) if unguarded
        completion_logprobs(model, batch)
    model.train()
    plain_logps, plain_grads = _logps_and_lora_grads(model, batch, share=False)
    shared_logps, shared_grads = _logps_and_lora_grads(model, batch, share=True)
    torch.testing.assert_close(plain_logps, fresh_logps, atol=1e-6, rtol=0)
    _assert_grads_close(fresh_grads, plain_grads, rel=1e-6)
    torch.testing.assert_close(shared_logps, plain_logps, atol=5e-5, rtol=0)
    _assert_grads_close(plain_grads, shared_grads)


def test_shape_mismatch_raises(tiny_model):
    prompts, prompt_mask, completions, completion_mask = _group_batch()
    with pytest.raises(ValueError, match="same shape"):
        completion_logprobs(tiny_model, (prompts, prompt_mask[:, 1:], completions, completion_mask))
    with pytest.raises(ValueError, match="repeat each prompt"):
        completion_logprobs(
            tiny_model, (prompts[:2], prompt_mask[:2], completions, completion_mask)
        )


PEAK_RSS_SCRIPT = textwrap.dedent(
    """
    import json, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from grpo_plugin.engine.forward import completion_logprobs

    def status_mib(key):
        with open("/proc/self/status") as f:
            line = next(l for l in f if l.startswith(key + ":"))
        return int(line.split()[1]) / 1024

    def reset_peak():
        # reset the RSS high-water mark (Linux clear_refs "5"); return the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_mib("VmRSS")

    def peak_mib():
        return status_mib("VmHWM")

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg)
    prompts = torch.randint(5, 50000, (4, 16)); completions = torch.randint(5, 50000, (4, 240))
    masks = torch.ones_like(prompts), torch.ones_like(completions)
    base = reset_peak()
    logps = completion_logprobs(model, (prompts, masks[0], completions, masks[1]), chunk_size=64).logps
    logps.sum().backward()
    chunked = peak_mib() - base
    model.zero_grad(set_to_none=True)
    del logps
    base = reset_peak()
    logits = model(input_ids=torch.cat([prompts, completions], 1)).logits[:, 15:-1].float()
    logps = logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    logps.sum().backward()
    print(json.dumps({"chunked": chunked, "naive": peak_mib() - base}))
    """
)


def test_chunked_peak_memory_is_lower_at_large_vocab():
    # A fixed glibc mmap threshold makes freed large buffers go back to the OS, so peak RSS tracks
    # live memory (with the default dynamic threshold, freed 12 MiB chunks stay in the heap).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
    out = subprocess.run(
        [sys.executable, "-c", PEAK_RSS_SCRIPT], capture_output=True, text=True, check=True, env=env
    )
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    # naive: (4 x 256 x 50k) fp32 logits = 195 MiB, plus its log-softmax and their grads
    assert peaks["naive"] > 400, peaks  # measured ~760 MiB
    assert peaks["chunked"] < peaks["naive"] / 3, peaks  # measured ~95 MiB


# ----------------------------------------------------------------------------- TRL 1.16 extras


def test_entropy_with_grad_matches_full_logits_entropy_and_its_gradient(tiny_model):
    batch = _group_batch()
    mask = batch[3].float()
    _, naive_entropy = _naive(tiny_model, *batch)
    (naive_grad,) = torch.autograd.grad((naive_entropy * mask).sum(), tiny_model.lm_head.weight)
    entropy = completion_logprobs(tiny_model, batch, chunk_size=4, return_entropy=True, entropy_grad=True).entropy  # fmt: skip
    assert entropy.requires_grad
    assert torch.allclose(entropy, naive_entropy, atol=1e-5)
    (grad,) = torch.autograd.grad((entropy * mask).sum(), tiny_model.lm_head.weight)
    assert torch.allclose(grad, naive_grad, atol=1e-5) and grad.abs().sum() > 0
    detached = completion_logprobs(tiny_model, batch, return_entropy=True).entropy
    assert not detached.requires_grad


def test_pad_to_multiple_of_keeps_every_value(tiny_model):
    batch = _group_batch(prompt_lengths=(7, 3), width=6)
    plain = completion_logprobs(tiny_model, batch).logps
    padded = completion_logprobs(tiny_model, batch, pad_to_multiple_of=4).logps
    assert torch.allclose(plain, padded, atol=1e-5)


def _tiny_moe(seed=0):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen2MoeConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                            moe_intermediate_size=16, shared_expert_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
                            max_position_embeddings=128)  # fmt: skip
    return Qwen2MoeForCausalLM(config)


def test_moe_aux_loss_is_the_models_own_load_balancing_loss():
    model = _tiny_moe()
    batch = _group_batch(prompt_lengths=(5, 5), width=6, real_lengths=[6, 4, 2, 6, 6, 1])
    logps, _, aux = completion_logprobs(model, batch, return_aux_loss=True)
    mask = torch.cat([batch[1], batch[3]], 1)
    out = model(input_ids=torch.cat([batch[0], batch[2]], 1), attention_mask=mask,
                output_router_logits=True)  # fmt: skip
    assert aux.item() == pytest.approx(out.aux_loss.item(), rel=1e-5) and aux.item() > 1.0
    (grad,) = torch.autograd.grad(aux, model.model.layers[0].mlp.gate.weight)
    assert grad.abs().sum() > 0  # the router learns from it
    plain = completion_logprobs(model, batch).logps
    assert torch.allclose(logps, plain, atol=1e-5)


@pytest.mark.fast_paths
def test_tool_rollouts_share_the_prompt_in_the_training_forward_exactly(tiny_model):
    """A tool exchange: 0s in `score_mask` on the tool results inside each completion. The prompt
    is still encoded once per group, with the plain forward's log-probs and grads (issue 28)."""
    model = pre_admitted(_lora(tiny_model).train())  # its forwards are counted
    prompts, prompt_mask, completions, completion_mask = _group_batch((8, 5), width=9)
    score_mask = completion_mask.clone()
    score_mask[:, 3:6] = 0  # a tool result, then the model's answer after it
    batch = (prompts, prompt_mask, completions, completion_mask)
    calls = []
    body = model.get_base_model().model
    hook = body.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )

    def run(share):
        model.zero_grad()
        logps = completion_logprobs(model, (*batch, score_mask), chunk_size=5, group_size=GROUP, share_prompt_prefix=share).logps  # fmt: skip
        (logps * torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return logps.detach(), grads

    plain_logps, plain_grads = run(False)
    shared_logps, shared_grads = run(True)
    hook.remove()
    rows = 2 * GROUP
    assert calls == [(rows, 8 + 9), (2, 7), (rows, 9)]  # plain; 2 prefixes once; N suffixes
    assert torch.all(shared_logps[:, 3:6] == 0) and torch.all(plain_logps[:, 3:6] == 0)
    scale = plain_logps.abs().max()
    assert (shared_logps - plain_logps).abs().max() / scale < 1e-5
    _assert_grads_close(plain_grads, shared_grads, rel=1e-5)


def test_head_dim_from_the_config_or_zero_where_it_does_not_say():
    from types import SimpleNamespace

    from grpo_plugin.engine.forward import _head_dim

    def body(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    assert _head_dim(body(head_dim=64, hidden_size=576, num_attention_heads=9)) == 64
    assert _head_dim(body(head_dim=None, hidden_size=576, num_attention_heads=9)) == 64
    assert _head_dim(body(hidden_size=576)) == 0  # packing then rests on the padding it drops
