"""TRL 1.16's own GRPO test behaviours (`tests/test_grpo_trainer.py`), run on ours as TRL users
write them: only the import changed, our tiny random models instead of the Hub's. Each case
trains 2 steps and checks what TRL's test checks: `log_history[-1]["train_loss"]` exists and the
weights moved. The inventory with one row per TRL test is `docs/trl-behaviours.md`."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_plugin import GRPOConfig, GRPOTrainer
from tests.conftest import (
    SEVEN_DATA,
    char_codes,
    make_tiny_model,
    make_tiny_reward_model,
    tiny_config,
)

CHAT_DATA = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in SEVEN_DATA]


def reward_len(completions, **kwargs):
    text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(len(set(t))) + sum(map(ord, t)) / 1e4 for t in text]


def _train(tok, tmp_path, reward=char_codes, data=None, model=None, peft=None, **overrides):
    """Train like TRL's tests do; return the trainer after checking TRL's two assertions."""
    args = tiny_config(tmp_path, **overrides)
    trainer = GRPOTrainer(
        model if model is not None else make_tiny_model(tok, initializer_range=0.5),
        reward,
        args=args,
        train_dataset=SEVEN_DATA if data is None else data,
        processing_class=tok,
        peft_config=peft,
    )
    before = {n: p.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    changed = [n for n, p in before.items() if not torch.equal(p, trainer.model.get_parameter(n))]
    assert changed, "no trainable parameter changed"
    return trainer


CASES = {  # TRL test name -> GRPOConfig overrides (TRL's own values where they fit a tiny model)
    "test_training_loss_types[bnpo]": dict(loss_type="bnpo", gradient_accumulation_steps=2),
    "test_training_loss_types[dr_grpo]": dict(loss_type="dr_grpo", gradient_accumulation_steps=2),
    "test_training_loss_types[dapo]": dict(loss_type="dapo", gradient_accumulation_steps=2),
    "test_training_loss_types[cispo]": dict(loss_type="cispo", gradient_accumulation_steps=2),
    "test_training_loss_types[sapo]": dict(loss_type="sapo", gradient_accumulation_steps=2),
    "test_training_multiple_iterations": dict(num_iterations=2),
    "test_training_beta_non_zero": dict(beta=0.1),
    "test_training_with_sync_ref_model": dict(
        beta=0.1, sync_ref_model=True, ref_model_sync_steps=1
    ),
    "test_training_with_off_policy_mask": dict(off_policy_mask_threshold=0.5),
    "test_training_with_bias_correction_kl": dict(beta=0.1, use_bias_correction_kl=True),
    "test_training_with_entropy_filter": dict(top_entropy_quantile=0.2),
    "test_training_with_additional_generation_kwargs": dict(
        top_p=0.9, top_k=10, min_p=0.01, repetition_penalty=1.1
    ),
    "test_training_scale_rewards[False]": dict(scale_rewards=False),
    "test_training_scale_rewards[True]": dict(scale_rewards=True),
    "test_training_scale_rewards[batch]": dict(scale_rewards="batch"),
    "test_training_num_generations_larger_than_batch_size": dict(
        per_device_train_batch_size=4, num_generations=8, gradient_accumulation_steps=2
    ),
    "test_training_delta_clipping": dict(delta=2.0),
    "test_training_multiple_dataloader_workers": dict(dataloader_num_workers=2),
    "test_training_sequence_importance_sampling": dict(
        num_iterations=2, importance_sampling_level="sequence"
    ),
    "test_training_with_cast_lm_head_to_fp32": dict(cast_lm_head_to_fp32=True),
}


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_trl_training_configurations(tiny_tokenizer, tmp_path, overrides):
    _train(tiny_tokenizer, tmp_path, **overrides)


def test_conversational_prompts_and_chat_template_kwargs(tiny_tokenizer, tmp_path):
    # test_training[conversational_prompt_only], test_training_reward_func_conversational,
    # test_training_with_chat_template_kwargs
    _train(tiny_tokenizer, tmp_path, reward=reward_len, data=CHAT_DATA,
           chat_template_kwargs={"enable_thinking": False})  # fmt: skip


def test_several_rewards_weights_none_async_and_columns(tiny_tokenizer, tmp_path):
    # test_training_multiple_reward_funcs(_with_weights, _with_None_output),
    # test_training_sync_and_async_reward_funcs, test_training_reward_func_additional_column,
    # test_training_with_reward_func_accessing_trainer_state
    def uses_column(completions, answer, trainer_state, **kwargs):
        assert hasattr(trainer_state, "global_step")
        return [float(len(c) == len(a)) for c, a in zip(completions, answer)]

    def not_applicable(completions, **kwargs):
        return [None] * len(completions)

    async def async_reward(completions, **kwargs):
        return [float(len(set(c))) for c in completions]

    funcs = [char_codes, uses_column, not_applicable, async_reward]
    trainer = _train(tiny_tokenizer, tmp_path, reward=funcs, reward_weights=[0.7, 0.1, 0.1, 0.1])
    logged = {k for entry in trainer.state.log_history for k in entry}
    for name in ("char_codes", "uses_column", "async_reward"):
        assert f"rewards/{name}/mean" in logged and f"rewards/{name}/std" in logged


def test_reward_metrics_are_in_the_final_log_entry(tiny_tokenizer, tmp_path):
    # test_training_multiple_reward_funcs_with_weights reads log_history[-1]; TRL's tests run at
    # its default logging_steps=10 (ours is 1, and then, as in TRL, the final window is empty)
    trainer = _train(tiny_tokenizer, tmp_path, reward=[char_codes, reward_len],
                     reward_weights=[0.7, 0.3], logging_steps=10)  # fmt: skip
    assert "rewards/char_codes/mean" in trainer.state.log_history[-1]


def test_mixed_reward_function_and_reward_model(tiny_tokenizer, tmp_path):
    # test_training_multiple_mixed_reward_funcs, test_training_different_reward_model
    rm = make_tiny_reward_model(tiny_tokenizer)
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer, initializer_range=0.5), [char_codes, rm],
                          args=tiny_config(tmp_path), train_dataset=SEVEN_DATA,
                          processing_class=tiny_tokenizer,
                          reward_processing_classes=[None, tiny_tokenizer])  # fmt: skip
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert len(trainer.reward_processing_classes) == 2


def test_peft_config_and_peft_model_train_only_the_adapter(tiny_tokenizer, tmp_path):
    # test_training_peft_config, test_training_peft_model, test_training_peft_with_gradient_checkpointing
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    t = _train(tiny_tokenizer, tmp_path / "a", peft=lora, gradient_checkpointing=True)
    assert all("lora" in n for n, p in t.model.named_parameters() if p.requires_grad)
    model = get_peft_model(make_tiny_model(tiny_tokenizer, initializer_range=0.5), lora)
    _train(tiny_tokenizer, tmp_path / "b", model=model, beta=0.1)


def test_an_adapter_on_lm_head_is_trained(tiny_tokenizer, tmp_path):
    # TRL 1.16 refuses an adapter on lm_head (its log-probs read lm_head.weight directly); ours
    # runs the head module, so the adapter trains: a documented difference.
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    trainer = _train(tiny_tokenizer, tmp_path, peft=lora)
    head = [n for n, p in trainer.model.named_parameters() if "lm_head" in n and p.requires_grad]
    assert head


def test_evaluation_with_num_generations_eval_and_eval_on_start(tiny_tokenizer, tmp_path):
    # test_training_with_eval, test_training_with_num_generations_eval, test_training_eval_on_start
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes,
                          args=tiny_config(tmp_path, eval_strategy="steps", eval_steps=2,
                                           per_device_eval_batch_size=8, num_generations_eval=1,
                                           eval_on_start=True),
                          train_dataset=SEVEN_DATA, eval_dataset=SEVEN_DATA[:4],
                          processing_class=tiny_tokenizer)  # fmt: skip
    trainer.train()
    assert sum(1 for e in trainer.state.log_history if any(k.startswith("eval_") for k in e)) == 2


def test_all_masked_truncated_completions_leave_the_weights_unchanged(tiny_tokenizer, tmp_path):
    # test_training_with_mask_truncated_completions_all_masked (TRL relies on a 151k vocabulary
    # never drawing EOS; here EOS is suppressed so that every completion is truncated)
    eos = tiny_tokenizer.eos_token_id
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes,
                          args=tiny_config(tmp_path, mask_truncated_completions=True, max_steps=1,
                                           generation_kwargs={"suppress_tokens": [eos]}),
                          train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer)  # fmt: skip
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert all(torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())


# --- item 6: the same warnings and errors in the same situations, with TRL's key phrase --------
def test_all_rewards_none_warns_with_trls_phrase(tiny_tokenizer, tmp_path, caplog):
    # test_warning_raised_all_rewards_none
    def never(completions, **kwargs):
        return [None] * len(completions)

    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), never, args=tiny_config(tmp_path, max_steps=1),
                          train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text


@pytest.mark.parametrize("reward", [None, []])
def test_no_reward_source_is_refused_with_trls_phrase(tiny_tokenizer, tmp_path, reward):
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(make_tiny_model(tiny_tokenizer), reward, args=tiny_config(tmp_path),
                    train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer)  # fmt: skip


def test_reward_counts_must_match_with_trls_phrase(tiny_tokenizer, tmp_path):
    # test_mismatched_reward_processing_classes_length, and the reward_weights count
    for kwargs in ({"reward_processing_classes": [tiny_tokenizer]}, {}):
        weights = None if kwargs else [1.0]
        with pytest.raises(ValueError, match="must match"):
            GRPOTrainer(make_tiny_model(tiny_tokenizer), [char_codes, reward_len],
                        args=tiny_config(tmp_path, reward_weights=weights),
                        train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer, **kwargs)  # fmt: skip


def test_peft_model_with_a_peft_config_is_refused_as_in_trl(tiny_tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj"])
    model = get_peft_model(make_tiny_model(tiny_tokenizer), lora)
    with pytest.raises(ValueError, match="together with a peft_config"):
        GRPOTrainer(model, char_codes, args=tiny_config(tmp_path), train_dataset=SEVEN_DATA,
                    processing_class=tiny_tokenizer, peft_config=lora)  # fmt: skip


def test_sequence_level_ratio_with_a_token_summed_loss_warns_with_trls_phrase(
    tiny_tokenizer, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING):
        GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes,
                    args=tiny_config(tmp_path, importance_sampling_level="sequence", loss_type="dapo"),
                    train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer)  # fmt: skip
    assert "weights each sequence by its completion length" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        ({"num_generations": 1}, "at least 2 generations per prompt"),
        ({"per_device_train_batch_size": 12}, "must be divisible by num_generations"),
        ({"generation_batch_size": 16, "steps_per_generation": 1}, "can not be both configured"),
        ({"generation_batch_size": 24}, "must be divisible by the global batch size"),
    ],
)
def test_config_errors_carry_trls_phrase(tmp_path, overrides, phrase):
    with pytest.raises(ValueError, match=phrase):
        GRPOConfig(**{"output_dir": str(tmp_path), "per_device_train_batch_size": 16,
                      "num_generations": 8, **overrides})  # fmt: skip


def test_beam_search_generation_kwargs_are_refused_in_one_line(tmp_path):
    # test_training_with_generation_kwargs passes num_beams=2: refused here (documented difference)
    with pytest.raises(ValueError, match=r"generation_kwargs\['num_beams'\]=2 is not supported"):
        tiny_config(tmp_path, generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2})


def test_mask_truncated_completions_masks_only_the_truncated(tiny_tokenizer, tmp_path):
    # test_training_with_mask_truncated_completions: TRL mocks generate with 3 completions of 8
    # tokens (one without EOS, one ending early, one with EOS as the 8th token); TRL's own
    # `rollout_func` hands ours the same completions.
    eos = tiny_tokenizer.eos_token_id
    rows = [[10, 11, 12, 13, 14, 15, 16, 17], [18, 19, 20, eos], [21, 22, 23, 24, 25, 26, 27, eos]]

    def rollout_func(prompts, trainer):
        ids = [rows[i % 3] for i in range(len(prompts))]
        return {"prompt_ids": [[5, 6, 7]] * len(prompts), "completion_ids": ids,
                "logprobs": [[0.0] * len(c) for c in ids]}  # fmt: skip

    args = tiny_config(tmp_path, mask_truncated_completions=True, per_device_train_batch_size=12,
                       num_generations=3, learning_rate=0.1)  # fmt: skip
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes, args=args,
                          train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer,
                          rollout_func=rollout_func)  # fmt: skip
    batches = []
    original = trainer._training_batch
    trainer._training_batch = lambda rollout: batches.append(original(rollout)) or batches[-1]
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    kept = batches[0].loss_mask.sum(dim=1).tolist()
    assert kept[:3] == [0, 4, 8]  # the truncated row is masked, the two that ended are trained
    assert any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())


def test_one_reward_processing_class_for_one_reward_model(tiny_tokenizer, tmp_path):
    # test_single_reward_model_with_single_processing_class
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), make_tiny_reward_model(tiny_tokenizer),
                          args=tiny_config(tmp_path), train_dataset=SEVEN_DATA,
                          processing_class=tiny_tokenizer,
                          reward_processing_classes=tiny_tokenizer)  # fmt: skip
    assert len(trainer.reward_processing_classes) == 1
    assert trainer.reward_processing_classes[0] == tiny_tokenizer


# --- issue 48: TRL's test file as written (items 3-6) ----------------------------------------------
def _scripted_generate(tok, turns: list[list[str]], calls: list[int], first_rows: int = 0):
    """A stand-in for `model.generate` as TRL's tests patch it: the prompt ids followed by the
    scripted completion of each row: a call on `first_rows` rows (or any, when 0) is a first
    turn (`turns[0]`), other calls answer tool results (`turns[1]`); row i gets its `i % len`."""

    def fake_generate(input_ids, **kwargs):
        first = not first_rows or input_ids.shape[0] == first_rows
        texts = turns[0 if first else 1]
        calls.append(input_ids.shape[0])
        rows = [tok.encode(texts[i % len(texts)], add_special_tokens=False)
                for i in range(input_ids.shape[0])]  # fmt: skip
        width = max(map(len, rows))
        rows = [r + [tok.pad_token_id] * (width - len(r)) for r in rows]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    return fake_generate


def test_a_replaced_generate_is_sampled_from(tiny_tokenizer, tmp_path):
    """test_train_with_mask_truncated_completions patches `generate`; ours honours it (before,
    its own decode loop ignored the patch and trained on other completions)."""
    from unittest.mock import patch

    tok, calls = tiny_tokenizer, []
    texts = [["12345678", "9a</s>", "bcdefgh</s>"]]  # truncated, ended, ended at the 8th token
    args = tiny_config(tmp_path, mask_truncated_completions=True, per_device_train_batch_size=6,
                       num_generations=3, learning_rate=0.1, max_steps=1)  # fmt: skip
    trainer = GRPOTrainer(make_tiny_model(tok), char_codes, args=args, train_dataset=SEVEN_DATA,
                          processing_class=tok)  # fmt: skip
    batches = []
    original = trainer._training_batch
    trainer._training_batch = lambda rollout: batches.append(original(rollout)) or batches[-1]
    with patch.object(trainer.model, "generate", side_effect=_scripted_generate(tok, texts, calls)):
        trainer.train()
    assert calls == [6]  # one call: 2 prompts x G=3
    decoded = tok.batch_decode(batches[0].completion_ids[:3], skip_special_tokens=True)
    assert decoded == ["12345678", "9a", "bcdefgh"]
    assert batches[0].loss_mask.sum(dim=1).tolist()[:3] == [0, 3, 8]  # truncated row masked


def test_a_replaced_generate_drives_the_tool_loop(tiny_tokenizer, tmp_path):
    """test_train_with_tools: the scripted calls go through our tool loop (one call succeeds, one
    fails, one row answers) and TRL's tool metrics are in `log_history[-1]`."""
    from unittest.mock import patch

    from tests.scripted_policy import call, multiply

    tok, calls = tiny_tokenizer, []
    first = [call("multiply", '{"a": 3, "b": 4}') + "</s>",
             call("multiply", '{"a": 3, "c": 4}') + "</s>", "no tool</s>"]  # fmt: skip
    args = tiny_config(tmp_path, per_device_train_batch_size=3, num_generations=3,
                       max_completion_length=200, max_steps=2, logging_steps=10)  # fmt: skip
    data = [{"prompt": [{"role": "user", "content": "Multiply 3 and 4"}]}] * 4
    trainer = GRPOTrainer(make_tiny_model(tok), reward_len, args=args, train_dataset=data,
                          processing_class=tok, tools=[multiply])  # fmt: skip
    fake = _scripted_generate(tok, [first, ["Done</s>"]], calls, first_rows=3)
    with patch.object(trainer.model, "generate", side_effect=fake):
        trainer.train()
    assert calls == [3, 2, 3, 2]  # per step: the 3 rows, then the 2 that called the tool
    final = trainer.state.log_history[-1]
    assert final["tools/call_frequency"] == pytest.approx(2 / 3)
    assert final["tools/failure_frequency"] == pytest.approx(1 / 2)


class _Tally:
    def reset(self, **row):
        self.count = 0

    def bump(self, step: int) -> int:
        """Add to the tally.

        Args:
            step: How much to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def test_environment_tools_and_instances_are_where_trls_tests_look(tiny_tokenizer, tmp_path):
    # test_train_with_environment_owned_reward, test_train_with_environment_factory
    args = tiny_config(tmp_path, per_device_train_batch_size=3, num_generations=3)
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), args=args, train_dataset=CHAT_DATA,
                          processing_class=tiny_tokenizer, environment_factory=_Tally)  # fmt: skip
    names = [tool.__name__ for tool in trainer.tools]
    assert names == ["bump"]  # not reset, not get_reward
    assert trainer.reward_func_names == ["_Tally"]
    assert len(trainer.environments) == 1 and isinstance(trainer.environments[0], _Tally)
    assert trainer.tools[0].__self__ is trainer.environments[0]


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ("stream_dispatched", "Iterable datasets require `dispatch_batches=False`"),
        ("dict_factory_no_data", "requires a `train_dataset`"),
        ("unknown_environment", "not among the environments"),
    ],
)
def test_input_errors_carry_trls_phrases(tiny_tokenizer, tmp_path, case, phrase):
    from datasets import Dataset

    kwargs = dict(processing_class=tiny_tokenizer, train_dataset=SEVEN_DATA)
    options = {}
    if case == "stream_dispatched":  # no max_steps: the dispatch check comes first, as in TRL
        kwargs["train_dataset"] = Dataset.from_list(SEVEN_DATA).to_iterable_dataset()
        options = dict(accelerator_config={"dispatch_batches": True}, max_steps=-1)
    elif case == "dict_factory_no_data":
        kwargs.update(train_dataset=None, environment_factory={"a": _Tally, "b": _Tally})
    else:
        rows = [{**r, "environment": "unknown"} for r in CHAT_DATA]
        kwargs.update(train_dataset=rows, environment_factory={"tally": _Tally})
    with pytest.raises(ValueError, match=phrase):
        GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes,
                    args=tiny_config(tmp_path, **options), **kwargs)  # fmt: skip


def test_a_streamed_eval_set_gets_one_worker_the_train_set_keeps_its(tiny_tokenizer, tmp_path):
    # test_iterable_eval_keeps_map_style_train_workers
    from datasets import Dataset

    stream = Dataset.from_list(SEVEN_DATA[:4]).to_iterable_dataset()
    args = tiny_config(tmp_path, dataloader_num_workers=2)
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes, args=args,
                          train_dataset=SEVEN_DATA, eval_dataset=stream,
                          processing_class=tiny_tokenizer)  # fmt: skip
    assert trainer.get_train_dataloader().num_workers == 2
    assert trainer.get_eval_dataloader().num_workers == 0
    assert trainer.args.dataloader_num_workers == 2  # scoped, not persisted


def _lora(**kw):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, **kw)


@pytest.mark.parametrize(
    ("peft", "error", "phrase"),
    [
        (lambda: _lora(target_modules=["q_proj", "v_proj", "lm_head"]), ValueError, "lm_head"),
        ("prompt", ValueError, "prompt-learning"),
        (lambda: _lora(target_modules=["q_proj", "v_proj"]), ImportError, "liger-kernel"),
        (lambda: _lora(target_modules=["q_proj"], modules_to_save=["lm_head"]), ImportError,
         "liger-kernel"),
        (lambda: None, ImportError, "liger-kernel"),
    ],
)  # fmt: skip
def test_use_liger_kernel_is_decided_per_case_with_trls_reasons(
    tiny_tokenizer, tmp_path, peft, error, phrase
):
    # test_liger_kernel_with_peft_*: without liger-kernel installed (as here), TRL's allowed
    # setups raise ImportError; the refused ones name their reason first
    if peft == "prompt":
        from peft import PromptTuningConfig, TaskType

        config = PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=8)
    else:
        config = peft()
    args = tiny_config(tmp_path, use_liger_kernel=True)  # accepted by the config, as in TRL
    with pytest.raises(error, match=phrase):
        GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes, args=args,
                    train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer,
                    peft_config=config)  # fmt: skip


def test_training_step_gets_the_generation_batch_as_trls_sampler_orders_it(tiny_tokenizer,
                                                                           tmp_path):  # fmt: skip
    # test_prepare_input_called_with_correct_data: each prompt G times in a row, the whole
    # generation batch at every micro-step of its steps_per_generation * num_iterations
    from unittest.mock import patch

    args = tiny_config(tmp_path, gradient_accumulation_steps=3, steps_per_generation=4,
                       num_generations=4, per_device_train_batch_size=6, num_iterations=2,
                       shuffle_dataset=False, max_steps=-1, num_train_epochs=1)  # fmt: skip
    data = [{"prompt": r["prompt"]} for r in SEVEN_DATA[:13]]  # 2 generation batches of 6
    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes, args=args,
                          train_dataset=data, processing_class=tiny_tokenizer)  # fmt: skip
    with patch.object(GRPOTrainer, "training_step", wraps=trainer.training_step) as step:
        trainer.train()
    assert step.call_count == 16  # 2 generation batches x 4 steps_per_generation x 2 iterations
    for call, first in zip(step.call_args_list, [0] * 8 + [6] * 8):
        assert call.args[1] == [p for p in data[first : first + 6] for _ in range(4)]


def test_a_replaced_generate_that_drops_the_prompt_is_refused(tiny_tokenizer, tmp_path):
    from unittest.mock import patch

    def completions_only(input_ids, **kwargs):  # not transformers' contract: no prompt ids
        return torch.full((input_ids.shape[0], 4), 7, device=input_ids.device)

    trainer = GRPOTrainer(make_tiny_model(tiny_tokenizer), char_codes, args=tiny_config(tmp_path),
                          train_dataset=SEVEN_DATA, processing_class=tiny_tokenizer)  # fmt: skip
    with patch.object(trainer.model, "generate", side_effect=completions_only):
        with pytest.raises(ValueError, match="input ids followed by its new tokens"):
            trainer.train()
