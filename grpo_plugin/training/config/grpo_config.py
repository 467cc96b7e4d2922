"""`GRPOConfig`: TRL's GRPO options (same names, same meanings) plus grpo-plugin's own.

The TRL 1.16 fields not defined here live in `config_trl.TRLArguments` (implemented, or accepted
only at TRL's default), the tool-calling ones in `config_tools.ToolArguments` and the memory
autopilot's in `config_autopilot.AutopilotArguments`, which this class extends.

Defaults that differ from `transformers.TrainingArguments`:
- `learning_rate=1e-5`: TRL's 1e-6 targets full fine-tuning. A LoRA update is a rank-r delta scaled by
  alpha/r, and GRPO's per-step signal is small (most groups carry zero advantage early on), so LoRA GRPO
  needs roughly 10x more; 1e-5 is safe for 0.5-8B models. Tiny models (the 135M demo) use 1e-4..5e-4.
- `logging_steps=1`: one line of `metrics.jsonl` per optimizer step (rollout steps are expensive).
- `bf16=None`: resolved to True only on a CUDA device that supports bf16; fp32 on CPU.
  `bf16=True` on a CPU sets `use_cpu` (transformers asks for it) and warns without AVX512-BF16/AMX.
- `report_to="none"`, `remove_unused_columns=False` (reward functions read the extra columns).
- `gradient_checkpointing=False` (TRL turns it on; on small models it costs ~30% speed for nothing).
- `auto_find_batch_size` is the memory autopilot (`autopilot.py`): it keeps prompt groups whole
  (TRL refuses the option for GRPO, since transformers' halving splits groups).
- `metric_for_best_model="accuracy"` when `load_best_model_at_end` is set without one (the Trainer's
  default, the eval loss, says little about a GRPO policy: on-policy it is about 0).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._compat import cpu_has_bf16_units, launched_without_accelerators
from ...core.objectives import ESTIMATORS, LossParams
from ...rollout.types import SamplingParams
from .autopilot_fields import AutopilotArguments

logger = logging.getLogger(__name__)
SCALE_REWARDS = ("group", "batch", "none")
# scale_rewards (TRL's knob) -> our advantage estimator.
_SCALE_TO_ESTIMATOR = {"group": "grpo", "batch": "batch", "none": "dr_grpo"}


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; use one of {', '.join(allowed)}.")


def _has_accelerator() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps and mps.is_available())


@dataclass
class GRPOConfig(AutopilotArguments):
    """Configuration for `GRPOTrainer`. Every field has help text (`--help` in the CLI shows it)."""

    # --- overridden TrainingArguments defaults -------------------------------------------------
    learning_rate: float = field(
        default=1e-5,
        metadata={
            "help": "AdamW learning rate. 1e-5 suits LoRA GRPO on 0.5-8B models (see module doc)."
        },
    )
    logging_steps: float = field(
        default=1, metadata={"help": "Log (and append to metrics.jsonl) every N optimizer steps."}
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. None: on when the CUDA device supports it, else fp32."
        },
    )
    report_to: None | str | list[str] = field(
        default="none",
        metadata={"help": "Experiment trackers to report to ('none', 'wandb', ...)."},
    )
    remove_unused_columns: bool | None = field(
        default=False,
        metadata={"help": "Keep False: every dataset column reaches the reward functions."},
    )

    # --- model ----------------------------------------------------------------------------------
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for `AutoModelForCausalLM.from_pretrained` when `model` is a "
            "string: `dtype`, `quantization_config` (a BitsAndBytesConfig or its dict), ..."
        },
    )
    disable_dropout: bool = field(
        default=False, metadata={"help": "Set every dropout probability in the policy to 0."}
    )

    # --- generation -----------------------------------------------------------------------------
    num_generations: int = field(
        default=8, metadata={"help": "G: completions sampled per prompt (>= 2)."}
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Keep only the last N prompt tokens (left truncation). None: no limit."},
    )
    max_completion_length: int = field(
        default=256,
        metadata={
            "help": "Maximum number of tokens after the prompt. With tools this bounds the whole "
            "exchange: sampled turns, tool results and the template glue between them."
        },
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Completions generated per rollout over all processes (TRL's meaning). None: "
            "per_device_train_batch_size * num_processes * steps_per_generation. Each process's "
            "share must be divisible by G (groups never span processes)."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches trained on one rollout. None: gradient_accumulation_steps."
        },
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature (> 0); log-probs use the same value."}
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass in (0, 1]."})
    top_k: int = field(default=0, metadata={"help": "Top-k filtering; 0 disables it."})
    repetition_penalty: float = field(
        default=1.0, metadata={"help": "HF-style repetition penalty; 1.0 disables it."}
    )
    chat_template_kwargs: dict[str, Any] | None = field(
        default=None, metadata={"help": "Extra keyword arguments for `apply_chat_template`."}
    )
    shuffle_dataset: bool = field(
        default=True, metadata={"help": "Shuffle the prompts every epoch (seeded by `seed`)."}
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={
            "help": "Run each distinct prompt through the model once and share its KV cache with its "
            "G completions, in generation and in the training forward (exact; faster)."
        },
    )
    overlap_scoring: bool = field(
        default=False,
        metadata={
            "help": "Score each group with the reward functions as soon as its G completions end, "
            "while later groups still decode (pays for slow rewards: sandboxes, judges). Each "
            "call then sees one group. Single-turn only (not with tools or rollout_func)."
        },
    )
    logprob_chunk_size: int = field(
        default=1024,
        metadata={"help": "Completion positions per LM-head chunk; bounds the logits memory."},
    )

    # --- objective ------------------------------------------------------------------------------
    beta: float = field(
        default=0.0,
        metadata={"help": "k3 KL coefficient to the reference policy. 0 skips the reference pass."},
    )
    num_iterations: int = field(
        default=1, metadata={"help": "mu: optimisation passes over each rollout."}
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clip epsilon, in (0, 1)."})
    epsilon_high: float | None = field(
        default=None,
        metadata={"help": "Upper clip epsilon (DAPO clip-higher, e.g. 0.28). None: = epsilon."},
    )
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "Loss: 'grpo' (per-sequence mean), 'dapo' (per-token over the rollout), "
            "'dr_grpo' (sum / (N * max_completion_length)), 'bnpo' (per-token over the "
            "micro-batch), 'cispo', 'sapo', 'luspo' (sequence sums), 'vespo'."
        },
    )
    importance_sampling_level: str = field(
        default="token",
        metadata={"help": "'token' ratios, or 'sequence' (GSPO: one length-normalised ratio)."},
    )
    scale_rewards: str = field(
        default="group",
        metadata={"help": "TRL's advantage scaling: 'group', 'batch' or 'none'."},
    )
    advantage_estimator: str | None = field(
        default=None,
        metadata={
            "help": "'grpo' | 'dr_grpo' | 'rloo' | 'batch'. Overrides scale_rewards when set "
            "(group->grpo, batch->batch, none->dr_grpo)."
        },
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "One weight per reward function; None weights each 1.0."},
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={
            "help": "Exclude completions that hit max_completion_length from the loss (DAPO)."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: drop groups whose rewards all agree and refill the "
            "batch with fresh prompts."
        },
    )
    max_resample_rounds: int = field(
        default=3,
        metadata={"help": "Refill rounds per rollout for dynamic sampling before giving up."},
    )

    # --- logging --------------------------------------------------------------------------------
    log_completions: bool = field(
        default=False,
        metadata={
            "help": "Write completions/step_XXXXX.parquet (prompt, completion, rewards, advantage)."
        },
    )
    zero_std_patience: int = field(
        default=3,
        metadata={
            "help": "Warn once after this many steps in a row where every group had zero reward std."
        },
    )

    # --- run safety (training/run/lock.py, scoring.py) ------------------------------------------
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a new run in an output_dir that holds an earlier one, deleting that "
            "run's files first. Without it such a run is refused (resume it instead)."
        },
    )
    reward_timeout: float | None = field(
        default=600.0,
        metadata={"help": "Seconds one reward call may take before the run stops. None: no limit."},
    )
    nan_rewards_as_unscored: bool = field(
        default=False,
        metadata={
            "help": "Read a NaN reward as 'not scored' (like None). Off: NaN is an error naming the "
            "reward function and the sample."
        },
    )

    # --- evaluation (training/evaluation/during_training.py) ---------------------------------------------------------
    num_generations_eval: int | None = field(
        default=None,
        metadata={
            "help": "Completions sampled per held-out prompt at each evaluation (TRL's name). "
            "k > 1 adds eval_pass@k and computes the eval reward and loss on those samples; 1 "
            "evaluates greedy completions only (cheapest). None: num_generations."
        },
    )
    reward_hacking_window: int = field(
        default=2,
        metadata={
            "help": "Warn when, over this many consecutive evaluations (first vs last), the "
            "training reward rose while the held-out metric fell. 0 turns the alarm off."
        },
    )
    reward_hacking_threshold: float = field(
        default=0.05,
        metadata={
            "help": "How much the training reward must rise, and the held-out metric fall (each "
            "in its own units), for the reward-hacking warning."
        },
    )

    def __post_init__(self) -> None:
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "accuracy"
        if self.eval_strategy == "steps" and not self.eval_steps:  # the Trainer's silent default
            logger.warning(
                "eval_strategy='steps' without eval_steps evaluates at every logging step (every "
                "%s steps); set eval_steps, e.g. eval_steps=16.",
                self.logging_steps,
            )
        if self.bf16 is None:
            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if self.bf16 and not _has_accelerator():
            self._bf16_on_cpu()
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # avoids torch's warning; nothing to pin to
        if launched_without_accelerators():  # several CPU processes: gloo, not N separate runs
            self.use_cpu = True
        if isinstance(self.scale_rewards, bool):  # TRL accepts True/False
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.gradient_checkpointing and self.gradient_checkpointing_kwargs is None:
            self.gradient_checkpointing_kwargs = {"use_reentrant": False}
        super().__post_init__()
        self._check_choices()
        self._check_numbers()
        self._resolve_batches()

    # --- validation ---------------------------------------------------------------------------
    def _bf16_on_cpu(self) -> None:
        """bf16 on a CPU: transformers wants `use_cpu` said; warn where bf16 is emulated."""
        self.use_cpu = True
        if cpu_has_bf16_units() is False:
            logger.warning(
                "bf16=True on a CPU without AVX512-BF16 or AMX: bf16 is emulated there and "
                "slower than fp32; set bf16=False."
            )

    def _check_choices(self) -> None:
        _choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        if self.advantage_estimator is not None:
            _choice("advantage_estimator", self.advantage_estimator, ESTIMATORS)

    def _check_numbers(self) -> None:
        if not self.learning_rate > 0 or self.learning_rate == float("inf"):
            raise ValueError(
                f"learning_rate={self.learning_rate} must be a positive finite number (1e-5 for "
                "LoRA on 0.5-8B models, 1e-4 to 5e-4 for tiny ones)."
            )
        if self.reward_timeout is not None and not self.reward_timeout > 0:
            raise ValueError(
                f"reward_timeout={self.reward_timeout} must be > 0 seconds, or None for no limit."
            )
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations={self.num_generations}: GRPO compares completions within a group, "
                "so it needs at least 2 (RLOO too). Use num_generations=8 as a start."
            )
        if self.temperature <= 0:
            raise ValueError(
                f"temperature={self.temperature} must be > 0 for training (log-probs divide by it)."
            )
        self.sampling_params()  # validates top_p, top_k, min_p and repetition_penalty
        self.loss_params()  # validates every loss hyperparameter (core/losses.py, the one home)
        if self.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size={self.logprob_chunk_size} must be >= 1.")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations={self.num_iterations} must be >= 1.")
        if self.max_resample_rounds < 0:
            raise ValueError("max_resample_rounds must be >= 0.")
        self._check_evaluation()

    def _check_evaluation(self) -> None:
        if self.num_generations_eval is not None and self.num_generations_eval < 1:
            raise ValueError(
                f"num_generations_eval={self.num_generations_eval} must be >= 1 (1: greedy only)."
            )
        if self.reward_hacking_window < 0 or self.reward_hacking_window == 1:
            raise ValueError(
                f"reward_hacking_window={self.reward_hacking_window} must be >= 2 evaluations "
                "(first and last are compared), or 0 to turn the alarm off."
            )

    def _resolve_batches(self) -> None:
        """TRL's semantics: `generation_batch_size` counts the completions of one rollout over
        every process; ours adds that each process's share holds whole groups."""
        per_step, world = self.per_device_train_batch_size, self.world_size
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ValueError("Set generation_batch_size or steps_per_generation, not both.")
        if self.generation_batch_size is not None:
            if self.generation_batch_size % (per_step * world):
                raise ValueError(
                    f"generation_batch_size={self.generation_batch_size} must be a multiple of the "
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
                f"{self.steps_per_generation}) is not divisible by num_generations="
                f"{self.num_generations}: each prompt needs all its G completions in one rollout. "
                f"Make per_device_train_batch_size a multiple of {self.num_generations}."
            )

    # --- derived values ------------------------------------------------------------------------
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

    @property
    def needs_old_logps(self) -> bool:
        """True when a rollout is trained on after an optimizer step (so pi_old != pi_theta)."""
        return (
            self.num_iterations > 1 or self.steps_per_generation > self.gradient_accumulation_steps
        )
