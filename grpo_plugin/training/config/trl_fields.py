"""Every `trl.GRPOConfig` (1.16) field that `config.py` does not define itself, so a TRL script's
config runs unchanged: implemented here, or accepted only at TRL's default and refused otherwise.

`TRLArguments` sits between `TrainingArguments` and our `GRPOConfig`. A refused field carries its
reason in its metadata (`refused`); `check_refused_fields` raises one line naming the field, why
it does not apply here, and what to do instead. The trainer reads the implemented ones; their
help text says where each takes effect.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from ..._compat import _NO_DEFAULT, generation_default

logger = logging.getLogger(__name__)

MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
# generation_kwargs our sampler honours; a key naming a GRPOConfig field overrides it (as in TRL).
SAMPLER_KWARGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

_VLLM = "a vLLM setting, and generation here is our own prefix-shared sampler (vLLM does not apply)"
_VLLM_IS = (
    "corrects the mismatch between vLLM's and the trainer's log-probs; our sampler runs the "
    "trained model itself, so there is no mismatch to correct"
)
_CB = "generation here is our own prefix-shared sampler, not transformers' continuous batching"


# TRL fields accepted only at their default: name -> (default, why it does not apply here).
REFUSED: dict[str, tuple[Any, str]] = {
    "ds3_gather_for_generation": (
        True,
        "our sampler runs on the unwrapped model; DeepSpeed ZeRO-3 gathering is not wired in",
    ),
    "cache_implementation": (
        None,
        "the decode loop manages its own DynamicCache (prefix sharing, dropped rows)",
    ),
    "use_vllm": (False, "generation here is our own prefix-shared sampler, so vLLM does not apply"),
    "vllm_mode": ("colocate", _VLLM),
    "vllm_model_impl": ("vllm", _VLLM),
    "vllm_enable_sleep_mode": (False, _VLLM),
    "vllm_structured_outputs_regex": (None, _VLLM),
    "vllm_server_base_url": (None, _VLLM),
    "vllm_server_host": ("0.0.0.0", _VLLM),
    "vllm_server_port": (8000, _VLLM),
    "vllm_server_timeout": (240.0, _VLLM),
    "vllm_group_port": (51216, _VLLM),
    "vllm_gpu_memory_utilization": (0.3, _VLLM),
    "vllm_max_model_length": (None, _VLLM),
    "vllm_tensor_parallel_size": (1, _VLLM),
    "vllm_importance_sampling_correction": (True, _VLLM_IS),
    "vllm_importance_sampling_mode": ("sequence_mask", _VLLM_IS),
    "vllm_importance_sampling_clip_max": (3.0, _VLLM_IS),
    "vllm_importance_sampling_clip_min": (None, _VLLM_IS),
    "vllm_importance_sampling_cap": (None, _VLLM_IS),
    "log_completions_hub_repo": (
        None,
        "completions are written to output_dir/completions/*.parquet; upload the run with "
        "`grpo-plugin publish` or huggingface_hub.upload_folder",
    ),
    "use_transformers_continuous_batching": (False, _CB),
    "transformers_continuous_batching_config": (None, _CB),
    "use_transformers_paged": (False, _CB),
}


def _help(text: str, default: Any = None, **kwargs) -> Any:
    return field(default=default, metadata={"help": text}, **kwargs)


def _refused(name: str) -> Any:
    default, reason = REFUSED[name]
    return field(default=default, metadata={"help": f"Accepted only at {default!r}: {reason}."})


@dataclass
class TRLArguments(TrainingArguments):
    """TRL 1.16's GRPO options beyond `GRPOConfig`'s own (same names, same defaults)."""

    # --- model ----------------------------------------------------------------------------------
    trust_remote_code: bool = _help(
        "Allow custom modelling code from the Hub for the policy, its tokenizer and reward models.",
        False,
    )
    router_aux_loss_coef: float | None = _help(
        "Weight of a Mixture-of-Experts model's load-balancing loss in the training loss. None: "
        "the model config's value; 0.0 disables it. An error on a model that is not MoE."
    )
    cast_lm_head_to_fp32: bool = _help(
        "Keep the policy's and reference's LM head in float32 and run it on float32 hidden states "
        "(ScaleRL, https://arxiv.org/abs/2510.13786). Not with a LoRA adapter on lm_head.",
        False,
    )
    # --- data and generation --------------------------------------------------------------------
    pad_to_multiple_of: int | str | None = _help(
        "Pad the training batch's prompt and completion widths (and the log-prob forward's) to a "
        "multiple of this. 'auto' and None: no padding (TRL pads only on AWS Neuron).",
        "auto",
    )
    min_p: float | None = _help(
        "Min-p sampling: drop tokens below min_p x the top token's probability (0.01-0.2 typical)."
    )
    generation_kwargs: dict[str, Any] | str | None = _help(
        "Sampling options that override the fields of the same name: temperature, top_p, top_k, "
        "min_p, repetition_penalty, suppress_tokens, do_sample=True. Any other key is accepted "
        "only at transformers' GenerationConfig default and refused otherwise."
    )
    # --- objective ------------------------------------------------------------------------------
    delta: float | None = _help(
        "Two-sided clipping (INTELLECT-2, https://arxiv.org/abs/2505.07291): cap the importance "
        "ratio at delta (> 1; > 1 + epsilon_high recommended). None: off."
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
    multi_objective_aggregation: str = _help(
        "'sum_then_normalize': weighted sum of the rewards, then the advantage estimator. "
        "'normalize_then_sum' (GDPO, https://arxiv.org/abs/2601.05242): whiten each reward within "
        "its group, sum with the weights, whiten the sum over the batch.",
        "sum_then_normalize",
    )
    sync_ref_model: bool = _help(
        "TR-DPO reference updates (https://arxiv.org/abs/2404.09656): every ref_model_sync_steps "
        "steps, ref = alpha * policy + (1 - alpha) * ref. Full fine-tuning with beta > 0 only.",
        False,
    )
    ref_model_mixup_alpha: float = _help("alpha of sync_ref_model, in [0, 1].", 0.6)
    ref_model_sync_steps: int = _help("Optimizer steps between two sync_ref_model updates.", 512)
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
        "log(pi_old / pi) exceeds this (DeepSeek-V3.2, https://arxiv.org/abs/2512.02556; e.g. 0.5)."
    )
    use_bias_correction_kl: bool = _help(
        "Multiply the k3 KL term by the importance ratio, which makes its gradient the unbiased "
        "reverse-KL gradient (DeepSeek-V3.2). Changes the KL gradient whenever beta > 0.",
        True,
    )
    # --- logging --------------------------------------------------------------------------------
    log_multimodal: bool = _help(
        "Log images with completions. Prompts here are text only, so there is never any to log.",
        True,
    )
    num_completions_to_print: int | None = _help(
        "With log_completions: also log this many completions of each rollout as a table. "
        "None: none printed (the parquet file has them all)."
    )
    log_unique_prompts: bool = _help(
        "With num_completions_to_print: print one completion per distinct prompt.", False
    )
    # --- accepted only at TRL's default -----------------------------------------------------------
    ds3_gather_for_generation: bool = _refused("ds3_gather_for_generation")
    cache_implementation: str | None = _refused("cache_implementation")
    use_vllm: bool = _refused("use_vllm")
    vllm_mode: str = _refused("vllm_mode")
    vllm_model_impl: str = _refused("vllm_model_impl")
    vllm_enable_sleep_mode: bool = _refused("vllm_enable_sleep_mode")
    vllm_structured_outputs_regex: str | None = _refused("vllm_structured_outputs_regex")
    vllm_server_base_url: str | None = _refused("vllm_server_base_url")
    vllm_server_host: str = _refused("vllm_server_host")
    vllm_server_port: int = _refused("vllm_server_port")
    vllm_server_timeout: float = _refused("vllm_server_timeout")
    vllm_group_port: int = _refused("vllm_group_port")
    vllm_gpu_memory_utilization: float = _refused("vllm_gpu_memory_utilization")
    vllm_max_model_length: int | None = _refused("vllm_max_model_length")
    vllm_tensor_parallel_size: int = _refused("vllm_tensor_parallel_size")
    vllm_importance_sampling_correction: bool = _refused("vllm_importance_sampling_correction")
    vllm_importance_sampling_mode: str = _refused("vllm_importance_sampling_mode")
    vllm_importance_sampling_clip_max: float | None = _refused("vllm_importance_sampling_clip_max")
    vllm_importance_sampling_clip_min: float | None = _refused("vllm_importance_sampling_clip_min")
    vllm_importance_sampling_cap: float | None = _refused("vllm_importance_sampling_cap")
    log_completions_hub_repo: str | None = _refused("log_completions_hub_repo")
    use_transformers_continuous_batching: bool = _refused("use_transformers_continuous_batching")
    transformers_continuous_batching_config: dict | str | None = _refused(
        "transformers_continuous_batching_config"
    )
    use_transformers_paged: bool = _refused("use_transformers_paged")

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["generation_kwargs"]

    def __post_init__(self) -> None:
        check_refused_fields(self)
        if self.use_liger_kernel:
            raise ValueError(
                "use_liger_kernel=True is not supported: log-probs come from our chunked LM head "
                "and prefix-shared forward, which Liger's patched forward and fused loss would "
                "bypass (TRL deprecates it too); leave it False."
            )
        self.pad_to_multiple_of = _resolve_pad_multiple(self.pad_to_multiple_of)
        super().__post_init__()
        self._apply_generation_kwargs()
        self._check_trl_numbers()

    def _apply_generation_kwargs(self) -> None:
        if self.generation_kwargs is None:
            return
        for key, value in self.generation_kwargs.items():
            if key in SAMPLER_KWARGS:
                setattr(self, key, value)
            else:
                check_generation_kwarg(key, value)

    def _check_trl_numbers(self) -> None:
        if self.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} is not "
                f"supported; use one of {', '.join(MULTI_OBJECTIVE_AGGREGATIONS)}."
            )
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(
                f"top_entropy_quantile={self.top_entropy_quantile} must be in [0, 1] (1.0 keeps "
                "every token; the paper uses 0.2)."
            )
        if not self.entropy_coef_min <= self.entropy_coef_max or self.entropy_coef_delta < 0:
            raise ValueError(
                "entropy_coef_min must be <= entropy_coef_max and entropy_coef_delta >= 0; got "
                f"{self.entropy_coef_min}, {self.entropy_coef_max}, {self.entropy_coef_delta}."
            )
        if not 0.0 <= self.ref_model_mixup_alpha <= 1.0 or self.ref_model_sync_steps < 1:
            raise ValueError(
                f"ref_model_mixup_alpha={self.ref_model_mixup_alpha} must be in [0, 1] and "
                f"ref_model_sync_steps={self.ref_model_sync_steps} >= 1."
            )
        if self.sync_ref_model and self.beta == 0.0:
            raise ValueError(
                "sync_ref_model=True needs a reference model, and beta=0 uses none: set beta > 0 "
                "(e.g. 0.04) or sync_ref_model=False."
            )
        if self.router_aux_loss_coef is not None and self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef={self.router_aux_loss_coef} must be >= 0.")
        if self.num_completions_to_print is not None and self.num_completions_to_print < 0:
            raise ValueError("num_completions_to_print must be None or >= 0.")


def check_refused_fields(args: Any) -> None:
    """Raise for the first refused field set away from its default, naming it and the reason."""
    for name, (default, reason) in REFUSED.items():
        value = getattr(args, name)
        if value != default:
            raise ValueError(f"{name}={value!r} is not supported: {reason}; leave it {default!r}.")


def refused_field_names() -> list[str]:
    """The TRL fields accepted only at their default (for the README table and the tests)."""
    return list(REFUSED)


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


def _resolve_pad_multiple(value: int | str | None) -> int | None:
    if isinstance(value, str):
        text = value.strip().lower()
        value = None if text in ("auto", "none", "null", "") else int(text)
    if value is not None and value < 1:
        raise ValueError(f"pad_to_multiple_of={value} must be a positive int, 'auto' or None.")
    return value


def warn_on_loss_combinations(args: Any) -> None:
    """TRL's warnings for loss settings that run but probably are not what was meant."""
    if args.loss_type == "luspo" and args.importance_sampling_level != "sequence":
        logger.warning(
            "loss_type='luspo' is a sequence-level loss: set importance_sampling_level='sequence' "
            "to match the LUSPO paper."
        )
    if args.loss_type == "vespo" and args.importance_sampling_level != "token":
        logger.warning(
            "loss_type='vespo' builds its own sequence-level weight from token log-ratios; leave "
            "importance_sampling_level='token'."
        )
    token_summed = ("bnpo", "dr_grpo", "dapo", "cispo")
    if args.importance_sampling_level == "sequence" and args.loss_type in token_summed:
        logger.warning(
            "importance_sampling_level='sequence' with loss_type=%r sums a sequence-level ratio "
            "over tokens, which weights each sequence by its length instead of optimizing GSPO's "
            "per-sequence objective; use loss_type='grpo' to match the GSPO paper.",
            args.loss_type,
        )
