"""The types one GRPO step passes along, in the order it builds them.

    SamplingParams --generate_groups--> RolloutBatch --decode, score--> Rollout
                   --advantages, reference log-probs--> TrainingBatch --micro-batches--> the loss

Shapes: P distinct prompts, G completions each, N = P * G rows; row p*G + g is sample g of prompt
p. `Lp` is the (left-padded) prompt width and `Tc` the (right-padded) completion width.
As in torchtune's `GRPOTrajectory`, every field says its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ..core.tensors import pad_columns


@dataclass(frozen=True)
class SamplingParams:
    """How next tokens are chosen; validated once, here.

    Sampling follows HF's processor order: repetition penalty, suppressed tokens, temperature,
    top-k, top-p, min-p. `temperature == 0` means greedy. `top_k` of None or 0 disables top-k;
    `min_p` of None disables min-p; `suppress_tokens` are never sampled.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    repetition_penalty: float = 1.0
    min_p: float | None = None
    suppress_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be None, 0 (off) or positive, got {self.top_k}.")
        if not self.repetition_penalty > 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty}."
            )
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ValueError(
                f"min_p must be None or in [0, 1] (0.01-0.2 is typical), got {self.min_p}."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RolloutBatch:
    """The token tensors of G sampled completions for each of P prompts (generation's output)."""

    prompt_ids: torch.LongTensor  # (N, Lp) left-padded
    prompt_mask: torch.LongTensor  # (N, Lp) 1 on real prompt tokens
    completion_ids: torch.LongTensor  # (N, Tc) right-padded with the pad id
    completion_mask: torch.LongTensor  # (N, Tc) 1 up to and including the first EOS
    is_truncated: torch.BoolTensor  # (N,) no EOS within max_new_tokens
    num_prefill_tokens: int  # non-pad prompt tokens run through prefill (work done; kept by select)
    num_generated_tokens: int  # sum of completion_mask

    ROW_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "is_truncated")

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The given rows `(n,)` of every per-row tensor; the generated-token count follows."""
        picked = {name: getattr(self, name)[rows] for name in self.ROW_FIELDS}
        generated = int(picked["completion_mask"].sum())
        return replace(self, **picked, num_generated_tokens=generated)


@dataclass
class Rollout:
    """A rollout decoded for the reward functions and, once scored, with its rewards.

    Everything is aligned row by row (N = P * G); `per_func` and `rewards` are None until the
    reward functions have run.
    """

    rows: list[dict[str, Any]]  # (P,) the dataset rows the prompts came from
    batch: RolloutBatch  # tensors (N, ...)
    prompts: list[Any]  # (N,) each row's prompt (str or chat messages)
    completions: list[Any]  # (N,) decoded, str or [{"role": "assistant", "content": ...}]
    completion_ids: list[list[int]]  # (N,) real completion tokens
    columns: dict[str, list[Any]]  # every other dataset column, (N,) each
    per_func: torch.Tensor | None = None  # (N, F) rewards per function, NaN = not scored
    rewards: torch.Tensor | None = None  # (N,) weighted sum over functions, NaN = not scored

    @property
    def group_size(self) -> int:
        return len(self.completions) // max(1, len(self.rows))


@dataclass
class TrainingBatch:
    """What the loss needs for N rows: the trainer's rollout buffer and each micro-batch of it."""

    prompt_ids: torch.LongTensor  # (N, Lp)
    prompt_mask: torch.LongTensor  # (N, Lp)
    completion_ids: torch.LongTensor  # (N, Tc)
    completion_mask: torch.LongTensor  # (N, Tc) real completion tokens
    loss_mask: torch.LongTensor  # (N, Tc) tokens that enter the loss (truncation masking applied)
    advantages: torch.Tensor  # (N,) float32
    old_logps: torch.Tensor | None = None  # (N, Tc) behaviour policy, only when a rollout is reused
    ref_logps: torch.Tensor | None = None  # (N, Tc) reference policy, only when beta > 0

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def to(self, device: torch.device | str) -> TrainingBatch:
        return replace(self, **{k: v.to(device) for k, v in self._tensors().items()})

    def select(self, rows: torch.Tensor) -> TrainingBatch:
        """The given rows `(n,)` of every tensor."""
        return replace(self, **{k: v[rows] for k, v in self._tensors().items()})

    def padded_to_multiple(self, multiple: int | None, pad_token_id: int) -> TrainingBatch:
        """Prompt columns (left) and completion columns (right) padded to a multiple of `multiple`
        (TRL's `pad_to_multiple_of`); the batch itself when `multiple` is None."""
        if not multiple:
            return self
        prompt_width = -(-self.prompt_ids.shape[1] // multiple) * multiple
        completion_width = -(-self.completion_ids.shape[1] // multiple) * multiple
        out = {}
        for name, value in self._tensors().items():
            if value.dim() != 2:
                continue
            left = name.startswith("prompt")
            fill = pad_token_id if name.endswith("_ids") else 0
            out[name] = pad_columns(value, prompt_width if left else completion_width, fill, left)
        return replace(self, **out)

    def micro_batch(self, index: int, size: int) -> TrainingBatch:
        """Rows `[index * size, (index + 1) * size)`."""
        return replace(
            self, **{k: v[index * size : (index + 1) * size] for k, v in self._tensors().items()}
        )
