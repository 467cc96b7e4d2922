"""The multi-turn tool loop: sample, run the tool calls, append the results, continue.

    1. prefill each prompt once per group and sample the G completions (`generation.py`);
    2. parse each finished turn's tool calls with the template's parser (`chat_tools.py`);
    3. run every row's calls at once, with the timeout (`tools.py`); errors go back to the model;
    4. append the tool messages and continue the rows that called a tool, until no row calls one
       or `max_iterations` rounds of calls have run.

No re-prefill: every row keeps its KV cache across turns (finished rows are not dropped from
it), and a turn after a call prefills only its new tokens: the tool message and the template
glue (plus the model's last token when the turn ended on the final decode step, which the decode
loop samples but never feeds back). Rows get different numbers of new tokens: each row's block
is left-padded to the longest and the padding is masked out; positions come from the attention
mask, so every row continues at its own length. Columns the cache holds for a row that had
already finished (the tokens decoded while the others ran on) are masked out the same way.
TRL 1.16 instead feeds prompt + completion + tool suffix back to generation as a new prompt at
every turn, re-encoding the whole history; `num_reused_tokens` counts what that would prefill
again.

`max_completion_length` bounds every token after the prompt, sampled or not: a turn may sample
at most what is left, and a tool result that does not fit ends the row as truncated, without
the result (as TRL drops it). Sampling draws are keyed on each token's position in the
completion (`noise.ShiftedNoise`), so a row's draws do not depend on the other rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from .._compat import unwrap_peft
from ..core.tensors import left_pad
from .chat_tools import ToolFormat, assistant_message
from .environments import EMPTY_PROMPT, Environments, with_observation
from .generation import continue_decoding, decode_spec, prefill_and_decode
from .noise import ShiftedNoise
from .replaced_generate import replaced_generate, tool_loop_with
from .tool_calls import Tool, run_calls, toolbox
from .types import Decoded, DecodeSpec, GenerationRequest, RolloutBatch, ToolCall, Trajectory

# The tool loop's defaults, in one place: `GRPOConfig` and the CLI read them from here.
DEFAULT_TOOL_TIMEOUT_S = 10.0  # seconds one round of tool calls may take
DEFAULT_MAX_TOOL_RESULT_CHARS = 1000  # characters of a tool result the model reads


@dataclass
class ToolSetup:
    """What the loop needs besides the model, resolved once per run."""

    format: ToolFormat
    tools: list[Tool]  # tools every row may call
    environments: Environments | None = None  # environment_factory: per-rollout tools
    max_iterations: int | None = None  # rounds of tool calls per rollout (None: no limit)
    timeout: float = DEFAULT_TOOL_TIMEOUT_S  # seconds for one round of calls
    max_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS  # a tool result longer than this is cut
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs, for the tool messages
    isolate: bool = True  # the user's tools in the worker process (`isolate_user_code`)

    def start(self, rows: list[dict[str, Any]]) -> tuple[list[Any], list[dict], list[Any] | None]:
        """`(prompts, tool boxes, environments)` of N rollouts: each gets its own environment
        (reset with its row; its observation appended to the prompt) and that one's tools."""
        envs = self.environments.checkout(rows) if self.environments else None
        shared = toolbox(self.tools)
        prompts, boxes = [], []
        for r, row in enumerate(rows):
            prompt = row["prompt"] if envs is None else row.get("prompt", list(EMPTY_PROMPT))
            if not isinstance(prompt, list):
                raise ValueError(
                    "tool calling needs chat prompts (a list of {'role', 'content'} messages), "
                    f"got a {type(prompt).__name__}; wrap it as [{{'role': 'user', 'content': ...}}]"
                )
            box = shared
            if envs is not None:
                by_column = self.environments.by_column
                prompt = with_observation(prompt, Environments.reset(envs[r], row, by_column))
                box = toolbox(self.tools + self.environments.tools_of(envs[r]))
            prompts.append(prompt)
            boxes.append(box)
        return prompts, boxes, envs


@dataclass
class ToolLoopResult:
    """The N trajectories after their prompts, and what the loop prefilled and reused."""

    prompt_ids: torch.LongTensor  # (N, Lp) left-padded
    prompt_mask: torch.LongTensor  # (N, Lp)
    trajectories: list[Trajectory]  # (N,)
    num_prefill_tokens: int  # prompt tokens + every continuation block
    num_reused_tokens: int  # cached history tokens each continuation did not re-encode
    logprobs: list[list[float]] | None = None  # (N, T_r) sampling log-probs, 0 off sampled tokens


def _groups_share(prompt_ids: list[list[int]], group: int) -> bool:
    return all(prompt_ids[i] == prompt_ids[i - i % group] for i in range(len(prompt_ids)))


class _Loop:
    """The loop's state: trajectories, the cache of the rows still going, and the counters."""

    def __init__(self, model, tokenizer, setup: ToolSetup, spec: DecodeSpec, prompts, boxes):
        self.model, self.tokenizer, self.setup = model, tokenizer, setup
        self.spec, self.prompts, self.boxes = spec, prompts, boxes
        self.sampling, self.noise, self.pad = spec.sampling, spec.noise, spec.pad_token_id
        self.max_len = spec.sampling.max_new_tokens  # every token after the prompt, sampled or not
        self.traj = [Trajectory() for _ in boxes]
        self.logps: list[list[float]] = [[] for _ in boxes]
        self.prefilled = self.reused = 0

    def take_turn(self, rows: list[int], out: Decoded, width: int) -> list[tuple]:
        """Record the turn the cache rows `rows` sampled (`width`: the cache's width before it);
        mask the columns decoded past each row's end; return `(cache row, row, its tokens not in
        the cache, calls)` for each row that ended its turn with tool calls."""
        fed = out.attention.shape[1] - width  # tokens fed back to the model: steps - 1
        out.attention[:, width:] = out.live[:, :fed].long()
        going = []
        for a, r in enumerate(rows):
            n, left = int(out.live[a].sum()), self.max_len - len(self.traj[r].ids)
            tokens = out.tokens[a, : min(n, left)].tolist()
            logps = None if out.logprobs is None else out.logprobs[a, : len(tokens)].tolist()
            calls = self.record_turn(r, tokens, bool(out.finished[a]) and n <= left, logps)
            if calls:
                going.append((a, r, tokens[min(n, fed) :], calls))
        return going

    def record_turn(self, r: int, tokens: list[int], ended: bool, logps=None) -> list[ToolCall]:
        """Add row `r`'s turn `tokens` (`ended`: its turn ended within the budget); the tool
        calls it goes on with ([] when it stops: no calls, or cut off)."""
        content, calls = self.parse(r, tokens)
        self.traj[r].add(tokens, sampled=True)
        if logps is not None:
            self.logps[r] += logps
        self.traj[r].messages.append(assistant_message(content, calls))
        if not ended:  # no end of turn within the budget
            self.traj[r].truncated = True
            return []
        return calls

    def parse(self, r: int, tokens: list[int]) -> tuple[str, list[ToolCall]]:
        """Row `r`'s turn `tokens` read with the template's parser (before they join its history)."""
        history = self.prompts[r] + self.traj[r].ids
        schemas = [tool.schema for tool in self.boxes[r].values()]
        return self.setup.format.parse(self.tokenizer, tokens, history, schemas)

    def run_tools(self, going: list[tuple]) -> list[tuple[int, int, list[int]]]:
        """Run the calls of `going`; append each result that fits; `(cache row, row, block)`."""
        results = run_calls(
            [calls for *_, calls in going],
            [self.boxes[r] for _, r, _, _ in going],
            timeout=self.setup.timeout,
            max_chars=self.setup.max_result_chars,
            isolate=self.setup.isolate,
        )
        blocks = []
        for (a, r, missing, calls), done in zip(going, results):
            t = self.traj[r]
            t.tool_calls += len(calls)
            t.tool_failures += sum(res.failed for res in done)
            messages = [res.message() for res in done]
            suffix = self.setup.format.suffix_ids(
                self.tokenizer, messages, self.setup.template_kwargs
            )
            if len(t.ids) + len(suffix) >= self.max_len:  # no room left to answer: stop here
                t.truncated = True
                continue
            t.add(suffix, sampled=False)
            t.messages += messages
            self.logps[r] += [0.0] * len(suffix)
            blocks.append((a, r, missing + suffix))
        return blocks

    def continue_rows(self, rows, blocks, out: Decoded) -> tuple[list[int], Decoded]:
        """Prefill each block after its row's cache and decode the next turn of those rows."""
        keep = torch.tensor([a for a, _, _ in blocks], device=out.attention.device)
        out.cache.batch_select_indices(keep)
        attention = out.attention[keep]  # (C, W)
        next_rows = [r for _, r, _ in blocks]
        self.reused += int(attention.sum())  # what a re-encoding loop would prefill again
        ids, mask = left_pad([b for _, _, b in blocks], self.pad, attention.device)  # (C, B)
        self.prefilled += int(mask.sum())
        used = torch.tensor([len(self.traj[r].ids) for r in next_rows])
        sampling = replace(self.sampling, max_new_tokens=int(self.max_len - used.min()))
        noise = ShiftedNoise(self.noise, torch.tensor(next_rows), used).to(attention.device)
        seen = self._seen(next_rows, attention.device) if sampling.repetition_penalty != 1 else None
        spec = replace(self.spec, sampling=sampling, noise=noise)
        decoded = continue_decoding(self.model, out.cache, attention, (ids, mask), spec, seen)
        return next_rows, decoded

    def _seen(self, rows: list[int], device) -> torch.Tensor:
        """`(C, V)` every token of each row's history (prompt and exchange), for the penalty."""
        vocab = unwrap_peft(self.model).get_output_embeddings().weight.shape[0]
        seen = torch.zeros(len(rows), vocab, dtype=torch.bool, device=device)
        for c, r in enumerate(rows):
            history = self.prompts[r] + self.traj[r].ids
            seen[c, torch.tensor(history, device=device)] = True
        return seen


def run_tool_loop(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    boxes: list[dict[str, Tool]],
    setup: ToolSetup,
    request: GenerationRequest,
) -> ToolLoopResult:
    """Run the loop on N = len(prompt_ids) rows (rows p*G .. p*G+G-1 are prompt p's samples,
    G = `request.num_generations`; a group whose prompts differ, e.g. after an environment's
    reset, is prefilled row by row). `request.pad_token_id` must be set; `on_step` is not used."""
    group = request.num_generations
    spec = replace(decode_spec(request), drop_finished=False, on_step=None)
    generate = replaced_generate(model)
    if generate is not None:  # user code replaced model.generate: honour it (replaced_generate.py)
        plain = replace(spec, record_logprobs=False)
        loop = _Loop(model, tokenizer, setup, plain, prompt_ids, boxes)
        return _tool_loop_through(generate, loop, request, setup.max_iterations)
    shared = _groups_share(prompt_ids, group)
    unique = prompt_ids[::group] if shared else prompt_ids
    loop = _Loop(model, tokenizer, setup, spec, prompt_ids, boxes)
    ids, mask, out, loop.prefilled = prefill_and_decode(
        model, unique, group if shared else 1, spec, request.share_prompt_prefix
    )
    rows, width, rounds = list(range(len(prompt_ids))), mask.shape[1], 0
    with torch.inference_mode():
        while True:
            going = loop.take_turn(rows, out, width)
            limit = setup.max_iterations
            if not going or (limit is not None and rounds >= limit):
                break
            blocks = loop.run_tools(going)
            rounds += 1
            if not blocks:
                break
            width = out.attention.shape[1] + max(len(b) for _, _, b in blocks)
            rows, out = loop.continue_rows(rows, blocks, out)
    return ToolLoopResult(
        prompt_ids=ids.clone(),
        prompt_mask=mask.clone(),
        trajectories=loop.traj,
        num_prefill_tokens=loop.prefilled,
        num_reused_tokens=loop.reused,
        logprobs=loop.logps if spec.record_logprobs else None,
    )


def _tool_loop_through(generate, loop: _Loop, request: GenerationRequest, limit: int | None):
    tool_loop_with(generate, loop, request, limit)
    ids, mask = left_pad(loop.prompts, request.pad_id)  # (N, Lp)
    prefilled = int(mask.sum()) + sum(len(t.ids) for t in loop.traj)  # re-encoded each turn
    return ToolLoopResult(
        prompt_ids=ids,
        prompt_mask=mask,
        trajectories=loop.traj,
        num_prefill_tokens=prefilled,
        num_reused_tokens=0,
        logprobs=None,
    )


def pack(result: ToolLoopResult, pad_token_id: int) -> RolloutBatch:
    """The trajectories as a `RolloutBatch`: completion = every token after the prompt (N, Tc),
    `sampled_mask` = the policy's own tokens, the per-row tool counts."""
    trajectories = result.trajectories
    width = max(1, max(len(t.ids) for t in trajectories))
    ids = torch.full((len(trajectories), width), pad_token_id, dtype=torch.long)  # (N, Tc)
    mask = torch.zeros_like(ids)  # (N, Tc)
    sampled = torch.zeros_like(ids)  # (N, Tc)
    for r, t in enumerate(trajectories):
        ids[r, : len(t.ids)] = torch.tensor(t.ids, dtype=torch.long)
        mask[r, : len(t.ids)] = 1
        sampled[r, : len(t.ids)] = torch.tensor(t.sampled, dtype=torch.long)
    device = result.prompt_ids.device

    def per_row(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return RolloutBatch(
        prompt_ids=result.prompt_ids,
        prompt_mask=result.prompt_mask,
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        is_truncated=torch.tensor([t.truncated for t in trajectories], device=device),
        num_prefill_tokens=result.num_prefill_tokens,
        num_generated_tokens=int(sampled.sum()),
        sampled_mask=sampled.to(device),
        tool_calls=per_row([t.tool_calls for t in trajectories]),
        tool_failures=per_row([t.tool_failures for t in trajectories]),
        turns=per_row([t.turns for t in trajectories]),
        num_reused_tokens=result.num_reused_tokens,
        sampling_logps=_logprob_rows(result.logprobs, width, device),
    )


def _logprob_rows(logprobs: list[list[float]] | None, width: int, device) -> torch.Tensor | None:
    """The loop's per-row sampling log-probs as `(N, Tc)` float32 (0 after each row's end)."""
    if logprobs is None:
        return None
    out = torch.zeros((len(logprobs), width), dtype=torch.float32)  # (N, Tc)
    for r, values in enumerate(logprobs):
        out[r, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out.to(device)


__all__ = ["ToolCall", "ToolLoopResult", "ToolSetup", "pack", "run_tool_loop"]
