"""GRPOTrainer end to end on tiny random models: learning, policies, errors, saving and resuming."""

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
from grpo_plugin.scoring.scorer import RewardFunctionError


def load_4bit(model, tmp_path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    model.save_pretrained(tmp_path / "base")
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    return AutoModelForCausalLM.from_pretrained(tmp_path / "base", quantization_config=quant)


# 4-bit LoRA learns the same task more slowly at equal lr (NF4 noise in the frozen base).
LEARNING_RATE = {"full": 3e-2, "lora": 3e-2, "4bit": 6e-2}


def rewards_of(trainer) -> list[float]:
    return [h["reward"] for h in trainer.state.log_history if "reward" in h]


@pytest.mark.parametrize("policy", ["full", "lora", "4bit"])
def test_learns_synthetic_task(policy, tiny_tokenizer, tmp_path):
    # initializer_range 0.3: see make_tiny_model's docstring.
    model = make_tiny_model(tiny_tokenizer, initializer_range=0.3)
    if policy == "4bit":
        model = load_4bit(model, tmp_path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model,
        frac_sevens,
        args=tiny_config(tmp_path, max_steps=16, learning_rate=LEARNING_RATE[policy]),
        train_dataset=SEVEN_DATA,
        processing_class=tiny_tokenizer,
        peft_config=None if policy == "full" else tiny_lora(),
    )
    trainer.train()
    rewards = rewards_of(trainer)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, f"{policy}: reward {first:.3f} -> {last:.3f}"
    if policy == "full":
        return
    for name, param in trainer.model.named_parameters():
        base_name = name.replace("base_model.model.", "").replace(".base_layer", "")
        if "lora_" in name:
            continue
        if base_name in before and before[base_name].shape == param.shape:
            assert torch.equal(before[base_name], param.detach()), f"base weight {name} changed"
    if policy == "4bit":
        import bitsandbytes as bnb

        linear4 = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert len(linear4) == 2 * 7  # q,k,v,o,gate,up,down in each of 2 layers


@pytest.mark.parametrize("policy", ["full", "lora", "4bit"])
def test_gradient_checkpointing_runs(policy, tiny_tokenizer, tmp_path):
    model = make_tiny_model(tiny_tokenizer, initializer_range=0.3)
    if policy == "4bit":
        model = load_4bit(model, tmp_path)
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        char_codes,  # a non-zero advantage at step 1 whatever the draws
        model=model,
        peft=None if policy == "full" else tiny_lora(),
        max_steps=1,
        gradient_checkpointing=True,
    )
    trained = {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert trained and all(torch.isfinite(after[n]).all() for n in trained)
    moved = [n for n, before in trained.items() if not torch.equal(before, after[n].detach())]
    # one optimizer step updates every trainable tensor (LoRA B starts at 0; A gets no grad then)
    expected = [n for n in trained if "lora_A" not in n]
    assert sorted(moved) == sorted(expected), set(expected) - set(moved)
    assert trainer.state.global_step == 1


def test_metrics_have_trl_and_own_names(tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        frac_sevens,
        peft=tiny_lora(),
        beta=0.04,
        log_completions=True,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    expected = [
        "reward", "reward_std", "rewards/frac_sevens/mean", "rewards/frac_sevens/std",
        "frac_reward_zero_std", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean",
        "clip_ratio/region_mean", "completions/mean_length", "completions/clipped_ratio",
        "entropy", "timing/generate_s", "timing/reward_s", "timing/train_s",
        "generation/tokens_per_s",
    ]  # fmt: skip
    assert [k for k in expected if k not in logged] == []
    assert logged["kl"] >= 0 and 0 <= logged["completions/clipped_ratio"] <= 1
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if "reward" in x] == [1, 2]
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "completions" / "step_00000.parquet")
    assert table.num_rows == 16
    assert {"prompt", "completion", "reward", "advantage", "rewards/frac_sevens"} <= set(
        table.column_names
    )


def test_missing_prompt_column_fails_before_loading(tiny_model_dir, tmp_path, monkeypatch):
    from grpo_plugin.training import trainer as trainer_module

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the dataset was checked")

    monkeypatch.setattr(trainer_module, "load_trainer_policy", never)
    with pytest.raises(ValueError, match="no 'prompt' column.*rename_column"):
        GRPOTrainer(
            str(tiny_model_dir), frac_sevens, args=tiny_config(tmp_path), train_dataset=[{"q": "1"}]
        )


def test_reward_weight_count_is_checked(tmp_path, tiny_model_dir):
    with pytest.raises(
        ValueError, match=r"reward weights \(2\) must match number of reward functions"
    ):
        GRPOTrainer(
            str(tiny_model_dir),
            frac_sevens,
            args=tiny_config(tmp_path, reward_weights=[1.0, 2.0]),
            train_dataset=SEVEN_DATA,
        )


def three_values(prompts, completions, **kwargs):
    return [1.0, 0.0, 1.0]


def explodes_on_odd_answers(prompts, completions, answer, **kwargs):
    return [1 / 0 if int(a) % 4 == 2 else 0.0 for a in answer]


@pytest.mark.parametrize(
    "fn, message",
    [
        (three_values, r"'three_values' returned 3 values for 16 completions"),
        (
            explodes_on_odd_answers,
            r"'explodes_on_odd_answers' raised ZeroDivisionError on sample \d+",
        ),
    ],
)
def test_bad_reward_functions_fail_at_first_step(fn, message, tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        fn,
    )
    with pytest.raises(RewardFunctionError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0


def test_zero_std_warning_is_logged_once(tiny_tokenizer, tmp_path, caplog):
    constant = lambda prompts, completions, **kw: [1.0] * len(completions)  # noqa: E731
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        constant,
        max_steps=4,
        zero_std_patience=3,
    )
    with caplog.at_level(logging.WARNING, logger="grpo_plugin.training.trainer"):
        trainer.train()
    warnings = [r for r in caplog.records if "identical" in r.getMessage()]
    assert len(warnings) == 1
    assert all(h["loss"] == 0 for h in trainer.state.log_history if "loss" in h and "reward" in h)


def test_reused_rollouts_compute_old_logps(tiny_tokenizer, tmp_path):
    """mu=2 with a frozen reference (full fine-tuning, beta > 0): ratio moves off 1 on pass two."""
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        char_codes,  # a non-zero advantage at step 1 whatever the draws
        init_range=0.3,
        num_iterations=2,
        beta=0.04,
        max_steps=2,
    )
    assert trainer.ref_model is not None and trainer.args.needs_old_logps
    trainer.train()
    second = trainer.state.log_history[1]
    assert second["kl"] > 0  # the policy moved away from the frozen copy after step 1


def test_dynamic_sampling_logs_filtered_groups(tiny_tokenizer, tmp_path):
    trainer = GRPOTrainer(
        make_tiny_model(tiny_tokenizer),
        lambda prompts, completions, **kw: [float(p.startswith("1")) for p in prompts],  # noqa
        args=tiny_config(tmp_path, dynamic_sampling=True, max_resample_rounds=1, max_steps=1),
        train_dataset=SEVEN_DATA,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    # every group is zero-variance (the reward depends on the prompt only): all filtered
    assert logged["dynamic_sampling/filtered_groups"] == 4  # 2 groups + 2 fresh in one round
    assert trainer.state.global_step == 1


def test_save_resume_and_no_token_on_disk(tiny_tokenizer, tmp_path):
    token = "hf_DoNotLeakThisTokenAnywhere123"
    args = tiny_config(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, hub_token=token)
    trainer = GRPOTrainer(
        make_tiny_model(tiny_tokenizer),
        frac_sevens,
        args=args,
        train_dataset=SEVEN_DATA,
        processing_class=tiny_tokenizer,
        peft_config=tiny_lora(),
    )
    trainer.train()
    trainer.save_model()
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").exists() and (out / "tokenizer.json").exists()
    run = json.loads((out / "grpo_run.json").read_text())
    assert run["adapter"] and run["lora"]["r"] == 8 and run["global_step"] == 2
    resumed = make_trainer(
        tiny_tokenizer,
        tmp_path,
        frac_sevens,
        peft=tiny_lora(),
        max_steps=3,
        save_strategy="no",
    )
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.state.global_step == 3
    for path in out.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), f"token leaked into {path}"


TRL_QUICKSTART = """
from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Say {i}", "answer": str(i)} for i in range(16)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, per_device_train_batch_size=8, num_generations=4,
                           max_completion_length=8, max_steps=2, logging_steps=1, report_to="none",
                           learning_rate=1e-4)
trainer = GRPOTrainer(model=MODEL_DIR, reward_funcs=reward_len, args=training_args,
                      train_dataset=dataset, peft_config=LoraConfig(r=4, target_modules="all-linear"))
trainer.train()
"""


def test_trl_quickstart_runs_after_changing_the_import(tiny_model_dir, tmp_path):
    script = TRL_QUICKSTART.replace("from trl import", "from grpo_plugin import")
    scope = {"OUTPUT_DIR": str(tmp_path / "q"), "MODEL_DIR": str(tiny_model_dir)}
    exec(compile(script, "trl_quickstart.py", "exec"), scope)
    assert scope["trainer"].state.global_step == 2
    assert type(scope["trainer"]).__module__ == "grpo_plugin.training.trainer"


def test_evaluate_reports_greedy_accuracy(tiny_tokenizer, tmp_path):
    always_right = lambda prompts, completions, **kw: [1.0] * len(completions)  # noqa: E731
    trainer = make_trainer(
        tiny_tokenizer,
        tmp_path,
        always_right,
        eval_data=SEVEN_DATA[:4],
    )
    assert trainer.evaluate()["eval_accuracy"] == 1.0  # TRL's keys too: test_eval_loop.py
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["eval_accuracy"] == 1.0


# --- precision: bf16=True is mixed precision (fp32 master weights, bf16 autocast) ----------------


def train_and_watch(trainer) -> tuple[float, dict[str, set]]:
    """Train; the share of trainable weight elements changed, and the dtypes q_proj computed in
    during the rollout (no grad) and the training forward (grad)."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    seen: dict[str, set] = {"rollout": set(), "train": set()}

    def hook(module, args, out):
        seen["train" if torch.is_grad_enabled() else "rollout"].add(out.dtype)

    base = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else None
    (base or trainer.model).model.layers[0].self_attn.q_proj.register_forward_hook(hook)
    trainer.train()
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before))
    return changed / sum(p.numel() for p in params), seen


def precision_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no float32 master copy" in r.getMessage()]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU numbers; on CUDA bf16 is the default")
def test_bf16_trains_float32_master_weights_under_bf16_autocast(
    tiny_tokenizer, tiny_model_dir, tmp_path, caplog
):
    # 3 steps at lr 1e-5 (benchmarks/precision_updates.py): 99.1% of the elements change in
    # fp32 and with bf16=True (the 0.9% left are embedding rows of tokens no batch contains,
    # whose gradient is exactly 0); pure bf16 weights keep 85% (see the next test).
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, model=str(tiny_model_dir),
                           bf16=True, learning_rate=1e-5, max_steps=3)  # fmt: skip
    with caplog.at_level("WARNING"):
        changed, seen = train_and_watch(trainer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert changed > 0.98
    assert seen == {"rollout": {torch.bfloat16}, "train": {torch.bfloat16}}  # autocast on both
    assert precision_warnings(caplog) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU numbers; on CUDA bf16 is the default")
def test_pure_bf16_weights_warn_once_and_lose_small_updates(
    tiny_tokenizer, tiny_model_dir, tmp_path, caplog
):
    with caplog.at_level("WARNING"):
        trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, model=str(tiny_model_dir),
                               bf16=True, learning_rate=1e-5, max_steps=3,
                               model_init_kwargs={"dtype": "bfloat16"})  # fmt: skip
        changed, _ = train_and_watch(trainer)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert 0.05 < changed < 0.3  # measured 14.7%: most updates round away
    assert len(precision_warnings(caplog)) == 1


def test_lora_on_a_bf16_base_keeps_float32_adapters(tiny_tokenizer, tmp_path, caplog):
    model = make_tiny_model(tiny_tokenizer).to(torch.bfloat16)
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, model=model, peft=tiny_lora(),
                           bf16=True, learning_rate=1e-5)  # fmt: skip
    with caplog.at_level("WARNING"):
        changed, seen = train_and_watch(trainer)
    trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert {p.dtype for p in trained.values()} == {torch.float32}
    assert changed > 0.99  # measured 99.99%: B leaves 0 at step 1, A moves once B is not 0
    assert seen["train"] == {torch.bfloat16}
    assert precision_warnings(caplog) == []


def test_bf16_reference_is_a_float32_copy_scored_under_the_same_autocast(
    tiny_tokenizer, tiny_model_dir, tmp_path
):
    # A bf16 copy would halve its memory, but its residual stream runs in bf16 where the policy's
    # runs in fp32 under autocast: measured max |logp diff| 1.9e-3 (init 0.02) to 0.48 (init 0.5)
    # on identical weights, so the KL would not start at 0. The fp32 copy starts at exactly 0.
    trainer = make_trainer(tiny_tokenizer, tmp_path, char_codes, model=str(tiny_model_dir),
                           bf16=True, beta=0.04, max_steps=1)  # fmt: skip
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.float32}
    trainer.train()
    assert [h["kl"] for h in trainer.state.log_history if "kl" in h] == [0.0]


@pytest.mark.fast_paths  # the held prompt is the shared_prompt lever
def test_a_group_over_two_micro_batches_trains_as_when_each_encodes_its_prompt(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """G=8 rows in micro-batches of 4: the prompt is encoded once per group (not once per
    micro-batch), with the same losses and LoRA weights after 2 steps (engine/prompt_grad.py)."""
    from conftest import assert_same_training, tiny_lora

    from grpo_plugin import distributed

    def trained(out, **overrides):
        # from the policy: a copy's correction weights would amplify the last-bit differences
        split = dict(per_device_train_batch_size=4, gradient_accumulation_steps=4)
        trainer = make_trainer(
            tiny_tokenizer, out, peft=tiny_lora(), rollout_precision="policy", **split, **overrides
        )
        trainer.train()
        return trainer

    held = trained(tmp_path / "held")
    assert held._held_prompt.encodings == 4  # 2 prompts per step, 2 steps
    monkeypatch.setattr(distributed, "held_prompt", lambda *args: None)
    each = trained(tmp_path / "each")
    assert each._held_prompt.encodings == 0
    assert_same_training(held, each)


@pytest.mark.fast_paths  # the held prompt is the shared_prompt lever
def test_a_failed_micro_batch_leaves_no_prompt_held(tiny_tokenizer, tmp_path, monkeypatch):
    """The second micro-batch of a group fails: the group's held prompt is dropped, not carried
    into whatever runs next (a resume in the same process)."""
    from conftest import tiny_lora

    from grpo_plugin.run import guards

    trainer = make_trainer(tiny_tokenizer, tmp_path, peft=tiny_lora(),
                           per_device_train_batch_size=4, gradient_accumulation_steps=4)  # fmt: skip
    calls, held_then = [], []
    original = guards.check_loss

    def failing_second(loss, step):
        calls.append(step)
        held_then.append(trainer._held_prompt.holds_prompt)
        if len(calls) == 2:
            raise RuntimeError("the loss of micro-batch 2 went wrong")
        return original(loss, step)

    monkeypatch.setattr(guards, "check_loss", failing_second)
    with pytest.raises(RuntimeError, match="micro-batch 2"):
        trainer.train()
    assert held_then == [True, True]  # the group's prompt was held when it failed
    assert not trainer._held_prompt.holds_prompt and trainer._held_prompt.encodings == 1


@pytest.mark.fast_paths  # the bf16 products are the fused LoRA layers' lever
def test_bf16_training_keeps_float32_master_weights_and_the_kl_starts_at_0(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """train_precision='bf16': the LoRA policy's frozen products in bf16, against 'fp32' on the
    same first rollout (the step's rewards are the same draws: the rollouts do not use them)."""
    for module in ("grpo_plugin.config.field_checks", "grpo_plugin.engine"):
        monkeypatch.setattr(f"{module}.cpu_has_bf16_units", lambda: True)
    runs = {}
    for precision in ("fp32", "bf16"):
        trainer = make_trainer(tiny_tokenizer, tmp_path / precision, char_codes, peft=tiny_lora(),
                               train_precision=precision, beta=0.04, max_steps=1,
                               rollout_precision="policy")  # fmt: skip
        assert trainer.train_precision == precision
        trainer.train()
        runs[precision] = trainer.state.log_history[0]
        trained = [p for p in trainer.model.parameters() if p.requires_grad]
        assert trained and {p.dtype for p in trained} == {torch.float32}
    fp32, bf16 = runs["fp32"], runs["bf16"]
    assert bf16["reward"] == fp32["reward"]  # the same rollout
    assert bf16["kl"] == 0.0  # policy and reference share the bf16 products
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=5e-2)
    assert bf16["grad_norm"] != fp32["grad_norm"]  # the products did run in bf16
