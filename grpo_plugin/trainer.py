"""`GRPOTrainer`: orchestration only. The pieces live elsewhere:

config (`config.py`) -> group sampling (`rollout.py`) -> rewards (`scoring.py`, `reward_fns`) ->
advantages and loss (`objectives.py`) -> log-probs (`logprobs.py`) -> logs (`callbacks.py`).

How it differs from TRL's trainer: each distinct prompt is prefilled once and its KV cache shared by
its G completions (generation and training forward); no reference pass at beta == 0 and no
old-policy pass when the rollout is used on-policy; DAPO dynamic sampling; reward-function errors
name the function and the sample.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, Trainer, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .batching import (
    PromptBatchSampler,
    identity_collate,
    shared_group_size,
    shuffle_groups,
    slice_buffer,
)
from .callbacks import MetricsJsonlCallback, RichProgressCallback, write_completions_parquet
from .config import GRPOConfig
from .dynamic_sampling import ScoredRollout, refill
from .logprobs import completion_logprobs
from .models import prepare_tokenizer
from .objectives import group_advantages, policy_loss
from .policy import (
    build_reference,
    eval_mode,
    load_model,
    load_tokenizer,
    reference_mode,
    wrap_policy,
)
from .prompts import sample_groups
from .rollout_metrics import completion_records, reward_metrics, run_summary
from .scoring import combine_rewards, reward_name, score_completions

logger = logging.getLogger(__name__)
# Metrics summed per optimizer step (then averaged over the logging window), not averaged per call.
_PER_STEP_SUMS = ("timing/generate_s", "timing/reward_s", "timing/train_s")


def check_prompt_dataset(dataset: Any, name: str) -> Any:
    """Accept a datasets.Dataset or a list of dicts; require a `prompt` column."""
    if dataset is None:
        return None
    if isinstance(dataset, list):
        from datasets import Dataset

        dataset = Dataset.from_list(dataset)
    columns = getattr(dataset, "column_names", None) or []
    if "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {columns}). Rename the column holding the "
            "prompt text or chat messages, e.g. dataset.rename_column('question', 'prompt')."
        )
    return dataset


def resolve_reward_funcs(reward_funcs: Any) -> list[Callable]:
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError("reward_funcs is empty: pass at least one reward function or name.")
    resolved = []
    for f in funcs:
        if not callable(f):
            import reward_fns

            f = reward_fns.resolve(f)
        resolved.append(f)
    return resolved


class GRPOTrainer(Trainer):
    """TRL-compatible GRPO trainer (see `GRPOConfig` for every option)."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Callable | str | Sequence[Callable | str],
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
    ):
        model_name = model if isinstance(model, str) else model.config._name_or_path
        args = args or GRPOConfig(output_dir=f"{Path(str(model_name)).name}-GRPO")
        if not isinstance(args, GRPOConfig):
            raise TypeError(f"args must be a grpo_plugin.GRPOConfig, got {type(args).__name__}.")
        # Cheap checks first: nothing is loaded before the inputs are known to be usable.
        train_dataset = check_prompt_dataset(train_dataset, "train_dataset")
        eval_dataset = check_prompt_dataset(eval_dataset, "eval_dataset")
        self.reward_funcs = resolve_reward_funcs(reward_funcs)
        weights = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(weights)} entries for {len(self.reward_funcs)} reward "
                "functions; give one weight per function."
            )
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        if isinstance(model, str):
            model = load_model(model, args)
        elif args.model_init_kwargs:
            raise ValueError("model_init_kwargs only applies when `model` is a string; drop it.")
        tokenizer = processing_class or load_tokenizer(
            model, model_name if isinstance(model_name, str) else None
        )
        processing_class = prepare_tokenizer(tokenizer)
        self.model_name = str(model_name)
        set_seed(args.seed)  # LoRA initialisation draws from the global RNG: seed it first
        model = wrap_policy(model, peft_config, args)
        self.ref_model = build_reference(model, args.beta)
        self._hub_token, args.hub_token = args.hub_token, None  # never saved with the args
        super().__init__(
            model=model,
            args=args,
            data_collator=identity_collate,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.loss_is_scaled_for_ga = False  # the Trainer divides each micro-loss by GA
        self.model_accepts_loss_kwargs = False
        self.remove_callback(PrinterCallback)
        self.remove_callback(ProgressCallback)
        self.add_callback(MetricsJsonlCallback())
        if not args.disable_tqdm:
            self.add_callback(RichProgressCallback())
        if self.ref_model is not None:
            self.ref_model.to(self.args.device)
        self._buffer: dict[str, torch.Tensor] | None = None
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._seen_step, self._micro = -1, 0
        self._last_logged_step = 0
        self._zero_std_streak = 0
        self._rng = torch.Generator().manual_seed(args.seed)
        self._share_group = shared_group_size(
            args.num_generations, args.per_device_train_batch_size
        )

    # --- data ----------------------------------------------------------------------------------
    def _get_train_sampler(self, train_dataset=None) -> PromptBatchSampler:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        a = self.args
        repeats = a.steps_per_generation * a.num_iterations
        return PromptBatchSampler(
            len(dataset), a.prompts_per_generation, repeats, a.shuffle_dataset, a.seed
        )

    def get_train_dataloader(self):
        if self.train_dataset is None:
            raise ValueError("GRPOTrainer.train() needs a train_dataset with a 'prompt' column.")
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self.args.prompts_per_generation,
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    # --- rollout -------------------------------------------------------------------------------
    def _generate_and_score(self, rows: list[dict]) -> ScoredRollout:
        a, G = self.args, self.args.num_generations
        t0 = time.perf_counter()
        model = self.accelerator.unwrap_model(self.model)
        with eval_mode(model):
            s = sample_groups(
                model, self.processing_class, rows, num_generations=G,
                max_new_tokens=a.max_completion_length, max_prompt_length=a.max_prompt_length,
                chat_template_kwargs=a.chat_template_kwargs, temperature=a.temperature,
                top_p=a.top_p, top_k=a.top_k or None, repetition_penalty=a.repetition_penalty,
                share_prompt_prefix=a.share_prompt_prefix, generator=self._rng,
            )  # fmt: skip
        t1 = time.perf_counter()
        per_func = score_completions(
            self.reward_funcs, s.prompts, s.completions, s.completion_ids, s.columns
        )  # (N, F)
        self._metrics["timing/generate_s"].append(t1 - t0)
        self._metrics["timing/reward_s"].append(time.perf_counter() - t1)
        self._metrics["generation/tokens_per_s"].append(
            s.batch.num_generated_tokens / max(t1 - t0, 1e-9)
        )
        rewards = combine_rewards(per_func, self.reward_weights)
        return ScoredRollout(rows, s.batch, s.completions, per_func, rewards)

    def _fresh_rows(self, k: int) -> list[dict]:
        idx = torch.randperm(len(self.train_dataset), generator=self._rng)[:k].tolist()
        return [self.train_dataset[i] for i in idx]

    def _rollout(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        a, G = self.args, self.args.num_generations
        scored = self._generate_and_score(rows)
        self._log_reward_stats(scored)
        if a.dynamic_sampling:
            sample = lambda k: self._generate_and_score(self._fresh_rows(k))  # noqa: E731
            scored, filtered = refill(
                scored, G, sample, a.max_resample_rounds, self.processing_class.pad_token_id
            )
            self._metrics["dynamic_sampling/filtered_groups"].append(filtered)
        b = scored.batch
        advantages = group_advantages(scored.rewards.view(-1, G), estimator=a.estimator).reshape(-1)
        loss_mask = b.completion_mask.clone()
        if a.mask_truncated_completions:
            loss_mask[b.is_truncated] = 0
        buffer = {
            "prompt_ids": b.prompt_ids, "prompt_mask": b.prompt_mask,
            "completion_ids": b.completion_ids, "completion_mask": b.completion_mask,
            "loss_mask": loss_mask, "advantages": advantages.float(),
        }  # fmt: skip
        buffer = {k: v.to(self.args.device) for k, v in buffer.items()}
        with torch.no_grad():
            if a.needs_old_logps:
                buffer["old_logps"] = self._logps(self.model, buffer)[0]
            if a.beta > 0:
                with reference_mode(
                    self.accelerator.unwrap_model(self.model), self.ref_model
                ) as ref:
                    buffer["ref_logps"] = self._logps(ref, buffer)[0]
        if a.log_completions:
            self._write_completions(scored, advantages)
        if a.per_device_train_batch_size % G == 0 and (
            a.num_iterations > 1 or a.steps_per_generation > 1
        ):
            buffer = shuffle_groups(buffer, G, self._rng)
        self._mean_slice_tokens = float(loss_mask.sum()) / a.steps_per_generation
        return buffer

    def _log_reward_stats(self, s: ScoredRollout) -> None:
        names = [reward_name(fn) for fn in self.reward_funcs]
        for key, value in reward_metrics(s, self.args.num_generations, names).items():
            self._metrics[key].append(value)
        self._warn_on_zero_std(self._metrics["frac_reward_zero_std"][-1])

    def _warn_on_zero_std(self, frac_zero: float) -> None:
        self._zero_std_streak = self._zero_std_streak + 1 if frac_zero >= 1.0 else 0
        if self._zero_std_streak == self.args.zero_std_patience:
            logger.warning(
                "For %d rollouts in a row every group's G rewards were identical, so every advantage "
                "and the policy loss are 0 and nothing is learned. The task is too hard or too easy "
                "for the model: raise num_generations or temperature, use an easier or partial-credit "
                "reward, or enable dynamic_sampling.",
                self._zero_std_streak,
            )

    def _write_completions(self, s: ScoredRollout, advantages: torch.Tensor) -> None:
        if not self.is_world_process_zero():
            return
        names = [reward_name(fn) for fn in self.reward_funcs]
        records = completion_records(s, advantages, names, self.state.global_step)
        name = f"step_{self.state.global_step:05d}.parquet"
        write_completions_parquet(Path(self.args.output_dir) / "completions" / name, records)

    # --- loss ----------------------------------------------------------------------------------
    def _logps(self, model, inputs: dict[str, torch.Tensor], entropy: bool = False):
        return completion_logprobs(
            model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
            inputs["completion_mask"], temperature=self.args.temperature,
            chunk_size=self.args.logprob_chunk_size, group_size=self._share_group,
            share_prompt_prefix=self.args.share_prompt_prefix, return_entropy=entropy,
        )  # fmt: skip

    def _prepare_inputs(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        a = self.args
        if self.state.global_step != self._seen_step:
            self._seen_step, self._micro = self.state.global_step, 0
        micro = self.state.global_step * a.gradient_accumulation_steps + self._micro
        self._micro += 1
        if micro % (a.steps_per_generation * a.num_iterations) == 0 or self._buffer is None:
            self._buffer = self._rollout(rows)
        return slice_buffer(
            self._buffer, micro % a.steps_per_generation, a.per_device_train_batch_size
        )

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        spent_before = sum(self._metrics["timing/generate_s"]) + sum(
            self._metrics["timing/reward_s"]
        )
        loss = super().training_step(model, inputs, num_items_in_batch)
        spent = sum(self._metrics["timing/generate_s"]) + sum(self._metrics["timing/reward_s"])
        self._metrics["timing/train_s"].append(time.perf_counter() - start - (spent - spent_before))
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        a = self.args
        logps, entropy = self._logps(model, inputs, entropy=True)  # (n, T)
        mask = inputs["loss_mask"]
        loss, stats = policy_loss(
            logps, inputs.get("old_logps"), inputs.get("ref_logps"), inputs["advantages"], mask,
            loss_type=a.loss_type, importance_sampling_level=a.importance_sampling_level,
            epsilon_low=a.epsilon, epsilon_high=a.epsilon_high, beta=a.beta,
            max_completion_length=a.max_completion_length,
        )  # fmt: skip
        if a.loss_type == "dapo":  # per-token mean over the whole rollout, not this micro-batch
            loss = loss * max(float(mask.sum()), 1.0) / max(self._mean_slice_tokens, 1.0)
        for key in ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region"):
            self._metrics[f"{key}_mean"].append(stats[key])
        if "kl" in stats:
            self._metrics["kl"].append(stats["kl"])
        valid = inputs["completion_mask"].bool()
        if entropy is not None and valid.any():
            self._metrics["entropy"].append(entropy[valid].mean().item())
        return (loss, None) if return_outputs else loss

    # --- logging, evaluation, saving --------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log: add this window's rollout metrics
            steps = max(1, self.state.global_step - self._last_logged_step)
            for key, values in self._metrics.items():
                if values:
                    logs[key] = sum(values) / (steps if key in _PER_STEP_SUMS else len(values))
            self._metrics.clear()
            self._last_logged_step = self.state.global_step
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Greedy held-out accuracy under the first reward function (1.0 = correct)."""
        from .evaluate import evaluate as run_eval

        dataset = check_prompt_dataset(eval_dataset, "eval_dataset") or self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset with a 'prompt' column.")
        model = self.accelerator.unwrap_model(self.model)
        result = run_eval(
            model, self.processing_class, dataset, self.reward_funcs[0], k=0,
            max_new_tokens=self.args.max_completion_length,
        )  # fmt: skip
        metrics = {f"{metric_key_prefix}_accuracy": result["accuracy"]}
        self.log(dict(metrics))
        self.control = self.callback_handler.on_evaluate(
            self.args, self.state, self.control, metrics
        )
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():
            out = Path(output_dir or self.args.output_dir)
            (out / "grpo_run.json").write_text(json.dumps(self.run_summary(), indent=2))

    def run_summary(self) -> dict[str, Any]:
        """The run facts that model cards need (`grpo_run.json`)."""
        model = self.accelerator.unwrap_model(self.model)
        return run_summary(
            self.args,
            model,
            self.model_name,
            self.reward_funcs,
            self.reward_weights,
            self.state.global_step,
        )

    def push_to_hub(self, repo_id: str | None = None, *, token: str | None = None, **kwargs) -> str:
        """Save, plot, write the model card and publish the output dir as one commit.

        `kwargs` go to `grpo_plugin.hub.publish` (private, merge, revision, commit_message, ...);
        the card is the same one `grpo-plugin publish` uploads.
        """
        from .card import plot_reward_curve, write_model_card
        from .hub import publish

        repo_id = repo_id or self.args.hub_model_id
        if not repo_id:
            raise ValueError("push_to_hub needs repo_id='user/name' (or GRPOConfig.hub_model_id).")
        out = Path(self.args.output_dir)
        self.save_model(str(out))
        if (out / "metrics.jsonl").exists():
            plot_reward_curve(out)
        write_model_card(out)
        return publish(out, repo_id, token=token or self._hub_token, **kwargs)
