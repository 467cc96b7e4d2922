"""`trainer.state.log_history` as TRL 1.16 writes it: TRL's GRPOTrainer and ours run the same tiny
configurations, and every key TRL logs (train entries, the final entry beside `train_runtime`,
eval entries) is in ours too. Ours may log more, never less."""

from __future__ import annotations

import pytest
import torch
import trl
from conftest import char_codes, frac_sevens, make_tiny_model
from datasets import Dataset
from scripted_policy import multiply

import grpo_plugin

DATA = Dataset.from_list([{"prompt": f"{i}+{i}="} for i in range(16)])
CHAT_DATA = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"Multiply {i} and 3"}]} for i in range(16)]
)
BASE = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
            max_steps=3, logging_steps=2, save_strategy="no", report_to="none",
            disable_tqdm=True, use_cpu=True, seed=0)  # fmt: skip
CONFIGS = {
    "weighted": dict(reward_weights=[1.0, 0.5]),
    "normalize_then_sum": dict(reward_weights=[2.0, 0.5], multi_objective_aggregation="normalize_then_sum"),
    "entropy_kl_eval": dict(reward_weights=[1.0, 0.5], entropy_coef=0.01, beta=0.04,
                            eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4),
}  # fmt: skip


def answer_length(completions, **kwargs):
    return [len(c[-1]["content"]) / 10 for c in completions]


def run(package, model, tokenizer, tmp_path, options: dict, tools=None, data=DATA):
    out = str(tmp_path / package.__name__)
    args = package.GRPOConfig(output_dir=out, **{**BASE, **options})
    evaluating = options.get("eval_strategy") is not None
    trainer = package.GRPOTrainer(
        model,
        [frac_sevens, char_codes] if tools is None else [answer_length],
        args=args,
        train_dataset=data,
        eval_dataset=data.select(range(4)) if evaluating else None,
        processing_class=tokenizer,
        tools=tools,
    )
    trainer.train()
    return trainer


def key_sets(log_history: list[dict]) -> dict[str, set]:
    """The keys of the train entries, of the final entry and of the eval entries."""
    train = [e for e in log_history if "loss" in e]
    final = [e for e in log_history if "train_runtime" in e]
    evals = [e for e in log_history if "eval_loss" in e]
    assert train and len(final) == 1
    out = {"train": set().union(*train), "final": set(final[0])}
    if evals:
        out["eval"] = set().union(*evals)
    return out


def assert_ours_has_trl_keys(theirs, ours) -> None:
    t, o = key_sets(theirs.state.log_history), key_sets(ours.state.log_history)
    assert t.keys() == o.keys()
    missing = {kind: sorted(t[kind] - o[kind]) for kind in t if t[kind] - o[kind]}
    assert missing == {}


@pytest.mark.parametrize("name", CONFIGS)
def test_log_history_has_every_key_trl_logs(tiny_tokenizer, tiny_model_dir, tmp_path, name):
    options = CONFIGS[name]
    theirs = run(trl, str(tiny_model_dir), tiny_tokenizer, tmp_path, options)
    ours = run(grpo_plugin, str(tiny_model_dir), tiny_tokenizer, tmp_path, options)
    assert_ours_has_trl_keys(theirs, ours)
    final = ours.state.log_history[-1]
    # the final entry carries the window since the last log (step 3), as TRL's does
    assert {"reward", "rewards/frac_sevens/mean", "rewards/char_codes/mean"} <= set(final)
    weights = options["reward_weights"]
    for entry in [e for e in ours.state.log_history if "reward" in e]:
        # `reward`: the weighted sum of the raw rewards, in both aggregation modes (as TRL logs it)
        weighted = sum(
            w * entry[f"rewards/{n}/mean"] for w, n in zip(weights, ["frac_sevens", "char_codes"])
        )
        assert entry["reward"] == pytest.approx(weighted, rel=1e-5)


def test_log_history_with_tools_has_every_key_trl_logs(tiny_tokenizer, tmp_path):
    from template_tokenizers import template_tokenizer

    # TRL needs a template that renders tool calls (it swaps in its training template);
    # ours trains the tiny ChatML tokenizer's template with tools. Key names do not depend on it.
    trl_tokenizer = template_tokenizer("qwen2_5")
    theirs = run(trl, make_tiny_model(trl_tokenizer), trl_tokenizer, tmp_path, {}, [multiply],
                 CHAT_DATA)  # fmt: skip
    ours = run(grpo_plugin, make_tiny_model(tiny_tokenizer), tiny_tokenizer, tmp_path, {},
               [multiply], CHAT_DATA)  # fmt: skip
    assert_ours_has_trl_keys(theirs, ours)
    assert "tools/call_frequency" in ours.state.log_history[-1]


def test_num_tokens_counts_prompt_and_completion_tokens(tiny_tokenizer, tiny_model_dir, tmp_path):
    ours = run(grpo_plugin, str(tiny_model_dir), tiny_tokenizer, tmp_path, {"logging_steps": 1})
    counts = [e["num_tokens"] for e in ours.state.log_history if "num_tokens" in e]
    assert len(counts) == 3 and counts == sorted(counts) and counts[0] > 0
    assert ours.state.num_input_tokens_seen == counts[-1]
    assert torch.tensor(counts).diff().min() > 0


def test_default_logging_steps_is_trls_and_the_final_entry_carries_the_metrics(
    tiny_tokenizer, tiny_model_dir, tmp_path
):
    """Issue 48 item 1: TRL's default `logging_steps=10`, so a short run's `log_history[-1]` (the
    summary beside `train_runtime`) carries the averaged metrics, as `log_history[-1]["reward"]` in
    TRL's tests and users' notebooks reads it; metrics.jsonl still has one line per step."""
    from grpo_plugin.run.rundir import read_metrics

    assert grpo_plugin.GRPOConfig(output_dir=str(tmp_path)).logging_steps == 10
    options = {k: v for k, v in BASE.items() if k != "logging_steps"}
    out = str(tmp_path / "default")
    trainer = grpo_plugin.GRPOTrainer(
        str(tiny_model_dir),
        [frac_sevens, char_codes],
        args=grpo_plugin.GRPOConfig(output_dir=out, **options),
        train_dataset=DATA,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    history = trainer.state.log_history
    assert len(history) == 1 and "train_runtime" in history[-1]  # 3 steps < 10: one entry
    assert {"reward", "rewards/frac_sevens/mean", "rewards/char_codes/mean"} <= set(history[-1])
    steps = [row for row in read_metrics(out) if "train_runtime" not in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    for row in steps:
        assert {"loss", "grad_norm", "learning_rate", "reward"} <= set(row)
    # the summary's reward is the average of the three steps' rewards
    mean = sum(row["reward"] for row in steps) / 3
    assert history[-1]["reward"] == pytest.approx(mean, rel=1e-5)
