"""`GRPOTrainer`: orchestration only. One optimizer step reads top to bottom:

    _prepare_inputs(rows)          a micro-batch of the rollout buffer (a new rollout when due)
      _build_rollout(rows)         the named steps of one rollout:
        _sample_and_score            G completions per prompt (rollout/), rewards (scoring/)
        _record_reward_metrics       TRL-named metrics, the zero-std alarm
        _refill                      DAPO dynamic sampling (rollout/dynamic_sampling.py)
        _training_batch              advantages (scoring/rollout_advantages.py), loss mask
        _add_policy_logps            old and reference log-probs, only when needed
        write_completions            completions/step_XXXXX.parquet (completions_log.py)
        _shuffle_for_reuse           group-preserving shuffle when the rollout is reused
    compute_loss(batch)            log-probs (engine/forward.py) -> the loss (objective.py: policy_loss
                                   of core/, entropy terms, MoE router loss)

How it differs from TRL's trainer: each distinct prompt is prefilled once and its KV cache shared by
its G completions (generation and training forward); with tools each completion keeps its KV cache
across turns (`rollout/multiturn.py`); no reference pass at beta == 0 and no old-policy pass when
the rollout is used on-policy; DAPO dynamic sampling; reward errors name function and sample.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, Trainer

from .. import distributed
from ..config.field_checks import warn_on_loss_combinations
from ..config.grpo_config import GRPOConfig
from ..core.batching import identity_collate, shared_group_size
from ..engine import CompletionLogprobs, CompletionTokens, PolicyEngine, TrainAsk, cpu_threads
from ..engine.prompt_grad import SharedPromptGrad
from ..evaluation.setup import check_eval_setup, eval_set_names, prefixed, resolve_eval_metrics
from ..evaluation.watch import RewardHackingCallback
from ..models.liger import check_liger
from ..models.policy import (
    build_reference,
    eval_mode,
    load_trainer_policy,
    reference_mode,
    trainer_init_kwargs,
)
from ..rollout.dynamic_sampling import refill
from ..rollout.noise import KeyedNoise, RolloutKey
from ..rollout.types import Rollout, TrainingBatch
from ..run import completions_log, guards, resume
from ..run import lock as run_lock
from ..run.state import RunState
from ..scoring.context import RewardContext
from ..scoring.sources import RewardSources
from . import autopilot
from .callbacks import SyncRefModelCallback, evaluation_progress, replace_default_callbacks
from .inputs import check_inputs, check_prompt_lengths_of
from .loaders import TrainerLoaders
from .metrics import MetricsWindow, ZeroStdWatch, reward_metrics, rollout_tokens
from .objective import TrainingObjective, shuffle_for_reuse, training_batch
from .run_hooks import RunHooks
from .sampling.rollouts import RolloutSampler
from .sampling.tool_inputs import ToolInputs, fork_user_code_worker
from .trl_attributes import TRLAttributes


def train_ask(args: GRPOConfig) -> TrainAsk:
    """What the config asks of the training forward's products (`PolicyEngine.train_precision`)."""
    autocast = bool(args.bf16 or args.fp16)
    return TrainAsk(args.train_precision, autocast, bool(args.gradient_checkpointing))


class GRPOTrainer(TRLAttributes, TrainerLoaders, RunHooks, Trainer):
    """TRL-compatible GRPO trainer (see `GRPOConfig` for every option). `dataset_names` (Hub ids
    of the training data) may be set after construction: `grpo_run.json` and the model card name
    them. `eval_dataset` may be a dict of named sets; `eval_metrics` (a callable or
    "module:function") adds task metrics to every evaluation (`evaluation/during_training.py`)."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Callable | str | PreTrainedModel | Sequence[Any] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list | None = None,
        rollout_func: Callable | None = None,
        environment_factory: Any = None,
        eval_metrics: Callable | str | None = None,
    ):
        model_name = model if isinstance(model, str) else model.config.name_or_path
        args = args or GRPOConfig(output_dir=f"{Path(str(model_name)).name}-GRPO")
        if not isinstance(args, GRPOConfig):
            raise TypeError(f"args must be a grpo_plugin.GRPOConfig, got {type(args).__name__}.")
        # Cheap checks first: nothing is loaded before the inputs are known to be usable.
        check_liger(args, model, peft_config)  # TRL's reasons, case by case
        tool_inputs = ToolInputs.check(tools, rollout_func, environment_factory, args)
        autopilot.check_inputs(args, tool_inputs)  # what auto_find_batch_size cannot plan for
        train_dataset = tool_inputs.owned_data(train_dataset, args)  # None: the environment's
        train_dataset, eval_dataset = check_inputs(model, args, train_dataset, eval_dataset)
        tool_inputs.check_dataset(train_dataset)
        # the output dir's files from earlier runs, before any write: train() claims the dir
        self.previous_run_files = run_lock.previous_run_files(args.output_dir)
        init_kwargs = trainer_init_kwargs(model, args, quantization_config, peft_config)
        context = RewardContext.of(self)  # trainer_state, log_extra and log_metric for rewards
        extra = tool_inputs.reward_functions()  # environments' get_reward, as in TRL
        r = RewardSources.resolve(
            reward_funcs, reward_processing_classes, args, init_kwargs, context, extra
        )
        self.rewards = r  # TRL's reward_funcs, reward_weights, ... read it (trl_attributes.py)
        fork_user_code_worker(r, tool_inputs, args)  # the user's code's process, before the model
        cpu_threads.apply(args)  # torch_threads: 'auto' looks at the free cores, before the load
        self.eval_metrics = resolve_eval_metrics(eval_metrics)
        eval_sets = eval_set_names(eval_dataset)
        check_eval_setup(args, eval_sets, self.reward_names, self.eval_metrics is not None)
        # The trainer keeps its own copy of the config: the user's object is never written to.
        args = copy.copy(args)
        self._hub_token, args.hub_token = args.hub_token, None  # never saved with the args
        self.model_name = str(model_name)
        self.dataset_names: list[str] = []
        # the policy's engine: which fast paths its forwards take on this device (engine/)
        self.engine = PolicyEngine.build(args.device, args.fast_paths)
        model, processing_class = load_trainer_policy(
            model, processing_class, peft_config, args, init_kwargs, self.model_name
        )
        self.engine.prepare_policy(model)  # the fused LoRA forward, admitted by its check
        self.train_precision = self.engine.train_precision(train_ask(args), model)
        check_prompt_lengths_of(train_dataset, processing_class, model.config, args)
        self.ref_model = build_reference(model, args.beta)
        self.tool_setup = tool_inputs.setup(processing_class, args)  # the template is checked
        self.tools, self.rollout_func = tool_inputs.public_tools(), rollout_func
        self._sampler = RolloutSampler(self, self.tool_setup, rollout_func, args, model)
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
        self._step_metrics = MetricsWindow()  # this optimizer step's, for metrics.jsonl
        replace_default_callbacks(self)
        self.eval_watch = RewardHackingCallback(prefixed("accuracy", (eval_sets or [""])[0]))
        self.add_callback(self.eval_watch)
        distributed.check_backend(self.accelerator)
        if self.ref_model is not None:
            self.ref_model.to(self.args.device)
        self._add_trl_features(args)
        self.loss_is_scaled_for_ga = False  # the Trainer divides each micro-loss by GA
        self.model_accepts_loss_kwargs = False
        # what a resume restores besides weights, optimizer, scheduler and RNG (run/state.py)
        synced = self.ref_model if args.sync_ref_model else None
        watches = ZeroStdWatch(args.zero_std_patience), self.eval_watch
        window = MetricsWindow(mirror=self._step_metrics)  # logging_steps' window; step's mirror
        self.run_state = RunState(window, *watches, synced_reference=synced)
        self._metrics = self.run_state.metrics  # the window the rollout's metrics go to
        self._seen_step, self._micro, self._rollout_key = -1, 0, RolloutKey(args.seed, 0)
        self.resume_plan = resume.ResumePlan()  # what train()'s resume checks found (resume.py)
        G, B = args.num_generations, args.per_device_train_batch_size
        self._share_group = shared_group_size(G, B)
        self._held_prompt = SharedPromptGrad(args.num_generations)  # a group over micro-batches

    def _add_trl_features(self, args: GRPOConfig) -> None:
        """The loss's extras (entropy, MoE router loss; state saved with checkpoints), reward
        models on the policy's device, TR-DPO reference syncing, TRL's warnings."""
        # the loss of one micro-batch and its extras (objective.py); evaluation's loss too
        self.training_objective = TrainingObjective.for_model(args, self.model, self.accelerator)
        self.rewards.place(self.args.device, args.chat_template_kwargs)
        if args.sync_ref_model:
            self.add_callback(
                SyncRefModelCallback.from_args(self.ref_model, args, self.accelerator)
            )
        warn_on_loss_combinations(args)

    def _prepare_inputs(self, rows: list[dict]) -> TrainingBatch:
        """The micro-batch for this accumulation step; a new rollout every
        `steps_per_generation * num_iterations` micro-steps."""
        a, rows = self.args, self.rollout_rows(rows)  # one row per prompt (loaders.py)
        if self.state.global_step != self._seen_step:
            self._seen_step, self._micro = self.state.global_step, 0
        micro = self.state.global_step * a.gradient_accumulation_steps + self._micro
        self._micro += 1
        per_rollout = a.steps_per_generation * a.num_iterations
        state = self.run_state
        if micro % per_rollout == 0 or state.rollout is None:
            self._rollout_key = RolloutKey(a.seed, micro // per_rollout)
            state.rollout = self._build_rollout(rows)
        index = micro % a.steps_per_generation
        return state.rollout.micro_batch(index, a.per_device_train_batch_size)

    # --- one rollout, step by step -------------------------------------------------------------
    def _build_rollout(self, rows: list[dict]) -> TrainingBatch:
        # Local phase: no collective inside, so processes may refill a different number of rounds;
        # an error on any process is raised on every process once it ends (distributed.py).
        with distributed.failures_shared(self.accelerator):
            with distributed.full_parameters(self.accelerator, self.model):
                sampled = self._sample_and_score(rows, self._rollout_key)
                rollout = self._refill(sampled) if self.args.dynamic_sampling else sampled
        self._record_reward_metrics(sampled)
        batch = self._training_batch(rollout).to(self.args.device)
        batch = self._add_policy_logps(batch)
        extra_columns, logged = self.rewards.context.pop_logged()  # log_extra, log_metric
        self._metrics.update(logged)
        if self.args.log_completions:
            completions_log.write_completions(self, rollout, batch.advantages, extra_columns)
        batch = self._shuffle_for_reuse(batch)
        # dapo's normaliser: the global rollout's loss tokens per micro-slice and process
        tokens = distributed.mean_over_processes(self.accelerator, float(batch.loss_mask.sum()))
        self.run_state.loss_tokens_per_slice = tokens / self.args.steps_per_generation
        return batch

    def _sample_and_score(self, rows: list[dict], key: RolloutKey) -> Rollout:
        a = self.args
        model = self.accelerator.unwrap_model(self.model)
        # draws keyed on each prompt's position in the global batch: the same on any process count
        first = distributed.global_prompt_offset(self.accelerator, a.prompts_per_generation)
        indices = range(first, first + len(rows))
        noise = KeyedNoise.for_prompts(key, indices, a.num_generations, a.max_completion_length)
        with eval_mode(model):  # one turn, tools or rollout_func; scored (overlapped or after)
            rollout, seconds = self._sampler.sample_and_score(model, rows, noise, self.rewards)
        for name, value in seconds.items():
            self._metrics.add(f"timing/{name}", value)
        tokens = rollout.batch.num_generated_tokens
        self._metrics.add("generation/tokens_per_s", tokens / max(seconds["generate_s"], 1e-9))
        return rollout

    def _record_reward_metrics(self, rollout: Rollout) -> None:
        pad_id = self.processing_class.pad_token_id
        rollout, _ = distributed.gather_rollout(self.accelerator, rollout, pad_id)
        metrics = reward_metrics(rollout, self.reward_names)  # over every process's completions
        metrics["num_tokens"] = self.state.num_input_tokens_seen = (
            self.state.num_input_tokens_seen + rollout_tokens(rollout)
        )  # TRL's
        self._metrics.update(metrics)
        self.run_state.zero_std.update(metrics, self.is_world_process_zero())

    def _refill(self, rollout: Rollout) -> Rollout:
        a, rounds = self.args, iter(range(1, self.args.max_resample_rounds + 1))

        def fresh(k: int) -> Rollout:
            key = replace(self._rollout_key, round=next(rounds))
            order = torch.randperm(len(self.train_dataset), generator=key.generator("refill"))
            idx = distributed.own_share(order.tolist(), self.accelerator)[:k]  # disjoint shares
            return self._sample_and_score([self.train_dataset[i] for i in idx], key)

        pad_id = self.processing_class.pad_token_id
        rollout, filtered = refill(rollout, a.num_generations, fresh, a.max_resample_rounds, pad_id)
        self._metrics.add("dynamic_sampling/filtered_groups", filtered)
        return rollout

    def _training_batch(self, rollout: Rollout) -> TrainingBatch:
        batch = training_batch(rollout, self.args, self.reward_weights, self.processing_class)
        guards.check_advantages(batch.advantages, rollout.rewards, self.state.global_step)
        return batch

    @torch.no_grad()
    def _add_policy_logps(self, batch: TrainingBatch) -> TrainingBatch:
        """Old log-probs when the rollout is reused after an update; reference ones when beta > 0."""
        if self.args.needs_old_logps:
            batch.old_logps = self._logps(self.model_wrapped, batch).logps
        if self.args.beta > 0:
            model = self.accelerator.unwrap_model(self.model)
            with reference_mode(model, self.ref_model) as ref:
                batch.ref_logps = self._logps(ref, batch).logps
        return batch

    def _shuffle_for_reuse(self, batch: TrainingBatch) -> TrainingBatch:
        return shuffle_for_reuse(batch, self.args, self._rollout_key.generator("shuffle"))

    # --- loss ----------------------------------------------------------------------------------
    def _logps(
        self, model, batch: TrainingBatch, entropy: bool = False, loss: bool = False
    ) -> CompletionLogprobs:
        """`CompletionLogprobs` of `model`, run through its DDP / FSDP wrapper; for the loss also the
        MoE aux loss and, if needed, entropy grads."""
        return distributed.forward_through(
            self.accelerator, model, lambda policy: self._policy_logps(policy, batch, entropy, loss)
        )

    def probe_logps(self, model, batch: TrainingBatch):
        """The training forward on the autopilot's probe micro-batch (prompt shared as in training)."""
        share = shared_group_size(self.args.num_generations, len(batch))
        sharing = self.args.share_prompt_prefix and (share or 0) >= 2  # 1 row: plain, no warning
        return self._policy_logps(model, batch, True, True, sharing=(share, sharing))

    def _policy_logps(self, model, batch: TrainingBatch, entropy: bool, loss: bool, sharing=None):
        """`sharing`: (rows per shared prompt, share at all); default the training micro-batch's."""
        group, share = sharing or (self._share_group, self.args.share_prompt_prefix)
        held = distributed.held_prompt(self.accelerator, self.args, self._held_prompt)
        a, objective = self.args, self.training_objective
        options = self.engine.options(
            temperature=a.temperature,
            chunk_size=a.logprob_chunk_size,
            group_size=group,
            share_prompt_prefix=distributed.shares_prefix(self.accelerator, share),
            padding_free=a.padding_free,
            pad_to_multiple_of=a.pad_to_multiple_of,
            return_entropy=entropy,
            entropy_grad=loss and objective.needs_entropy_grad,
            return_aux_loss=loss and objective.needs_aux_loss,
            bf16_products=self.train_precision == "bf16",
        )
        tokens = CompletionTokens(
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            batch.sampled_mask,  # with tools: log-probs of sampled tokens only
        )
        shared_prompt = held if loss and sharing is None and model.training else None
        return self.engine.logprobs(model, tokens, options, shared_prompt)

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        rollout_keys = ("timing/generate_s", "timing/reward_s")
        spent_before = self._metrics.total(*rollout_keys)
        try:
            loss = super().training_step(model, inputs, num_items_in_batch)
        except BaseException:
            self._held_prompt.discard()  # the step failed: nothing of it may reach a later one
            raise
        self._held_prompt.after_backward(step_ends=self.accelerator.sync_gradients)
        self._step_metrics.add("loss", loss.item())  # / GA already: the step's loss is the sum
        spent = self._metrics.total(*rollout_keys) - spent_before
        self._metrics.add("timing/train_s", time.perf_counter() - start - spent)
        self._metrics.add("step_time", time.perf_counter() - start)  # TRL's, rollout included
        return loss

    def compute_loss(
        self, model, inputs: TrainingBatch, return_outputs=False, num_items_in_batch=None
    ):
        out = self._logps(model, inputs, entropy=True, loss=True)  # (n, Tc) each
        loss, metrics = self.training_objective(
            out.logps,
            out.entropy,
            inputs,
            self.run_state.loss_tokens_per_slice,
            out.aux_loss,
            training=model.training,
        )
        guards.check_loss(loss, self.state.global_step)
        if model.training and self.args.use_vllm:  # the engine's sync, checked every micro-batch
            guards.check_rollout_drift(
                metrics, self.args.vllm_max_logp_drift, self.state.global_step
            )
        if model.training and self.accelerator.sync_gradients:
            metrics.update(self.training_objective.end_optimizer_step())
        self._metrics.update(metrics)
        return (loss, None) if return_outputs else loss

    # --- logging, evaluation, saving ------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if not any(key.startswith("eval_") for key in logs):  # every train log (final too), as TRL
            window = self._metrics.flush(self.state.global_step)
            logs.update(distributed.reduce_metrics(self.accelerator, window))
        super().log(logs, start_time)

    def step_log(self) -> dict[str, float]:
        """This optimizer step's metrics, reduced over processes (a collective): metrics.jsonl's
        line for the step (callbacks.py), whatever `logging_steps` is."""
        window = self._step_metrics.flush(self.state.global_step, steps=1)
        return distributed.reduce_metrics(self.accelerator, window) | {"epoch": self.state.epoch}

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Greedy accuracy, pass@k and TRL's eval metrics on the held-out set(s), logged once."""
        from ..evaluation.during_training import evaluate_trainer

        progress = partial(evaluation_progress, self)  # the progress board's task per set
        return evaluate_trainer(self, eval_dataset, metric_key_prefix, progress)

    # --- the run's batch plan and gradient norm (the rest: run_hooks.py) ------------------------
    def plan_batch(self, checkpoint: str | None) -> None:
        """auto_find_batch_size, before the first step: `autopilot.choose`'s plan (None: kept),
        validated like a user's sizes; chosen once (transformers' batch-halving stays off)."""
        plan = autopilot.choose(self, checkpoint)
        self.args.auto_find_batch_size = False
        if plan is None:
            return
        self.args.apply_batch_plan(plan.micro_batch, plan.logprob_chunk_size)  # GA, rollout follow
        self._train_batch_size = plan.micro_batch * max(1, self.args.n_gpu)
        self._share_group = shared_group_size(self.args.num_generations, plan.micro_batch)

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm)
        guards.check_grad_norm(grad_norm, self.state.global_step)
        if grad_norm is not None:
            self._step_metrics.add("grad_norm", float(grad_norm))
        self._step_metrics.add("learning_rate", self._get_learning_rate())  # this step's (as TRL)
        return grad_norm
