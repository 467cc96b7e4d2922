"""Where a training rollout comes from: our sampler (one turn, or the tool loop) or TRL's
`rollout_func`.

`rollout_func(prompts, trainer)` follows TRL 1.16's contract: it gets the N = P * G prompts of
this process's share of the rollout (each prompt repeated G times, as TRL's sampler repeats
them) and returns a dict with `prompt_ids`, `completion_ids` and `logprobs` (N lists each),
optionally `env_mask` (N lists aligned with `completion_ids`: 1 on tokens the model generated, 0
on tokens the environment inserted, which stay out of the loss), and any other key, which
reaches the reward functions as a column (a list of N values, or one value for all). Completions
are decoded from `completion_ids` (`[{"role": "assistant", ...}]` for chat prompts). The
returned `logprobs` are checked but not used: the trainer computes its own.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from ...config.vllm_checks import vllm_max_model_len
from ...core.objectives import LOSS_TYPES
from ...core.tensors import left_pad, right_pad
from ...engine import CopyAsk, DecodeAsk, DecodeSettings, VllmAsk
from ...engine.rollout_copy import check_copyable, resolve_precision
from ...rollout.multiturn import ToolSetup
from ...rollout.noise import SamplingNoise
from ...rollout.prompts import eos_token_ids, sample_groups
from ...rollout.types import GroupSampling, Rollout, RolloutBatch
from . import overlap

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


def group_sampling(
    args: Any, decode: DecodeSettings, tools: ToolSetup | None = None, record_logprobs: bool = False
) -> GroupSampling:
    """The `GroupSampling` of a `GRPOConfig`: its sampling params, G, prompt length, template
    kwargs and prefix sharing, with the run's `tools` and the decode loop the engine chose
    (`decode`). (A function here, not a config method, so the config stays a plain list of
    fields.)"""
    return GroupSampling(
        sampling=args.sampling_params(),
        num_generations=args.num_generations,
        max_prompt_length=args.max_prompt_length,
        chat_template_kwargs=args.chat_template_kwargs,
        share_prompt_prefix=args.share_prompt_prefix,
        record_logprobs=record_logprobs,  # a rollout copy's, for the sampling correction
        tools=tools,
        engine=decode,
    )


def decode_ask(args: Any, single_turn: bool) -> DecodeAsk:
    """What the config asks of the decode loop; the engine decides (`PolicyEngine.decode_settings`)."""
    return DecodeAsk(args.cache_implementation == "static", args.compile_decode, single_turn)


def copy_ask(args: Any, single_turn: bool) -> CopyAsk:
    """What the config asks of the rollout copy; the engine decides (`PolicyEngine.rollout_precision`)."""
    takes_it = LOSS_TYPES[args.loss_type].correction_refused is None
    return CopyAsk(args.rollout_precision, single_turn, args.sampling_correction, takes_it)


def vllm_ask(args: Any, policy: Any) -> VllmAsk:
    """What the config asks of the vLLM engine; the engine decides its dtype."""
    context = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    return VllmAsk(
        requested_precision=args.rollout_precision,
        max_model_len=vllm_max_model_len(args, context),
        max_num_seqs=max(args.num_generations, args.generation_batch_size // args.world_size),
        seed=args.seed,
        row_tokens=(args.max_prompt_length or 512) + args.max_completion_length,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        model_impl=args.vllm_model_impl,
    )


class RolloutSampler:
    """Samples the rollouts of a `GRPOTrainer` (its args, tokenizer, tools and rollout_func)."""

    def __init__(self, trainer: Any, tool_setup: Any, rollout_func: Any, args, policy) -> None:
        self.trainer, self.tool_setup, self.rollout_func = trainer, tool_setup, rollout_func
        # what the rollouts are sampled from when not the policy: a cheaper copy
        # (`rollout_precision`) or, with use_vllm, the vLLM engine
        self.copy = None
        self.use_vllm = args.use_vllm
        if self.use_vllm:
            if not self.single_turn:
                raise ValueError(
                    "use_vllm with tools, environments or a rollout_func is not supported: their "
                    "turns continue our decode loop's cache; leave use_vllm False."
                )
            return
        # None and 'auto' are resolved on the first rollout
        self._precision = trainer.engine.rollout_precision(copy_ask(args, self.single_turn))
        if self._precision not in (None, "policy", "auto"):
            check_copyable(policy, self._precision)  # one line, before any step

    def _rollout_model(self, model):
        """The model to sample from: the policy, its copy or the vLLM engine. The copy's
        precision (the engine's dtype) is settled on the first rollout, once the Trainer has put
        the policy on its device (a GPU's policy is still on the CPU while the trainer is built)."""
        if self.use_vllm:
            if self.copy is None:
                self.copy = self.trainer.engine.vllm_engine(
                    vllm_ask(self.trainer.args, model), model
                )
            return self.copy.refresh(model, self.trainer.state.global_step)  # new at each step
        if self._precision != "policy" and self.copy is None:
            precision = resolve_precision(self._precision, model)
            if precision == "policy":
                self._precision = "policy"
                return model
            check_copyable(model, precision)
            self.copy = self.trainer.engine.rollout_copy(precision, self._decode_settings())
        if self.copy is None:
            return model
        return self.copy.refresh(model, self.trainer.state.global_step)  # new at each step

    @property
    def single_turn(self) -> bool:
        """No tools and no rollout_func: one completion per prompt, from our own loop."""
        return self.rollout_func is None and self.tool_setup is None

    def _decode_settings(self) -> DecodeSettings:
        return self.trainer.engine.decode_settings(decode_ask(self.trainer.args, self.single_turn))

    def sample(self, model, rows: list[dict[str, Any]], noise: SamplingNoise, on_step=None):
        a, tokenizer = self.trainer.args, self.trainer.processing_class
        if self.rollout_func is not None:
            return rollout_from_func(self.rollout_func, rows, self.trainer, a.num_generations)
        model = self._rollout_model(model)
        copied = self.copy is not None
        settings = group_sampling(a, self._decode_settings(), self.tool_setup, copied)
        try:
            return sample_groups(model, tokenizer, rows, settings, noise=noise, on_step=on_step)
        finally:
            if self.copy is not None:
                self.copy.release()  # its memory goes to training until the next rollout

    def sample_and_score(self, model, rows, noise, rewards) -> tuple[Rollout, dict[str, float]]:
        """The scored rollout and its seconds (`generate_s`, `reward_s`; with `overlap_scoring`
        also `reward_hidden_s`, the scoring done while later groups decoded: `overlap.py`)."""
        if self.trainer.args.overlap_scoring:
            sample = lambda on_step: self.sample(model, rows, noise, on_step)  # noqa: E731
            group = self.trainer.args.num_generations
            return overlap.sample_and_score(
                sample, rewards, self.trainer.processing_class, rows, group
            )
        t0 = time.perf_counter()
        rollout = self.sample(model, rows, noise)
        t1 = time.perf_counter()
        rewards.score(rollout)
        seconds = {"generate_s": t1 - t0, "reward_s": time.perf_counter() - t1}
        return rollout, seconds | self.sync_seconds()

    def close(self) -> None:
        """After training: the vLLM engine shut down (a copy is only memory)."""
        if self.use_vllm and self.copy is not None:
            self.copy.close()

    def sync_seconds(self) -> dict[str, float]:
        """`vllm_sync_s`: the last weight sync of the vLLM engine (inside `generate_s`)."""
        return {"vllm_sync_s": self.copy.syncs.last()} if self.use_vllm and self.copy else {}


def _as_lists(output: dict[str, Any], key: str, n: int) -> list[list[int]]:
    values = output[key]
    if len(values) != n:
        raise ValueError(
            f"rollout_func returned {len(values)} {key} for {n} prompts; return one per prompt "
            "(it gets each prompt repeated num_generations times)"
        )
    return [list(map(int, v)) if key != "logprobs" else list(v) for v in values]


def rollout_from_func(fn, rows: list[dict[str, Any]], trainer: Any, group: int) -> Rollout:
    """The `Rollout` of `fn(prompts, trainer)` on `rows` (see the module docstring)."""
    repeated = [r for r in rows for _ in range(group)]
    prompts = [r["prompt"] for r in repeated]
    output = fn(copy.deepcopy(prompts), trainer)
    if not isinstance(output, dict) or any(k not in output for k in REQUIRED_KEYS):
        got = sorted(output) if isinstance(output, dict) else type(output).__name__
        raise ValueError(f"rollout_func must return a dict with {list(REQUIRED_KEYS)}; got {got}")
    n, tokenizer = len(prompts), trainer.processing_class
    prompt_ids, completion_ids = (
        _as_lists(output, "prompt_ids", n),
        _as_lists(output, "completion_ids", n),
    )
    _as_lists(output, "logprobs", n)
    env_mask = _as_lists(output, "env_mask", n) if "env_mask" in output else None
    model = trainer.accelerator.unwrap_model(trainer.model)
    batch = _batch(prompt_ids, completion_ids, env_mask, tokenizer, eos_token_ids(model, tokenizer))
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    completions = [
        [{"role": "assistant", "content": t}] if isinstance(p, list) else t
        for p, t in zip(prompts, texts)
    ]
    columns = {k: [r[k] for r in repeated] for k in rows[0] if k != "prompt"}
    for key, values in output.items():
        if key not in (*REQUIRED_KEYS, "env_mask"):
            columns[key] = list(values) if isinstance(values, list) else [values] * n
    return Rollout(rows, batch, prompts, completions, completion_ids, columns)


def _batch(prompt_ids, completion_ids, env_mask, tokenizer, eos) -> RolloutBatch:
    pad = eos[0] if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    p_ids, p_mask = left_pad(prompt_ids, pad)  # (N, Lp)
    ids, mask = right_pad(completion_ids, pad)  # (N, Tc) each
    sampled = None
    if env_mask is not None:
        for r, c in enumerate(completion_ids):
            if len(env_mask[r]) != len(c):
                raise ValueError(
                    f"rollout_func: env_mask[{r}] has {len(env_mask[r])} values for "
                    f"{len(c)} completion tokens; give one 0/1 per token"
                )
        sampled, _ = right_pad(env_mask, 0)  # (N, Tc)
    # TRL's rule: a completion whose last token is not an eos (or pad) was cut off
    truncated = torch.tensor([not c or c[-1] not in (*eos, pad) for c in completion_ids])
    model_mask = sampled if sampled is not None else mask
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=ids,
        completion_mask=mask,
        is_truncated=truncated,
        num_prefill_tokens=int(p_mask.sum()),
        num_generated_tokens=int(model_mask.sum()),
        sampled_mask=sampled,
    )
