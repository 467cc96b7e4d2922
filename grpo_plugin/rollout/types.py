"""The types one GRPO step passes along, in the order it builds them.

    SamplingParams --generate_groups--> RolloutBatch --decode, score--> Rollout
                   --advantages, reference log-probs--> TrainingBatch --micro-batches--> the loss

The settings travel as parameter objects, not long argument lists: `GroupSampling` (what
`prompts.sample_groups` needs from the run), `GenerationRequest` (what `generate_groups` samples)
and `DecodeSpec` (one decode run, resolved: pad id, noise source; the tool loop makes one a turn).

With tools (`multiturn.py`) each row is a `Trajectory` (sampled turns, tool results and template
glue) of `ToolCall`s and `ToolResult`s, decoded turn by turn (`Decoded`), and packed into the same
`RolloutBatch`: its completion is everything after the prompt, and `sampled_mask` marks the tokens
the policy sampled (the only ones the loss, the KL and the entropy see).

Shapes: P distinct prompts, G completions each, N = P * G rows; row p*G + g is sample g of prompt
p. `Lp` is the (left-padded) prompt width and `Tc` the (right-padded) completion width.
As in torchtune's `GRPOTrajectory`, every field says its shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import torch

from ..core.tensors import pad_columns
from ..engine.decode import DecodeSettings

if TYPE_CHECKING:  # annotations only
    from .noise import SamplingNoise

# on_step(finished (N,), tokens, live): the step tensors so far, (N,) each
StepHook = Callable[[torch.Tensor, list, list], None]


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


@dataclass(frozen=True)
class GenerationRequest:
    """What `generation.generate_groups` samples: G completions of each prompt, and how.

    Validated here (G >= 1, at least one eos id). `noise` wins over `generator`; with neither the
    draws come from torch's global generator, in call order.
    """

    sampling: SamplingParams
    num_generations: int  # G: rows p*G .. p*G+G-1 are prompt p's samples
    eos_token_ids: tuple[int, ...]  # a completion ends at ANY of them (stored as a tuple)
    pad_token_id: int | None = None  # None: the first eos id (models without a pad token)
    share_prompt_prefix: bool = True  # prefill each distinct prompt once, expand its KV cache
    generator: torch.Generator | None = None  # draws in call order (`GeneratorNoise`)
    noise: SamplingNoise | None = None  # one row of uniforms per completion (e.g. `KeyedNoise`)
    on_step: StepHook | None = None  # called after every decode step (`generation.decode`)
    record_logprobs: bool = False  # keep the sampled tokens' log-probs (`sampling_logps`)
    engine: DecodeSettings = DecodeSettings()  # the decode loop's cache and compilation

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations}.")
        if not self.eos_token_ids:
            raise ValueError(
                "eos_token_ids is empty: pass the tokenizer's eos id (and e.g. <|im_end|>)."
            )

    @property
    def pad_id(self) -> int:
        """The id that fills each row after its end (`pad_token_id`, else the first eos id)."""
        return self.eos_token_ids[0] if self.pad_token_id is None else int(self.pad_token_id)


@dataclass(frozen=True)
class DecodeSpec:
    """How one decode run (`generation.decode`) picks tokens and when its rows stop.

    Built from a `GenerationRequest` with everything resolved (pad id, noise source); the tool
    loop builds one per turn (less budget left, draws shifted to each row's position).
    """

    sampling: SamplingParams
    eos_token_ids: tuple[int, ...]  # a row stops at any of them
    pad_token_id: int  # fills each row after its end
    noise: SamplingNoise  # row a at step t reads `noise.uniforms([a], t)`
    drop_finished: bool = True  # finished rows leave the batch and the KV cache
    # keep log pi(token) under the sampling temperature (1 when greedy), before top-k/top-p and
    # the other filters: what the training forward computes (`Decoded.logprobs`)
    record_logprobs: bool = False
    on_step: StepHook | None = None  # called after every step
    engine: DecodeSettings = DecodeSettings()  # static cache / compiled step (`static_decode.py`)


@dataclass(frozen=True)
class GroupSampling:
    """The run's settings for `prompts.sample_groups`: dataset rows in, G completions each out.

    Training builds it with `training.sampling.rollouts.group_sampling(args, tools)`;
    evaluation builds its own (its G, its sampling).
    """

    sampling: SamplingParams
    num_generations: int  # G completions per row
    max_prompt_length: int | None = None  # keep the last tokens of a longer prompt
    chat_template_kwargs: dict[str, Any] | None = None  # passed to apply_chat_template
    share_prompt_prefix: bool = True  # prefill each prompt once per group
    # A `multiturn.ToolSetup` for multi-turn tool calling, None: one turn. Typed Any because
    # multiturn imports this module, and the import-cycle test counts TYPE_CHECKING imports too.
    tools: Any = None
    record_logprobs: bool = False  # keep the sampling log-probs (`RolloutBatch.sampling_logps`)
    engine: DecodeSettings = DecodeSettings()  # the decode loop's cache and compilation


@dataclass
class RolloutBatch:
    """The token tensors of G sampled completions for each of P prompts (generation's output).

    Single turn: the completion is what the policy sampled. With tools it is the whole exchange
    after the prompt (turns, tool results, template glue): `sampled_mask` marks the policy's own
    tokens and the per-row tool counts are set; all of them stay None for a single turn.
    """

    prompt_ids: torch.LongTensor  # (N, Lp) left-padded
    prompt_mask: torch.LongTensor  # (N, Lp) 1 on real prompt tokens
    completion_ids: torch.LongTensor  # (N, Tc) right-padded with the pad id
    completion_mask: torch.LongTensor  # (N, Tc) 1 up to and including the first EOS (the last)
    is_truncated: torch.BoolTensor  # (N,) no EOS within max_new_tokens
    num_prefill_tokens: int  # tokens run through prefill: prompts, and tool results with tools
    num_generated_tokens: int  # tokens the policy sampled (sum of the model mask)
    sampled_mask: torch.LongTensor | None = None  # (N, Tc) 1 on sampled tokens; None: all
    tool_calls: torch.LongTensor | None = None  # (N,) tool calls each completion made
    tool_failures: torch.LongTensor | None = None  # (N,) of them, those that returned an error
    turns: torch.LongTensor | None = None  # (N,) assistant turns of each completion
    num_reused_tokens: int = 0  # history tokens later turns found in the KV cache (not re-encoded)
    # (N, Tc) float32 log-probs of the sampled tokens under the policy that sampled them (0 off
    # them); set when recorded (`record_logprobs`), for the sampling correction
    sampling_logps: torch.Tensor | None = None

    ROW_FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "is_truncated")
    TOOL_ROW_FIELDS = ("sampled_mask", "tool_calls", "tool_failures", "turns")
    OPTIONAL_ROW_FIELDS = (*TOOL_ROW_FIELDS, "sampling_logps")  # None unless set

    @property
    def model_mask(self) -> torch.LongTensor:
        """`(N, Tc)` the tokens the policy sampled: the ones the loss may train."""
        return self.completion_mask if self.sampled_mask is None else self.sampled_mask

    def loss_mask(self, mask_truncated: bool) -> torch.LongTensor:
        """`(N, Tc)` the tokens the loss trains: the sampled ones (no tool results, no `env_mask`
        0s), and with `mask_truncated` none of a completion that hit max_new_tokens (TRL's
        `mask_truncated_completions`). The one place this mask is built."""
        mask = self.model_mask.clone()
        if mask_truncated:
            mask[self.is_truncated] = 0
        return mask

    def row_fields(self) -> tuple[str, ...]:
        """The names of the per-row tensors this batch holds."""
        return self.ROW_FIELDS + tuple(
            f for f in self.OPTIONAL_ROW_FIELDS if getattr(self, f) is not None
        )

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The given rows `(n,)` of every per-row tensor; the generated-token count follows."""
        picked = {name: getattr(self, name)[rows] for name in self.row_fields()}
        out = replace(self, **picked)
        out.num_generated_tokens = int(out.model_mask.sum())
        return out

    def tool_field(self, name: str) -> torch.Tensor:
        """An optional row tensor, or its value when unset (every token sampled, no call, one
        turn, sampling log-probs unknown): for stacking a batch that has it with one without."""
        value = getattr(self, name)
        if value is not None:
            return value
        if name == "sampled_mask":
            return self.completion_mask
        if name == "sampling_logps":  # unknown: no correction on these rows (NaN, as TRL)
            return torch.full(self.completion_mask.shape, float("nan"))
        rows = self.completion_mask.shape[0]
        return torch.full((rows,), int(name == "turns"), dtype=torch.long)


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
    environments: list[Any] | None = None  # (N,) each rollout's environment (environment_factory)

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
    sampled_mask: torch.LongTensor | None = None  # (N, Tc) tokens the policy sampled (tools)
    old_logps: torch.Tensor | None = None  # (N, Tc) behaviour policy, only when a rollout is reused
    ref_logps: torch.Tensor | None = None  # (N, Tc) reference policy, only when beta > 0
    # (N, Tc) under the policy that sampled them, when a cheaper copy did (`rollout_precision`)
    sampling_logps: torch.Tensor | None = None

    @property
    def model_mask(self) -> torch.LongTensor:
        """`(N, Tc)` the tokens the policy sampled (as `RolloutBatch.model_mask`)."""
        return self.completion_mask if self.sampled_mask is None else self.sampled_mask

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


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: `name(**arguments)`, or why it cannot be run (`error`)."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None  # the call could not be read (bad JSON, no name, ...)


@dataclass(frozen=True)
class ToolResult:
    """What one call returned: the content of the `tool` message the model reads next."""

    name: str
    content: str
    failed: bool = False  # the tool raised, timed out, is unknown or got bad arguments

    def message(self) -> dict[str, Any]:
        return {"role": "tool", "name": self.name, "content": self.content}


@dataclass
class Trajectory:
    """One row's multi-turn exchange after its prompt, as the loop builds it.

    `ids` and `sampled` are aligned token by token (length <= max_completion_length): 1 where the
    policy sampled the token, 0 for tool results and the template glue around them.
    """

    ids: list[int] = field(default_factory=list)  # (T_r,) every token after the prompt
    sampled: list[int] = field(default_factory=list)  # (T_r,) 1 = sampled by the policy
    messages: list[dict[str, Any]] = field(default_factory=list)  # assistant and tool turns
    tool_calls: int = 0
    tool_failures: int = 0
    truncated: bool = False  # ran out of max_completion_length (mid-turn, or a result too long)

    def add(self, ids: list[int], sampled: bool) -> None:
        self.ids += ids
        self.sampled += [int(sampled)] * len(ids)

    @property
    def turns(self) -> int:
        return sum(m["role"] == "assistant" for m in self.messages)


@dataclass
class Decoded:
    """One decode run over A rows (`generation.decode`): what was sampled and the cache after it.

    `cache` holds a key/value row for every one of the A rows when finished rows were kept
    (`drop_finished=False`), which is what lets a later turn continue them without re-encoding.
    """

    tokens: torch.LongTensor  # (A, T) sampled tokens, pad after each row's end
    live: torch.BoolTensor  # (A, T) True up to and including each row's first EOS
    finished: torch.BoolTensor  # (A,) an EOS was sampled
    cache: Any  # the KV cache after the run (its width is `attention`'s)
    attention: torch.LongTensor  # (A, W) 1 on the cached columns each row attends to
    logprobs: torch.Tensor | None = None  # (A, T) log pi(token) (`DecodeSpec.record_logprobs`)
