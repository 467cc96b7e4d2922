"""The vLLM engine's side that needs no vLLM: the weights it is given (they must be the ones the
policy computes with), its dtype and its CPU KV cache. The engine itself, built and synced, is
tested in tests/training/test_vllm_rollouts.py (marked `vllm`)."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig

from grpo_plugin.engine import vllm_engine
from grpo_plugin.engine.vllm_engine import VllmSettings, served_weights, serving_dtype
from tests.conftest import make_tiny_model


def _lora_policy(tokenizer, **config):
    model = make_tiny_model(tokenizer, **config)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, lora)  # B != 0: the adapter changes every adapted layer


def test_a_lora_policys_served_weights_are_its_merged_model(tiny_tokenizer):
    policy = _lora_policy(tiny_tokenizer)
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    served = dict(served_weights(policy))
    assert set(served) == set(merged)  # the base model's names, no lora_A/B, no base_layer
    for name, tensor in merged.items():
        torch.testing.assert_close(served[name], tensor, atol=1e-6, rtol=1e-5, msg=name)
    base = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.allclose(served["model.layers.0.self_attn.q_proj.weight"], base)


def test_a_tied_lm_head_is_sent_under_its_own_name(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    served = dict(served_weights(model))
    # the engine's head is untied (its config says so), so both names carry the table
    assert served["lm_head.weight"] is served["model.embed_tokens.weight"] or torch.equal(
        served["lm_head.weight"], served["model.embed_tokens.weight"]
    )
    assert len(served) == len(dict(model.named_parameters())) + 1


def test_full_fine_tuning_serves_every_parameter_as_it_is(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    served = dict(served_weights(model))
    params = dict(model.named_parameters())
    assert served.keys() == params.keys()
    assert all(torch.equal(served[n], p) for n, p in params.items())


def test_a_qlora_policy_is_served_as_the_weights_it_computes_with(tiny_tokenizer, tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    make_tiny_model(tiny_tokenizer, hidden=128).save_pretrained(tmp_path)  # bnb's CPU blocks: 64

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    policy = get_peft_model(model, lora).eval()
    served = dict(served_weights(policy))
    layer = policy.get_base_model().model.layers[0].mlp.up_proj  # a 4-bit base + LoRA
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = layer(x)  # (3, out): what the policy computes
    weight = served["model.layers.0.mlp.up_proj.weight"]  # (out, in) dense
    assert weight.dtype == torch.float32 and weight.shape == (layer.out_features, layer.in_features)
    from peft.utils.integrations import dequantize_bnb_weight

    w4 = layer.base_layer.weight
    base = dequantize_bnb_weight(w4, state=w4.quant_state).float()
    served_error = float((x @ weight.T - expected).abs().max())
    base_error = float((x @ base.T - expected).abs().max())  # the adapter left out
    # bnb's CPU kernel computes in bf16 (its scales cast to it): bf16-sized agreement, and far
    # closer than the base weights alone
    assert served_error < 2e-2 * float(expected.abs().max())
    assert served_error < 0.1 * base_error


def test_the_served_dtype_follows_rollout_precision(tiny_tokenizer, monkeypatch):
    model = make_tiny_model(tiny_tokenizer)  # float32, on the CPU
    assert serving_dtype("bf16", model) == "bfloat16"
    assert serving_dtype("fp16", model) == "float16"
    assert serving_dtype("policy", model) == "float32"
    monkeypatch.setattr(vllm_engine, "cpu_has_bf16_units", lambda: True)
    assert serving_dtype(None, model) == serving_dtype("auto", model) == "bfloat16"
    monkeypatch.setattr(vllm_engine, "cpu_has_bf16_units", lambda: False)
    assert serving_dtype(None, model) == "float32"  # emulated bf16 decodes slower there


def test_a_cpus_kv_cache_holds_one_rollout():
    heads = dict(num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    config = LlamaConfig(num_hidden_layers=30, hidden_size=576, **heads)  # SmolLM2-135M's shape
    settings = VllmSettings("bfloat16", max_model_len=1024, max_num_seqs=16, seed=0, row_tokens=600)
    per_token = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 heads of 64, 2 bytes: 23,040
    assert settings.kv_cache_bytes(config) == per_token * 16 * 600 + (64 << 20)
    long_rows = VllmSettings("float32", max_model_len=8192, max_num_seqs=2, seed=0, row_tokens=100)
    assert long_rows.kv_cache_bytes(config) == 2 * per_token * 8192 + (64 << 20)  # one full row
