"""The device-sensitive paths, on the accelerator when there is one: `pytest -m cuda`.

`benchmarks/gpu_check.sh` runs these first on a CUDA machine. Without a GPU they run on the CPU
(so CI keeps them green and `gpu_check.sh --device cpu --dry-run` takes the same path);
`GRPO_TEST_DEVICE=cpu` forces the CPU on a GPU machine. What they cover: tensors made on the
model's device in generation and the training forward, the prefix-shared paths' exactness there,
bf16 weights with fp32 LoRA adapters (fp32 master weights for what trains), 4-bit NF4 QLoRA, and
the memory autopilot's probe, which reads the CUDA allocator on a GPU and RSS on the CPU.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import char_codes, make_tiny_model, make_trainer, tiny_lora

from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams

DEVICE = os.environ.get("GRPO_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.cuda
UNUSED_EOS = 2  # the tiny tokenizer's </s>; random tiny models rarely emit it


def _prompts(tok) -> list[list[int]]:
    return [tok("12+3=")["input_ids"], tok("a longer prompt: 7*8=")["input_ids"]]


def _sample(model, prompts, share: bool, **sampling):
    return generate_groups(model, prompts, GenerationRequest(
        SamplingParams(**{"max_new_tokens": 8, **sampling}),
        num_generations=4,
        eos_token_ids=[UNUSED_EOS],
        pad_token_id=0,
        share_prompt_prefix=share,
        generator=torch.Generator().manual_seed(3),
    ))  # fmt: skip


def _device_args() -> dict:
    return {"use_cpu": DEVICE == "cpu"}


def test_generation_and_the_training_forward_run_on_the_device_and_agree(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer).to(DEVICE)
    prompts = _prompts(tiny_tokenizer)
    shared, plain = _sample(model, prompts, True), _sample(model, prompts, False)
    assert shared.completion_ids.device.type == DEVICE
    assert torch.equal(shared.completion_ids, plain.completion_ids)  # same draws, same tokens
    greedy = _sample(model, prompts, True, temperature=0.0)
    hf = model.generate(input_ids=greedy.prompt_ids, attention_mask=greedy.prompt_mask,
                        do_sample=False, max_new_tokens=8, eos_token_id=[UNUSED_EOS],
                        pad_token_id=0)[:, greedy.prompt_ids.size(1):]  # fmt: skip
    assert torch.equal(greedy.completion_ids, hf)
    b = shared
    tensors = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    plain_logps = completion_logprobs(model, tensors).logps  # (N, Tc), fp32
    shared_logps = completion_logprobs(model, tensors, group_size=4, share_prompt_prefix=True).logps
    assert plain_logps.device.type == DEVICE and plain_logps.dtype == torch.float32
    torch.testing.assert_close(shared_logps, plain_logps, atol=5e-5, rtol=0)
    mask = b.completion_mask.bool()
    assert bool((plain_logps[mask] < 0).all()) and bool((plain_logps[~mask] == 0).all())


def test_bf16_weights_train_fp32_lora_adapters_on_the_device(tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer, initializer_range=0.5).to(DEVICE, torch.bfloat16)
    trainer = make_trainer(tiny_tokenizer, tmp_path, model=model, peft=tiny_lora(), bf16=True,
                           max_steps=2, **_device_args())  # fmt: skip
    lora = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all(p.dtype == torch.float32 for p in lora.values())  # fp32 master weights
    before = {n: p.detach().clone() for n, p in lora.items()}
    trainer.train()
    assert next(trainer.model.parameters()).device.type == DEVICE
    changed = [n for n, p in lora.items() if not torch.equal(p.detach(), before[n])]
    assert changed, "no LoRA weight moved in 2 bf16 steps"
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    frozen = trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert frozen.dtype == torch.bfloat16  # the frozen base stays in bf16


def test_qlora_nf4_trains_lora_on_the_device(tiny_tokenizer, tiny_model_dir, tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    device_map = {"": 0} if DEVICE == "cuda" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, quantization_config=quant, device_map=device_map
    )
    trainer = make_trainer(tiny_tokenizer, tmp_path, model=model, peft=tiny_lora(), max_steps=1,
                           reward=char_codes, **_device_args())  # fmt: skip
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), p) for n, p in lora.items())
    assert getattr(trainer.model, "is_loaded_in_4bit", False)


def test_the_autopilot_probes_the_device_memory(tiny_tokenizer, tmp_path, caplog):
    model = make_tiny_model(tiny_tokenizer).to(DEVICE)
    trainer = make_trainer(tiny_tokenizer, tmp_path, model=model, auto_find_batch_size=True,
                           max_steps=1, reward=char_codes, **_device_args())  # fmt: skip
    with caplog.at_level("INFO", logger="grpo_plugin.training.autopilot"):
        trainer.train()
    (line,) = [r.getMessage() for r in caplog.records if "auto_find_batch_size:" in r.getMessage()]
    assert "micro-batch 16 x 1 accumulation steps (16 rows per step, G=8)" in line  # tiny: fits
    a = trainer.args
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == 16


def test_bf16_defaults_on_where_the_gpu_has_it(tmp_path):
    from grpo_plugin import GRPOConfig

    expected = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    assert GRPOConfig(output_dir=str(tmp_path)).bf16 is expected
