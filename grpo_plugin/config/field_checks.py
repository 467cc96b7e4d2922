"""The checks of `GRPOConfig`, by concern: plain functions of one config, which
`GRPOConfig.__post_init__` calls in its order (some must run before transformers'
`TrainingArguments.__post_init__`, which would otherwise default or refuse the field first).

Every error is one line: the field, its value, and what to set instead. The batch sizes are not
here: `GRPOConfig.resolve_batch_sizes` derives and checks them, for a user's sizes and for the
memory autopilot's plan alike. `config` is always a `GRPOConfig` (not imported: it imports us).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .._compat import (
    _NO_DEFAULT,
    cpu_has_bf16_units,
    generation_default,
    launched_alone,
    launched_without_accelerators,
)
from ..core.objectives import ESTIMATORS, LOSS_TYPES
from ..rollout.chat_tools import TOOL_TEMPLATES

logger = logging.getLogger(__name__)

SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
# generation_kwargs our sampler honours; a key naming a GRPOConfig field overrides it (as in TRL).
SAMPLER_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
ROLLOUT_PRECISIONS = ("policy", "auto", "bf16", "fp16")
TRAIN_PRECISIONS = ("fp32", "bf16")
CACHE_IMPLEMENTATIONS = (None, "dynamic", "static")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; use one of {', '.join(allowed)}.")


# --- TRL's fields accepted only at their default (before TrainingArguments) -------------------------
_VLLM = "a vLLM server setting, and only vllm_mode='colocate' is supported (docs/vllm.md)"
_CB = "generation here is our own prefix-shared sampler, not transformers' continuous batching"

# name -> (TRL's default, why it does not apply here); `GRPOConfig` declares each with these.
REFUSED: dict[str, tuple[Any, str]] = {
    "ds3_gather_for_generation": (
        True,
        "our sampler runs on the unwrapped model; DeepSpeed ZeRO-3 gathering is not wired in",
    ),
    "vllm_server_base_url": (None, _VLLM),
    "vllm_server_host": ("0.0.0.0", _VLLM),
    "vllm_server_port": (8000, _VLLM),
    "vllm_server_timeout": (240.0, _VLLM),
    "vllm_group_port": (51216, _VLLM),
    "log_completions_hub_repo": (
        None,
        "completions are written to output_dir/completions/*.parquet; upload the run with "
        "`grpo-plugin publish` or huggingface_hub.upload_folder",
    ),
    "use_transformers_continuous_batching": (False, _CB),
    "transformers_continuous_batching_config": (None, _CB),
    "use_transformers_paged": (False, _CB),
}


def refused_field_names() -> list[str]:
    """The TRL fields accepted only at their default (for the README table and the tests)."""
    return list(REFUSED)


def check_refused_fields(config: Any) -> None:
    """Raise for the first refused field set away from its default,
    naming it, why it does not apply here, and the default to leave it at."""
    for name, (default, reason) in REFUSED.items():
        value = getattr(config, name)
        if value != default:
            raise ValueError(f"{name}={value!r} is not supported: {reason}; leave it {default!r}.")
    # use_liger_kernel is decided by the trainer, which knows the PEFT adapter (liger.py)


# --- the loss (objective) ---------------------------------------------------------------------------
def check_loss(config: Any) -> None:
    """The objective's fields; `LossParams` (core) validates the loss hyperparameters proper."""
    if isinstance(config.scale_rewards, bool):  # TRL accepts True/False
        config.scale_rewards = "group" if config.scale_rewards else "none"
    _choice("scale_rewards", config.scale_rewards, SCALE_REWARDS)
    if config.advantage_estimator is not None:
        _choice("advantage_estimator", config.advantage_estimator, ESTIMATORS)
    if not config.learning_rate > 0 or config.learning_rate == float("inf"):
        raise ValueError(
            f"learning_rate={config.learning_rate} must be a positive finite number (1e-5 for "
            "LoRA on 0.5-8B models, 1e-4 to 5e-4 for tiny ones)."
        )
    if config.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise ValueError(
            f"multi_objective_aggregation={config.multi_objective_aggregation!r} is not "
            f"supported; use one of {', '.join(MULTI_OBJECTIVE_AGGREGATIONS)}."
        )
    _check_entropy(config)
    _check_reference(config)
    if config.router_aux_loss_coef is not None and config.router_aux_loss_coef < 0:
        raise ValueError(f"router_aux_loss_coef={config.router_aux_loss_coef} must be >= 0.")
    if config.max_completion_length < 1:
        raise ValueError(
            f"max_completion_length={config.max_completion_length} must be >= 1 (the new tokens "
            "each completion may have); e.g. max_completion_length=256."
        )
    config.loss_params()  # validates every loss hyperparameter (core/objectives, the one home)
    if config.num_iterations < 1:
        raise ValueError(f"num_iterations={config.num_iterations} must be >= 1.")


def _check_entropy(config: Any) -> None:
    if not 0.0 <= config.top_entropy_quantile <= 1.0:
        raise ValueError(
            f"top_entropy_quantile={config.top_entropy_quantile} must be in [0, 1] (1.0 keeps "
            "every token; the paper uses 0.2)."
        )
    if not config.entropy_coef_min <= config.entropy_coef_max or config.entropy_coef_delta < 0:
        raise ValueError(
            "entropy_coef_min must be <= entropy_coef_max and entropy_coef_delta >= 0; got "
            f"{config.entropy_coef_min}, {config.entropy_coef_max}, {config.entropy_coef_delta}."
        )


def _check_reference(config: Any) -> None:
    if not 0.0 <= config.ref_model_mixup_alpha <= 1.0 or config.ref_model_sync_steps < 1:
        raise ValueError(
            f"ref_model_mixup_alpha={config.ref_model_mixup_alpha} must be in [0, 1] and "
            f"ref_model_sync_steps={config.ref_model_sync_steps} >= 1."
        )
    if config.sync_ref_model and config.beta == 0.0:
        raise ValueError(
            "sync_ref_model=True needs a reference model, and beta=0 uses none: set beta > 0 "
            "(e.g. 0.04) or sync_ref_model=False."
        )


def warn_on_loss_combinations(config: Any) -> None:
    """TRL's warnings for loss settings that run but probably are not what was meant."""
    definition = LOSS_TYPES.get(config.loss_type)
    if definition is None:
        return  # not a loss type: LossParams says so
    if definition.level is not None and config.importance_sampling_level != definition.level[0]:
        logger.warning("loss_type=%r %s.", config.loss_type, definition.level[1])
    summed = definition.sums_over_tokens and definition.level is None
    if config.importance_sampling_level == "sequence" and summed:
        logger.warning(
            "importance_sampling_level='sequence' with loss_type=%r sums a sequence-level ratio "
            "over tokens, which weights each sequence by its completion length instead of optimizing "
            "GSPO's "
            "per-sequence objective; use loss_type='grpo' to match the GSPO paper.",
            config.loss_type,
        )


# --- rollout and sampling ---------------------------------------------------------------------------
def resolve_pad_multiple(value: int | str | None) -> int | None:
    """`pad_to_multiple_of` as an int or None ('auto', 'none' and '' are None, as off Neuron)."""
    if isinstance(value, str):
        text = value.strip().lower()
        value = None if text in ("auto", "none", "null", "") else int(text)
    if value is not None and value < 1:
        raise ValueError(f"pad_to_multiple_of={value} must be a positive int, 'auto' or None.")
    return value


MAPPING_FIELDS = ("model_init_kwargs", "generation_kwargs", "chat_template_kwargs")


def check_mapping_fields(config: Any) -> None:
    """After TrainingArguments (which parses a JSON string `{...}` into a dict): each keyword
    argument field is a mapping or None, not a string that would fail when it is used."""
    for name in MAPPING_FIELDS:
        value = getattr(config, name)
        if value is not None and not isinstance(value, dict):
            raise ValueError(
                f"{name}={value!r} must be a mapping (a JSON object on the command line), e.g. "
                f"""{name}='{{"key": "value"}}', or None."""
            )


def apply_generation_kwargs(config: Any) -> None:
    """Copy the `generation_kwargs` our sampler honours onto their fields; refuse the rest
    unless at transformers' default (after TrainingArguments, which parses a JSON string)."""
    check_mapping_fields(config)
    for key, value in (config.generation_kwargs or {}).items():
        if key in SAMPLER_KWARGS:
            setattr(config, key, value)
        else:
            check_generation_kwarg(key, value)


def check_generation_kwarg(key: str, value: Any) -> None:
    """Accept `key` when our sampler honours it or `value` is transformers' default (no effect)."""
    if key == "suppress_tokens" or (key == "do_sample" and value is True):
        return
    if key == "do_sample":
        raise ValueError(
            "generation_kwargs['do_sample']=False is greedy decoding: the G completions of a prompt "
            "would be identical and every advantage 0; sampling is always on here."
        )
    if key == "max_new_tokens":
        raise ValueError("generation_kwargs['max_new_tokens']: set max_completion_length instead.")
    default = generation_default(key)
    if default is _NO_DEFAULT or value != default:
        supported = ", ".join((*SAMPLER_KWARGS, "suppress_tokens", "do_sample=True"))
        raise ValueError(
            f"generation_kwargs[{key!r}]={value!r} is not supported: our sampler draws G "
            f"independent samples per prompt and honours only {supported}."
        )


def check_rollout(config: Any) -> None:
    """Group size, sampling settings and the rollout's own knobs."""
    if config.num_generations < 2:
        raise ValueError(
            f"num_generations={config.num_generations}: GRPO requires at least 2 generations per "
            "prompt to compare completions within a group (RLOO too). Use num_generations=8 as a "
            "start."
        )
    if config.temperature <= 0:
        raise ValueError(
            f"temperature={config.temperature} must be > 0 for training (log-probs divide by it)."
        )
    config.sampling_params()  # validates top_p, top_k, min_p and repetition_penalty
    check_logprob_chunk_size(config)
    if config.max_resample_rounds < 0:
        raise ValueError(
            f"max_resample_rounds={config.max_resample_rounds} must be >= 0 (0: no refill)."
        )
    if config.rollout_precision is not None:  # None: the device's default (rollouts.py)
        _choice("rollout_precision", config.rollout_precision, ROLLOUT_PRECISIONS)
    if config.train_precision is not None:  # None: the engine decides (PolicyEngine)
        _choice("train_precision", config.train_precision, TRAIN_PRECISIONS)
        _check_bf16_training(config)
    if config.cache_implementation not in CACHE_IMPLEMENTATIONS:
        raise ValueError(
            f"cache_implementation={config.cache_implementation!r} is not supported: the rollouts "
            "decode with our own loop; use None (or 'dynamic') or 'static'."
        )
    _resolve_trl_correction_names(config)
    config.correction_params()  # validates the mode and the bounds
    copy = config.rollout_precision not in (None, "policy")  # None: never for such a loss
    corrected = copy and config.sampling_correction
    refused = getattr(LOSS_TYPES.get(config.loss_type), "correction_refused", None)
    if config.use_vllm and config.sampling_correction and refused:
        raise ValueError(
            f"loss_type={config.loss_type!r} with use_vllm's sampling correction is not "
            f"supported: {refused}; set sampling_correction=False (the drift is still checked)."
        )
    if corrected and refused:
        raise ValueError(
            f"loss_type={config.loss_type!r} with a rollout copy is not supported: {refused}; "
            "use rollout_precision='policy'."
        )


# ours <- TRL's name, and the shared default
_TRL_CORRECTION_NAMES = {
    "sampling_correction": ("vllm_importance_sampling_correction", True),
    "sampling_correction_mode": ("vllm_importance_sampling_mode", "sequence_mask"),
    "sampling_correction_clip_max": ("vllm_importance_sampling_clip_max", 3.0),
    "sampling_correction_clip_min": ("vllm_importance_sampling_clip_min", None),
}


def _resolve_trl_correction_names(config: Any) -> None:
    """TRL's `vllm_importance_sampling_*` and ours name the same settings: one set away from the
    default sets the other; both set, differently, is refused. TRL's deprecated `_cap` sets
    `_clip_max`, as in TRL."""
    if config.vllm_importance_sampling_cap is not None:
        logger.warning(
            "vllm_importance_sampling_cap is deprecated (as in TRL); use "
            "vllm_importance_sampling_clip_max or sampling_correction_clip_max."
        )
        config.vllm_importance_sampling_clip_max = config.vllm_importance_sampling_cap
    for ours, (trl, default) in _TRL_CORRECTION_NAMES.items():
        mine, theirs = getattr(config, ours), getattr(config, trl)
        if mine != default and theirs != default and mine != theirs:
            raise ValueError(
                f"{ours}={mine!r} and {trl}={theirs!r} name the same setting; set one of them."
            )
        value = theirs if mine == default else mine
        setattr(config, ours, value)
        setattr(config, trl, value)


def check_logprob_chunk_size(config: Any) -> None:
    if config.logprob_chunk_size < 1:
        raise ValueError(f"logprob_chunk_size={config.logprob_chunk_size} must be >= 1.")


# --- tools (before TrainingArguments) ---------------------------------------------------------------
def check_tools(config: Any) -> None:
    """The tool loop's options (they do nothing without tools, but are checked anyway)."""
    if config.max_tool_calling_iterations is not None and config.max_tool_calling_iterations < 0:
        raise ValueError(
            f"max_tool_calling_iterations={config.max_tool_calling_iterations} must be >= 0 "
            "(0: tools are shown but never run) or None (no limit)."
        )
    if not config.tool_timeout > 0:
        raise ValueError(f"tool_timeout={config.tool_timeout} must be > 0 seconds.")
    if config.max_tool_result_length < 1:
        raise ValueError(f"max_tool_result_length={config.max_tool_result_length} must be >= 1.")
    if config.tool_chat_template not in TOOL_TEMPLATES:
        raise ValueError(
            f"tool_chat_template={config.tool_chat_template!r}; use one of "
            f"{', '.join(TOOL_TEMPLATES)}."
        )


# --- evaluation -------------------------------------------------------------------------------------
def set_evaluation_defaults(config: Any) -> None:
    """Before TrainingArguments: our best-model metric, and a warning for its silent eval_steps."""
    if config.load_best_model_at_end and config.metric_for_best_model is None:
        config.metric_for_best_model = "accuracy"
    if config.eval_strategy == "steps" and not config.eval_steps:
        logger.warning(
            "eval_strategy='steps' without eval_steps evaluates at every logging step (every "
            "%s steps); set eval_steps, e.g. eval_steps=16.",
            config.logging_steps,
        )


def check_evaluation(config: Any) -> None:
    if config.num_generations_eval is not None and config.num_generations_eval < 1:
        raise ValueError(
            f"num_generations_eval={config.num_generations_eval} must be >= 1 (1: greedy only)."
        )
    if config.reward_hacking_window < 0 or config.reward_hacking_window == 1:
        raise ValueError(
            f"reward_hacking_window={config.reward_hacking_window} must be >= 2 evaluations "
            "(first and last are compared), or 0 to turn the alarm off."
        )


# --- the run: precision, device, logging, safety ----------------------------------------------------
LAUNCHED_ALONE = (
    "accelerate launch started this process alone: with `distributed_type: MULTI_CPU` (or --cpu "
    "and several processes) it starts one independent run per launch unless mpirun starts them "
    "(--mpirun_hostfile); set `distributed_type: MULTI_GPU` (or launch with --multi_gpu): without "
    "GPUs the processes then train on the CPUs over gloo (on GPU machines add `use_cpu: true` to "
    "the recipe). For a one-process run, unset MASTER_ADDR."
)


def set_run_defaults(config: Any) -> None:
    """Before TrainingArguments: bf16 and the device resolved, gradient checkpointing's kwargs.
    A launch that started this process alone out of several is refused (`launched_alone`)."""
    if launched_alone():  # never N one-process runs racing for one output_dir
        raise ValueError(LAUNCHED_ALONE)
    if config.bf16 is None:
        config.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if config.bf16 and not _has_accelerator():
        _bf16_on_cpu(config)
    if not torch.cuda.is_available():
        config.dataloader_pin_memory = False  # avoids torch's warning; nothing to pin to
    if launched_without_accelerators():  # several CPU processes: gloo, not N separate runs
        config.use_cpu = True
    if config.gradient_checkpointing and config.gradient_checkpointing_kwargs is None:
        config.gradient_checkpointing_kwargs = {"use_reentrant": False}


def _check_bf16_training(config: Any) -> None:
    """`train_precision='bf16'` against the rest of the config (the model's side:
    models/setup_checks.py)."""
    if config.train_precision != "bf16":
        return
    fix = "or set train_precision='fp32'"
    if config.bf16 or config.fp16:
        raise ValueError(
            f"train_precision='bf16' with {'bf16' if config.bf16 else 'fp16'}=True: autocast "
            "lowers every product already; keep one of the two (train_precision='bf16' keeps "
            "float32 norms, attention and LM head)."
        )
    if config.gradient_checkpointing:
        raise ValueError(
            "train_precision='bf16' with gradient_checkpointing=True: the recompute runs outside "
            f"the training forward's bf16 products; turn gradient_checkpointing off {fix}."
        )
    if not config.fast_paths:
        raise ValueError(
            "train_precision='bf16' with fast_paths=False: the bf16 products are a fast path "
            f"(the fused LoRA layers); set fast_paths=True {fix}."
        )
    if _has_accelerator() and not config.use_cpu:
        raise ValueError(
            "train_precision='bf16' trains on a CPU only (the fused LoRA layers); on a GPU use "
            "bf16=True (autocast) instead."
        )
    if cpu_has_bf16_units() is False:
        raise ValueError(
            "train_precision='bf16' on a CPU without AVX512-BF16 or AMX: bf16 products are "
            "emulated there and slower than float32; set train_precision='fp32' (or leave it "
            "unset)."
        )


def _has_accelerator() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps and mps.is_available())


def _bf16_on_cpu(config: Any) -> None:
    """bf16 on a CPU: transformers wants `use_cpu` said; warn where bf16 is emulated."""
    config.use_cpu = True
    if cpu_has_bf16_units() is False:
        logger.warning(
            "bf16=True on a CPU without AVX512-BF16 or AMX: bf16 is emulated there and "
            "slower than fp32; set bf16=False."
        )


def check_report_to(config: Any) -> None:
    """After TrainingArguments (a list by then): each tracker is known and installed; a missing
    one failed when the Trainer was built, after the model had loaded."""
    from transformers.integrations import integration_utils as trackers

    available = trackers.get_available_reporting_integrations()
    for name in config.report_to or []:
        if name not in trackers.INTEGRATION_TO_CALLBACK:
            known = ", ".join(sorted(trackers.INTEGRATION_TO_CALLBACK))
            raise ValueError(f"report_to={name!r} is not a tracker; use 'none' or one of {known}.")
        if name not in available:
            raise ValueError(
                f"report_to={name!r}: its package is not installed here (e.g. pip install {name}); "
                "install it or set report_to='none'."
            )


def check_run(config: Any) -> None:
    check_report_to(config)
    if config.reward_timeout is not None and not config.reward_timeout > 0:
        raise ValueError(
            f"reward_timeout={config.reward_timeout} must be > 0 seconds, or None for no limit."
        )
    if config.num_completions_to_print is not None and config.num_completions_to_print < 0:
        raise ValueError(
            f"num_completions_to_print={config.num_completions_to_print} must be None or >= 0."
        )
    config.torch_threads = resolve_torch_threads(config.torch_threads)


def resolve_torch_threads(value: int | str | None) -> int | str | None:
    """`torch_threads` as the trainer uses it: None, "auto" or a positive int (from "2" too;
    a flag's "none" or "null" is None)."""
    if value is None or value == "auto":
        return value
    text = str(value).strip()
    if text.lower() in ("none", "null"):
        return None
    if not text.isdigit() or int(text) < 1 or isinstance(value, (bool, float)):
        raise ValueError(
            f"torch_threads={value!r} must be 'auto', a number of threads >= 1, or none (the "
            "process's setting)."
        )
    return int(text)


# --- ours: the memory autopilot ---------------------------------------------------------------------
def check_autopilot_memory(config: Any) -> None:
    if config.auto_batch_memory_gb is not None and not config.auto_batch_memory_gb > 0:
        raise ValueError(
            f"auto_batch_memory_gb={config.auto_batch_memory_gb} must be > 0 (GB), or None."
        )


def check_autopilot_processes(config: Any) -> None:
    """After TrainingArguments (world_size is known then): the autopilot plans one process."""
    if config.auto_find_batch_size and config.world_size > 1:
        raise ValueError(
            f"auto_find_batch_size plans one process's memory, and this run has "
            f"{config.world_size}; set it False and choose per_device_train_batch_size."
        )
