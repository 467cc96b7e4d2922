"""Policy wrapping and the reference policy: adapter-off for LoRA, a frozen copy for full FT."""

import copy

import pytest
import torch
from conftest import make_tiny_model, make_tiny_tokenizer
from peft import LoraConfig

from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.models.policy import (
    build_reference,
    cast_lm_head_to_fp32,
    default_dtype,
    load_policy,
    model_init_kwargs,
    prepare_tokenizer,
    reference_mode,
    warn_on_half_precision_training,
    wrap_policy,
)

PRECISION_WARNING = "no float32 master copy"


def logps(model, prompt, completion):
    pm, cm = torch.ones_like(prompt), torch.ones_like(completion)
    with torch.no_grad():
        return completion_logprobs(model, (prompt, pm, completion, cm)).logps


def test_reference_is_the_base_model_with_the_adapter_off(tiny_tokenizer, tmp_path):
    base = make_tiny_model(tiny_tokenizer)
    untouched = copy.deepcopy(base)
    policy = wrap_policy(base, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():  # make the adapter matter
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert build_reference(policy, beta=0.04) is None  # no second copy for LoRA
    prompt, completion = torch.tensor([[5, 6, 7, 8]] * 2), torch.tensor([[9, 10, 11]] * 2)
    expected = logps(untouched, prompt, completion)
    assert (logps(policy, prompt, completion) - expected).abs().max() > 1e-2
    with reference_mode(policy, None) as ref:
        torch.testing.assert_close(logps(ref, prompt, completion), expected, atol=1e-6, rtol=0)
    # the adapter is back on afterwards
    assert (logps(policy, prompt, completion) - expected).abs().max() > 1e-2


def test_full_finetuning_gets_a_frozen_copy(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    assert build_reference(model, beta=0.0) is None  # beta == 0: no reference at all
    ref = build_reference(model, beta=0.1)
    assert ref is not model and not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert not torch.equal(next(model.parameters()), next(ref.parameters()))


def test_quantized_model_without_adapter_is_refused(tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer)
    model.is_loaded_in_4bit = True  # what transformers sets on a bitsandbytes model
    with pytest.raises(ValueError, match="pass a peft_config"):
        wrap_policy(model, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the default dtype is bf16 on a bf16 GPU")
def test_default_dtype_is_fp32_on_cpu():
    assert default_dtype() == torch.float32


def test_prepare_tokenizer_pads_left_and_falls_back_to_eos():
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
    with pytest.raises(ValueError, match="unknown lora key 'rank'"):
        load_policy(str(tiny_model_dir), lora={"rank": 16})
    with pytest.raises(ValueError, match="lora: .*see peft.LoraConfig"):  # peft's own refusal
        load_policy(str(tiny_model_dir), lora={"layers_to_transform": 1})


def test_load_policy_4bit_keeps_base_linear4bit(tmp_path, tiny_tokenizer):
    bnb = pytest.importorskip("bitsandbytes")
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


def test_bf16_loads_float32_master_weights_unless_a_dtype_is_named():
    assert model_init_kwargs(None, bf16=True)["dtype"] is torch.float32  # mixed precision, as TRL
    assert model_init_kwargs({"dtype": "bfloat16"}, bf16=True)["dtype"] is torch.bfloat16
    assert model_init_kwargs({"dtype": torch.bfloat16})["dtype"] is torch.bfloat16
    qlora = model_init_kwargs(None, bf16=True, load_in_4bit=True)  # QLoRA keeps its bf16 compute
    assert qlora["dtype"] is torch.bfloat16
    assert qlora["quantization_config"].bnb_4bit_compute_dtype is torch.bfloat16
    assert model_init_kwargs(None, load_in_4bit=True)["dtype"] is torch.float32


def test_half_precision_trainable_weights_warn_once_lora_on_a_bf16_base_does_not(
    tiny_tokenizer, caplog
):
    with caplog.at_level("WARNING", logger="grpo_plugin.models.policy"):
        warn_on_half_precision_training(make_tiny_model(tiny_tokenizer).to(torch.bfloat16))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert PRECISION_WARNING in caplog.text and "drop 'dtype' from model_init_kwargs" in caplog.text
    caplog.clear()
    lora = wrap_policy(make_tiny_model(tiny_tokenizer).to(torch.bfloat16), LoraConfig(r=4))
    with caplog.at_level("WARNING", logger="grpo_plugin.models.policy"):
        warn_on_half_precision_training(lora)
        warn_on_half_precision_training(make_tiny_model(tiny_tokenizer))
    assert caplog.records == []
    assert {p.dtype for p in lora.parameters() if p.requires_grad} == {torch.float32}


def test_fp32_lm_head_stays_float32_under_bf16_autocast(tiny_tokenizer):
    model = make_tiny_model(tiny_tokenizer)
    cast_lm_head_to_fp32(model)
    head = model.get_output_embeddings()
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    expected = hidden @ head.weight.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head(hidden)
        lowered = torch.nn.functional.linear(hidden, head.weight)  # what autocast would do
    assert lowered.dtype is torch.bfloat16  # the autocast is real
    assert logits.dtype is torch.float32
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
