"""Evaluation during training on tiny models: the schedule, TRL's keys, pass@k, the hook, named
and iterable eval sets, and that evaluating leaves the training run unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SEVEN_DATA, frac_sevens, make_tiny_model, make_trainer, tiny_config
from datasets import Dataset, IterableDataset

from grpo_plugin import GRPOTrainer

# TRL 1.16's GRPOTrainer.evaluate() keys for one reward function `frac_sevens` at beta = 0
# (captured from trl.GRPOTrainer on a tiny model), without `eval_model_preparation_time`, a
# timing of the Trainer's evaluation loop, which we do not run.
TRL_EVAL_KEYS = {
    "epoch", "eval_clip_ratio/high_max", "eval_clip_ratio/high_mean", "eval_clip_ratio/low_mean",
    "eval_clip_ratio/low_min", "eval_clip_ratio/region_mean", "eval_completions/clipped_ratio",
    "eval_completions/max_length", "eval_completions/max_terminated_length",
    "eval_completions/mean_length", "eval_completions/mean_terminated_length",
    "eval_completions/min_length", "eval_completions/min_terminated_length", "eval_entropy",
    "eval_frac_reward_zero_std", "eval_loss", "eval_num_tokens", "eval_reward", "eval_reward_std",
    "eval_rewards/frac_sevens/mean", "eval_rewards/frac_sevens/std", "eval_runtime",
    "eval_samples_per_second", "eval_steps_per_second",
}  # fmt: skip
EVAL_DATA = SEVEN_DATA[:6]


def _with_hook(tokenizer, tmp_path, eval_metrics, eval_data, **overrides):
    return GRPOTrainer(
        make_tiny_model(tokenizer),
        frac_sevens,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=SEVEN_DATA,
        eval_dataset=eval_data,
        processing_class=tokenizer,
        eval_metrics=eval_metrics,
    )


def _rows(trainer):
    path = trainer.args.output_dir + "/metrics.jsonl"
    return [json.loads(line) for line in open(path).read().splitlines()]


def test_tiny_run_evaluates_at_steps_2_and_4_with_pass_at_4(tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, eval_data=EVAL_DATA, max_steps=4, eval_strategy="steps",
        eval_steps=2, num_generations_eval=4, per_device_eval_batch_size=8,
    )  # fmt: skip
    trainer.train()
    evals = [r for r in _rows(trainer) if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for row in evals:
        assert row["eval_n"] == 6
        assert 0.0 <= row["eval_accuracy"] <= 1.0 and 0.0 <= row["eval_pass@4"] <= 1.0
        assert row["eval_runtime"] > 0
    metrics = trainer.evaluate()
    assert TRL_EVAL_KEYS <= set(metrics), TRL_EVAL_KEYS - set(metrics)
    assert {"eval_accuracy", "eval_n", "eval_pass@4"} <= set(metrics)
    # 6 prompts x 4 samples, 8 completions per chunk: 2 prompts per chunk, 3 chunks
    assert metrics["eval_samples_per_second"] == pytest.approx(6 / metrics["eval_runtime"], 1e-2)


def test_pass_at_k_and_accuracy_from_scripted_rewards(tiny_tokenizer, tmp_path):
    """Prompts with an even index are always right, odd ones never: accuracy and pass@4 are 1/2,
    and the reward means count every sampled completion."""

    def by_parity(prompts, completions, index, **kw):
        return [float(i % 2 == 0) for i in index]

    data = [{"prompt": f"{i}+{i}=", "index": i} for i in range(4)]
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, by_parity, eval_data=data, num_generations_eval=4,
        per_device_eval_batch_size=16,
    )  # fmt: skip
    global_rng = torch.get_rng_state()
    metrics = trainer.evaluate()
    assert torch.equal(torch.get_rng_state(), global_rng), "evaluation drew from the global RNG"
    assert metrics["eval_accuracy"] == 0.5 and metrics["eval_n"] == 4
    assert metrics["eval_pass@4"] == 0.5
    assert metrics["eval_reward"] == 0.5 and metrics["eval_rewards/by_parity/mean"] == 0.5
    assert metrics["eval_frac_reward_zero_std"] == 1.0  # every group of 4 agrees
    assert metrics["eval_loss"] == 0.0  # all advantages are 0


def test_greedy_only_when_num_generations_eval_is_1(tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, eval_data=EVAL_DATA, num_generations_eval=1,
        per_device_eval_batch_size=4,
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert not any(k.startswith("eval_pass@") for k in metrics)
    assert metrics["eval_loss"] == 0.0 and metrics["eval_frac_reward_zero_std"] == 1.0
    assert metrics["eval_num_tokens"] > 0
    assert "eval_entropy" not in metrics  # no forward pass for a loss that is 0 by construction


def test_kl_to_the_reference_when_beta_is_positive(tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, eval_data=EVAL_DATA, beta=0.04, num_generations_eval=1
    )
    assert trainer.evaluate()["eval_kl"] == 0.0  # the policy is still the reference
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_kl"] > 0 and metrics["eval_entropy"] > 0
    # one completion per prompt: advantage 0, so the dapo loss is beta * the token-mean KL
    assert metrics["eval_loss"] == pytest.approx(0.04 * metrics["eval_kl"], rel=1e-4)


def test_evaluating_does_not_change_training(tiny_tokenizer, tmp_path):
    def run(name, **evaluation):
        trainer = make_trainer(
            tiny_tokenizer, tmp_path / name, eval_data=EVAL_DATA, max_steps=4, **evaluation
        )
        trainer.train()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        return rewards, [p.detach().clone() for p in trainer.model.parameters()]

    plain_rewards, plain_weights = run("plain")
    eval_rewards, eval_weights = run(
        "evaluated", eval_strategy="steps", eval_steps=1, num_generations_eval=4
    )
    assert eval_rewards == plain_rewards
    assert all(torch.equal(a, b) for a, b in zip(plain_weights, eval_weights))


def test_eval_metrics_hook_sees_greedy_completions_and_columns(tiny_tokenizer, tmp_path):
    seen = {}

    def exact(prompts, completions, completion_ids, answer, **columns):
        seen.update(prompts=prompts, completions=completions, answer=answer, ids=completion_ids)
        return {"exact": sum(c.strip() == a for c, a in zip(completions, answer)), "rows": 4}

    trainer = _with_hook(tiny_tokenizer, tmp_path, exact, SEVEN_DATA[:4], num_generations_eval=2)
    metrics = trainer.evaluate()
    assert seen["prompts"] == ["0+0=", "1+1=", "2+2=", "3+3="]  # one greedy completion each
    assert seen["answer"] == ["0", "2", "4", "6"] and len(seen["completions"]) == 4
    assert all(isinstance(c, str) for c in seen["completions"])
    assert metrics["eval_rows"] == 4.0 and 0 <= metrics["eval_exact"] <= 4
    last = _rows(trainer)[-1]
    assert last["eval_rows"] == 4.0


def test_hook_from_a_file_path(tiny_tokenizer, tmp_path):
    module = tmp_path / "my_metrics.py"
    module.write_text(
        "def count(prompts, completions, **kw):\n    return {'count': len(prompts)}\n"
    )
    hook = f"{module}:count"
    trainer = _with_hook(tiny_tokenizer, tmp_path, hook, SEVEN_DATA[:3], num_generations_eval=1)
    assert trainer.evaluate()["eval_count"] == 3.0


def test_a_failing_hook_is_named(tiny_tokenizer, tmp_path):
    def broken_f1(**kw):
        raise KeyError("gold")

    trainer = _with_hook(
        tiny_tokenizer, tmp_path, broken_f1, SEVEN_DATA[:2], num_generations_eval=1
    )
    with pytest.raises(RuntimeError, match="eval_metrics function 'broken_f1' raised KeyError"):
        trainer.evaluate()


def test_named_and_iterable_eval_sets_get_their_own_prefix(tiny_tokenizer, tmp_path):
    def rows():
        yield from SEVEN_DATA[10:13]

    streamed = IterableDataset.from_generator(rows)  # columns unknown up front
    sets = {"small": Dataset.from_list(SEVEN_DATA[:2]), "streamed": streamed}
    trainer = make_trainer(tiny_tokenizer, tmp_path, eval_data=sets, num_generations_eval=1)
    metrics = trainer.evaluate()
    assert metrics["eval_small_n"] == 2 and metrics["eval_streamed_n"] == 3
    assert "eval_small_loss" in metrics and "eval_streamed_reward" in metrics
    assert "eval_accuracy" not in metrics
    assert trainer.evaluate("small").keys() >= {"eval_small_accuracy"}
    assert trainer.evaluate(Dataset.from_list(SEVEN_DATA[:1]))["eval_n"] == 1
    assert len([r for r in _rows(trainer) if "eval_small_n" in r]) == 2  # one line per evaluate()


def test_eval_rows_without_a_prompt_fail_clearly(tiny_tokenizer, tmp_path):
    streamed = IterableDataset.from_generator(lambda: iter([{"question": "1+1="}]))
    trainer = make_trainer(tiny_tokenizer, tmp_path, eval_data=SEVEN_DATA[:1])
    with pytest.raises(ValueError, match="no 'prompt'"):
        trainer.evaluate(streamed)


def test_hook_metric_for_best_model_missing_fails_at_the_first_evaluation(tiny_tokenizer, tmp_path):
    """A hook's metric names are known only once it has run: checked at the first evaluation."""
    trainer = _with_hook(
        tiny_tokenizer, tmp_path, lambda **kw: {"precision": 1.0}, EVAL_DATA,
        num_generations_eval=1, eval_strategy="steps", eval_steps=1, metric_for_best_model="f1",
    )  # fmt: skip
    with pytest.raises(ValueError, match="metric_for_best_model='f1' is not among"):
        trainer.train()


def test_the_eval_loss_is_the_training_objectives(tiny_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, eval_data=EVAL_DATA[:2], num_generations_eval=2,
        per_device_eval_batch_size=4, entropy_coef=0.1,
    )  # fmt: skip
    objective, losses = trainer.training_objective, []
    computed = objective.evaluation_loss

    def recorded(*args):
        loss, metrics = computed(*args)
        losses.append(loss.item())
        return loss, metrics

    objective.evaluation_loss = recorded
    metrics = trainer.evaluate()
    assert len(losses) == 1 and metrics["eval_loss"] == pytest.approx(losses[0])  # one chunk
    # TRL's eval loss: the policy term minus the entropy bonus, as in training
    bonus = 0.1 * metrics["eval_entropy"]
    assert metrics["eval_loss"] == pytest.approx(metrics["eval_policy_loss"] - bonus, rel=1e-5)
