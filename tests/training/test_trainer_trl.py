"""TRL 1.16 options wired into the trainer, each on a tiny model: the new loss types, the entropy
bonus and mask, the MoE router loss, TR-DPO reference syncing, the float32 LM head, GDPO
aggregation, padding to a multiple, sampling options and the constructor's TRL arguments."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import (
    SEVEN_DATA,
    char_codes,
    frac_sevens,
    make_tiny_model,
    make_trainer,
    tiny_config,
    tiny_lora,
)

from grpo_plugin import GRPOTrainer
from grpo_plugin.core.objectives import decoupled_advantages
from grpo_plugin.models.policy import cast_lm_head_to_fp32, trainer_init_kwargs
from grpo_plugin.rollout.types import TrainingBatch
from grpo_plugin.training.objective import TrainingObjective


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def moved(before: dict, model) -> bool:
    after = dict(model.named_parameters())
    return any(not torch.equal(v, after[n]) for n, v in before.items())


@pytest.mark.parametrize(
    "options",
    [
        {"loss_type": "bnpo"},
        {"loss_type": "cispo", "epsilon_high": 5.0},
        {"loss_type": "sapo"},
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"loss_type": "vespo", "num_iterations": 2},
        {"delta": 1.5, "off_policy_mask_threshold": 0.5, "num_iterations": 2},
        {"top_entropy_quantile": 0.2, "beta": 0.04},
    ],
)
def test_each_objective_option_trains(tiny_tokenizer, tmp_path, options):
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, max_steps=1, **options)
    before = weights(trainer.model)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert torch.isfinite(torch.tensor(logged["loss"])) and moved(before, trainer.model)
    if options.get("loss_type") == "vespo":
        assert 0.0 < logged["vespo/phi_seq_mean"] <= 1.0
    if options.get("loss_type") == "cispo":
        assert "cispo_clip_ratio" in logged and "clip_ratio/region_mean" not in logged


def tiny_batch(n=2, t=3) -> TrainingBatch:
    ones = torch.ones(n, t, dtype=torch.long)
    return TrainingBatch(ones, ones, ones, ones, ones, advantages=torch.tensor([1.0, -1.0]))


def test_entropy_bonus_is_subtracted_with_the_applied_coefficient(tmp_path):
    logps = torch.full((2, 3), -1.0, requires_grad=True)
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    base = TrainingObjective(tiny_config(tmp_path, loss_type="grpo"))
    with_bonus = TrainingObjective(tiny_config(tmp_path, loss_type="grpo", entropy_coef=0.1))
    plain, _ = base(logps, entropy, tiny_batch(), 6.0)
    loss, metrics = with_bonus(logps, entropy, tiny_batch(), 6.0)
    assert loss.item() == pytest.approx(plain.item() - 0.1 * 3.5)  # mean entropy 21 / 6
    assert metrics["policy_loss"] == pytest.approx(plain.item())
    (grad,) = torch.autograd.grad(loss, entropy)
    assert torch.allclose(grad, torch.full((2, 3), -0.1 / 6))
    assert with_bonus.end_optimizer_step() == {"entropy_coef": 0.1}


def test_adaptive_entropy_coefficient_rises_while_entropy_is_below_target(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, max_steps=2, use_adaptive_entropy=True,
                           entropy_coef=0.0, entropy_coef_delta=0.01, entropy_target=100.0)  # fmt: skip
    trainer.train()
    coefs = [h["entropy_coef"] for h in trainer.state.log_history if "entropy_coef" in h]
    assert coefs == pytest.approx([0.01, 0.02])


def test_adaptive_entropy_coefficient_survives_a_resume(tiny_tokenizer, tmp_path):
    options = dict(use_adaptive_entropy=True, entropy_coef=0.0, entropy_coef_delta=0.01,
                   entropy_target=100.0, save_strategy="steps", save_steps=1)  # fmt: skip
    first = make_trainer(tiny_tokenizer, tmp_path, max_steps=1, **options)
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-1"
    state = json.loads((checkpoint / "entropy_ctrl_state.json").read_text())  # TRL's file
    assert state["entropy_coef"] == pytest.approx(0.01)
    resumed = make_trainer(tiny_tokenizer, tmp_path, max_steps=2, **options)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    coefs = [h["entropy_coef"] for h in resumed.state.log_history if "entropy_coef" in h]
    assert coefs[-1] == pytest.approx(0.02)  # continued from 0.01, not restarted from 0.0


def _tiny_moe(tokenizer):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen2MoeConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                            moe_intermediate_size=16, shared_expert_intermediate_size=16,
                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
                            pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    return Qwen2MoeForCausalLM(config)


def test_moe_router_aux_loss_is_added_and_logged(tiny_tokenizer, tmp_path):
    model = _tiny_moe(tiny_tokenizer)
    trainer = make_trainer(tiny_tokenizer, tmp_path, model=model, max_steps=1)
    assert trainer.training_objective.aux_loss_coef == 0.01  # the config's own coefficient
    trainer.train()
    assert trainer.state.log_history[0]["aux_loss"] > 1.0  # ~1 when balanced, x num_experts
    off = make_trainer(tiny_tokenizer, tmp_path, model=model, router_aux_loss_coef=0.0)
    assert not off.training_objective.needs_aux_loss
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.5 is set but LlamaForCausalLM"):
        make_trainer(tiny_tokenizer, tmp_path, router_aux_loss_coef=0.5)


def test_sync_ref_model_mixes_the_policy_into_the_reference(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, max_steps=1, beta=0.1, sync_ref_model=True,
                           ref_model_sync_steps=1, ref_model_mixup_alpha=0.6)  # fmt: skip
    start = weights(trainer.model)
    trainer.train()
    policy = dict(trainer.model.named_parameters())
    for name, ref_param in trainer.ref_model.named_parameters():
        expected = 0.6 * policy[name].detach() + 0.4 * start[name]
        assert torch.allclose(ref_param, expected, atol=1e-6), name
    assert moved(start, trainer.ref_model)
    with pytest.raises(ValueError, match="sync_ref_model=True needs a separate reference model"):
        make_trainer(tiny_tokenizer, tmp_path, beta=0.1, sync_ref_model=True, peft=tiny_lora())


@pytest.mark.parametrize("tied", [False, True])
def test_cast_lm_head_to_fp32(tiny_tokenizer, tied):
    model = make_tiny_model(tiny_tokenizer).to(torch.bfloat16)
    if tied:
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    cast_lm_head_to_fp32(model)
    assert model.lm_head.weight.dtype == torch.float32
    ids = torch.tensor([[5, 6, 7]])
    logits = model(input_ids=ids).logits
    assert logits.dtype == torch.float32
    hidden = model.model(input_ids=ids).last_hidden_state  # bf16 up to the head
    expected = torch.nn.functional.linear(hidden.float(), model.lm_head.weight.float())
    assert torch.equal(logits, expected)  # the head itself runs in float32
    assert model.model.embed_tokens(ids).dtype == torch.bfloat16  # tied: cast back by a hook
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16


def test_cast_lm_head_to_fp32_in_the_trainer(tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer).to(torch.bfloat16)
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, model=model, max_steps=1, beta=0.1,
                           cast_lm_head_to_fp32=True)  # fmt: skip
    assert trainer.model.lm_head.weight.dtype == torch.float32
    assert trainer.ref_model.lm_head.weight.dtype == torch.float32
    before = weights(trainer.model)
    trainer.train()
    assert moved(before, trainer.model)


def test_normalize_then_sum_uses_decoupled_advantages(tiny_tokenizer, tmp_path):
    def length(prompts, completions, **kw):
        return [100.0 * len(c) for c in completions]

    trainer = make_trainer(tiny_tokenizer, tmp_path, reward=[frac_sevens, length],
                           multi_objective_aggregation="normalize_then_sum")  # fmt: skip
    rollout = trainer._sample_and_score(SEVEN_DATA[:2], trainer._rollout_key)
    batch = trainer._training_batch(rollout)
    expected = decoupled_advantages(rollout.per_func.view(2, 8, 2), trainer.reward_weights)
    assert torch.allclose(batch.advantages, expected.reshape(-1).float())


def test_pad_to_multiple_of_pads_the_training_batch(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, pad_to_multiple_of=16, max_steps=1)
    batch = trainer._training_batch(trainer._sample_and_score(SEVEN_DATA[:2], trainer._rollout_key))
    assert batch.prompt_ids.shape[1] % 16 == 0 and batch.completion_ids.shape[1] % 16 == 0
    assert batch.prompt_mask[:, 0].sum() == 0  # left padding only
    trainer.train()


def test_sampling_options_reach_the_sampler(tiny_tokenizer, tmp_path, caplog):
    trainer = make_trainer(tiny_tokenizer, tmp_path, max_steps=1, min_p=0.05, log_completions=True,
                           generation_kwargs={"top_k": 10, "suppress_tokens": [5]},
                           num_completions_to_print=2, log_unique_prompts=True)  # fmt: skip
    sampling = trainer.args.sampling_params()
    assert (sampling.min_p, sampling.top_k, sampling.suppress_tokens) == (0.05, 10, (5,))
    with caplog.at_level(logging.INFO, logger="grpo_plugin.run.completions_log"):
        trainer.train()
    table = caplog.text.split("Completions at step 0:")[1]
    assert "reward | advantage | prompt | completion" in table
    assert table.count(" | ") >= 2 * 3  # two distinct prompts printed


def test_trl_constructor_arguments(tiny_tokenizer, tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(str(tiny_model_dir), args=tiny_config(tmp_path), train_dataset=SEVEN_DATA)
    args = tiny_config(tmp_path, trust_remote_code=True)
    kwargs = trainer_init_kwargs("org/model", args, quantization_config={"load_in_4bit": True})
    assert kwargs["trust_remote_code"] is True and kwargs["quantization_config"].load_in_4bit
    with pytest.raises(ValueError, match="only apply when `model` is a string"):
        trainer_init_kwargs(make_tiny_model(tiny_tokenizer), args, {"load_in_4bit": True})
    with pytest.raises(ValueError, match="^rollout_func runs its own generation loop"):
        GRPOTrainer("no/such-model", frac_sevens, args=args, rollout_func=len, tools=["python"])
    with pytest.raises(ValueError, match="tool 'len' cannot be described to the model"):
        GRPOTrainer("no/such-model", frac_sevens, args=args, tools=[len])  # before any load


def test_trust_remote_code_reaches_the_tokenizer_load(tiny_model_dir, tmp_path, monkeypatch):
    import grpo_plugin.models.policy as policy

    seen = {}
    original = policy.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(policy.AutoTokenizer, "from_pretrained", spy)
    GRPOTrainer(str(tiny_model_dir), frac_sevens, train_dataset=SEVEN_DATA,
                args=tiny_config(tmp_path, trust_remote_code=True))  # fmt: skip
    assert seen["trust_remote_code"] is True


def test_evaluation_computes_the_training_loss_type(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, eval_data=SEVEN_DATA[:2],
                           loss_type="cispo", epsilon_high=5.0, num_generations_eval=4,
                           per_device_eval_batch_size=8)  # fmt: skip
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"])) and metrics["eval_loss"] != 0.0
    assert "eval_clip_ratio/low_min" not in metrics  # cispo has no PPO clip to report
