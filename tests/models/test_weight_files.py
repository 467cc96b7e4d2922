"""A model or adapter folder's weights, checked from their headers before anything loads:
missing, truncated, a shard missing, a header that is not JSON; the whole ones pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_model

from grpo_plugin.models import model_source, weight_files


def _copy(tiny_model_dir: Path, dest: Path) -> Path:
    shutil.copytree(tiny_model_dir, dest)
    return dest


def _cut(path: Path, keep: int) -> None:
    """Keep the first `keep` bytes (negative: all but the last -keep)."""
    path.write_bytes(path.read_bytes()[:keep])


def test_a_saved_model_passes_and_its_safetensors_header_is_read(tiny_model_dir):
    model_source.check_model_source(str(tiny_model_dir))
    weight_files.check_safetensors_file(tiny_model_dir / "model.safetensors")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda m: (m / "model.safetensors").unlink(), "holds no weights (model.safetensors"),
        (lambda m: _cut(m / "model.safetensors", 100), "truncated (100 bytes, shorter than its"),
        (lambda m: _cut(m / "model.safetensors", -100), "truncated ("),
        (lambda m: (m / "model.safetensors").write_bytes(b"\xff" * 16), "not a safetensors file"),
        (
            lambda m: (m / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{{{{"),
            "header is not valid JSON",
        ),
    ],
    ids=["missing", "cut-in-header", "cut-in-data", "garbage", "header-not-json"],
)
def test_a_model_folder_whose_weights_cannot_load(tiny_model_dir, tmp_path, damage, expected):
    model = _copy(tiny_model_dir, tmp_path / "model")
    damage(model)
    with pytest.raises(ValueError) as err:
        model_source.check_model_source(str(model))
    assert expected in str(err.value) and str(model) in str(err.value)
    assert "\n" not in str(err.value)


def test_the_exact_bytes_a_header_describes_are_enough(tiny_model_dir, tmp_path):
    path = _copy(tiny_model_dir, tmp_path / "model") / "model.safetensors"
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8 : 8 + header_len])
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert path.stat().st_size == 8 + header_len + end  # what the check compares against
    _cut(path, 8 + header_len + end - 1)
    with pytest.raises(ValueError, match=f"truncated \\({8 + header_len + end - 1} bytes of the"):
        weight_files.check_safetensors_file(path)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("sharded")
    make_tiny_model(tiny_tokenizer).save_pretrained(path, max_shard_size="30KB")
    tiny_tokenizer.save_pretrained(path)
    return path


def test_a_sharded_model_needs_every_shard_whole(sharded_dir, tmp_path):
    shards = sorted(sharded_dir.glob("model-*.safetensors"))
    assert len(shards) > 1 and (sharded_dir / "model.safetensors.index.json").is_file()
    model_source.check_model_source(str(sharded_dir))
    missing = _copy(sharded_dir, tmp_path / "missing")
    (missing / shards[-1].name).unlink()
    with pytest.raises(ValueError, match=f"{shards[-1].name} is missing; copy every shard"):
        model_source.check_model_source(str(missing))
    cut = _copy(sharded_dir, tmp_path / "cut")
    _cut(cut / shards[0].name, -10)
    with pytest.raises(ValueError, match=f"{shards[0].name}: truncated"):
        model_source.check_model_source(str(cut))


def test_pytorch_weights_are_found_and_a_cut_zip_is_refused(tiny_model_dir, tmp_path):
    model = _copy(tiny_model_dir, tmp_path / "bin")
    (model / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(64)}, model / "pytorch_model.bin")
    model_source.check_model_source(str(model))
    _cut(model / "pytorch_model.bin", -30)
    with pytest.raises(ValueError, match="pytorch_model.bin: truncated"):
        model_source.check_model_source(str(model))


def test_weights_under_another_name_are_left_to_the_loader(tiny_model_dir, tmp_path):
    """A `variant` (model.fp16.safetensors) or a GGUF file: model_init_kwargs pick them."""
    model = _copy(tiny_model_dir, tmp_path / "variant")
    (model / "model.safetensors").rename(model / "model.fp16.safetensors")
    model_source.check_model_source(str(model))


def test_an_adapter_folder_needs_its_weights_whole(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    get_peft_model(base, LoraConfig(r=2, target_modules="all-linear")).save_pretrained(adapter)
    model_source.check_adapter_dir(adapter)
    _cut(adapter / "adapter_model.safetensors", -8)
    with pytest.raises(ValueError, match="adapter_model.safetensors: truncated"):
        model_source.check_adapter_dir(adapter)
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="has adapter_config.json but no adapter_model"):
        model_source.check_adapter_dir(adapter)
