"""vLLM as the engine the training rollouts are sampled from (`use_vllm=True`, colocated).

It stands where the rollout copy stands (`rollout_copy.py`): built once, on the first rollout,
from the policy's config (vLLM's own model with placeholder weights, `load_format='dummy'`: the
policy's weights never go through disk), and before every rollout whose policy has changed (a new
optimizer step) it is given the weights the policy computes with, in place (vLLM's
`reload_weights`, which repacks them for its kernels):

- full fine-tuning: every parameter;
- LoRA: each adapted layer's W + (alpha / r) B A (the merge `rollout_copy.merged_weight` does,
  peft's own delta for other adapter kinds), the rest as it is;
- QLoRA: the 4-bit base dequantized (bitsandbytes' own dequantization, as peft's merge does)
  plus the adapter: vLLM serves the policy's effective weights in `dtype` (bf16 by default), not
  the 4-bit ones.

A sync is checked, never trusted, twice, and neither check takes `sync`'s word for it:

- exactly, after every refresh (`_check_followed`): when the weights the policy would serve
  changed (a fingerprint of them in `dtype`, taken as they stream into the engine, the rest read
  after a sync that stopped reading), the engine's log-probs of a fixed probe sequence must
  change too; bit-identical ones mean the new weights never reached it (a skipped or failed
  load, an adapter left out), and the run stops at that step (`StaleEngineError`);
- statistically, every micro-batch: the trainer compares the log-probs the engine sampled with
  the policy's on the same tokens (`run/guards.check_rollout_drift`), which catches weights that
  reached it wrong (a name mapped to the wrong layer, an untied head left at its old value).

CPU and GPU run the same code; on a CPU the engine is eager (`enforce_eager`) and its KV cache
is sized to one rollout (`VllmSettings.kv_cache_bytes`) instead of a share of GPU memory.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._compat import cpu_has_bf16_units, unwrap_peft
from .._compat.vllm_runtime import import_vllm, shutdown
from .rollout_copy import base_name, merged_weight

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmSettings:
    """How the engine is built (GRPOConfig's `vllm_*` fields, decided by `PolicyEngine`)."""

    dtype: str  # 'bfloat16' | 'float16' | 'float32'
    max_model_len: int  # prompt + completion tokens of one row
    max_num_seqs: int  # rows decoded together: one rollout's completions
    seed: int
    row_tokens: int  # a typical row's tokens (a CPU's KV cache holds one rollout of them)
    gpu_memory_utilization: float = 0.3  # a GPU's share for weights and KV cache (TRL's)
    enable_sleep_mode: bool = False  # GPU only: weights and cache freed between rollouts
    model_impl: str = "vllm"
    device: str = "cpu"

    def kv_cache_bytes(self, config: Any) -> int:
        """A CPU's KV cache, in `dtype`: one rollout's rows at `row_tokens` each, and at least
        one row at `max_model_len` (vLLM would otherwise take most of the machine's memory;
        rows past it wait for room, they are not cut)."""
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        itemsize = torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()
        per_token = 2 * config.num_hidden_layers * heads * head_dim * itemsize  # K and V
        tokens = max(self.max_model_len, self.row_tokens * self.max_num_seqs)
        return per_token * tokens + (64 << 20)


def serving_dtype(requested: str | None, policy: torch.nn.Module) -> str:
    """The dtype vLLM serves the policy in, from `rollout_precision`: 'bf16' / 'fp16' as asked,
    'policy' the policy's own (a 4-bit base's compute dtype), None and 'auto' bfloat16 where it
    is native (a GPU with bf16, a CPU with AVX512-BF16 or AMX), else float32 on a CPU and
    float16 on a GPU."""
    param = next(policy.parameters())
    if requested in ("bf16", "fp16"):
        return {"bf16": "bfloat16", "fp16": "float16"}[requested]
    if requested == "policy" and param.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return str(param.dtype).removeprefix("torch.")
    if param.device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16_units() else "float32"


@dataclass
class Sample:
    """One completion vLLM sampled: its tokens, their log-probs under the engine (temperature
    applied, as the training forward's), and whether it ended on a stop token."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


class StaleEngineError(RuntimeError):
    """The vLLM engine did not take the policy's new weights; names the step."""


PROBE_TOKENS = 32  # the probe sequence's length


@dataclass
class SyncTimes:
    """Seconds each weight sync took (for `timing/vllm_sync_s` and the benchmarks)."""

    seconds: list[float] = field(default_factory=list)

    def last(self) -> float:
        return self.seconds[-1] if self.seconds else 0.0


class VllmEngine:
    """One policy's vLLM engine: `refresh(policy, version)` returns it holding the policy's
    current weights (pushed only when `version` changed); `generate` samples from them."""

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.llm: Any = None
        self.generation_config: Any = None  # the policy's (its eos ids end completions)
        self.syncs = SyncTimes()
        self._version: object = None
        self._sleeping = False
        self._folder: tempfile.TemporaryDirectory | None = None
        self._followed: tuple[float, torch.Tensor] | None = None  # (fingerprint, probe) last seen

    @torch.no_grad()
    def refresh(self, policy: torch.nn.Module, version: object) -> VllmEngine:
        if self.llm is None:
            self._build(policy)
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping, self._version = False, None  # level 2 dropped the weights
        if version != self._version:
            weights = _Fingerprinted(served_weights(policy), getattr(torch, self.settings.dtype))
            self.sync(weights)
            self._version = version
            self._check_followed(weights.finish(), version)
        return self

    def _check_followed(self, sent: float, version: object) -> None:
        """Stop when the weights to serve changed (`sent`, their fingerprint) and the engine's
        outputs did not."""
        if self._followed is not None and sent == self._followed[0]:
            return  # nothing to serve changed (a zero update, or one below `dtype`'s precision)
        probe = self._probe()
        if self._followed is not None and torch.equal(probe, self._followed[1]):
            step = f"step {version + 1}" if isinstance(version, int) else f"version {version}"
            raise StaleEngineError(
                f"{step}: the vLLM engine was given the policy's new weights and its log-probs "
                "did not change: the weights never reached it (a load that was skipped or failed, "
                "or the adapter left out of the served weights). Stopped before sampling from "
                "it; the checkpoints are kept."
            )
        self._followed = (sent, probe)

    def _probe(self) -> torch.Tensor:
        """`(PROBE_TOKENS - 1,)` the engine's log-probs of a fixed token sequence."""
        vllm = import_vllm()
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        tokens = [(7919 * i + 11) % vocab for i in range(PROBE_TOKENS)]
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate(
            [vllm.TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False
        )
        steps = out[0].prompt_logprobs[1:]  # the first token has none
        return torch.tensor([step[t].logprob for step, t in zip(steps, tokens[1:])])

    def _build(self, policy: torch.nn.Module) -> None:
        vllm = import_vllm()
        base = unwrap_peft(policy)
        self.generation_config = getattr(base, "generation_config", None)
        self._folder = tempfile.TemporaryDirectory(prefix="grpo-plugin-vllm-")
        _write_config(base.config, Path(self._folder.name), self.settings.dtype)
        s = self.settings
        memory = (
            {"kv_cache_memory_bytes": s.kv_cache_bytes(base.config)}
            if s.device == "cpu"
            else {"gpu_memory_utilization": s.gpu_memory_utilization}
        )
        start = time.perf_counter()
        self.llm = vllm.LLM(
            model=self._folder.name,
            load_format="dummy",  # the policy's weights are pushed next, from memory
            skip_tokenizer_init=True,  # token ids in, token ids out
            dtype=s.dtype,
            seed=s.seed,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_num_seqs,
            max_num_batched_tokens=max(4096, s.max_model_len),
            enforce_eager=s.device == "cpu",
            enable_sleep_mode=s.enable_sleep_mode,
            model_impl=s.model_impl,
            logprobs_mode="processed_logprobs",  # after temperature: the training forward's
            **memory,
        )
        logger.info(
            "vLLM engine built in %.1f s (%s, up to %d rows of %d tokens)",
            time.perf_counter() - start,
            s.dtype,
            s.max_num_seqs,
            s.max_model_len,
        )

    def sync(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load `weights` (the policy's, in the engine's dtype) into the engine, and forget the
        cached prefixes."""
        start = time.perf_counter()
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        self.syncs.seconds.append(time.perf_counter() - start)

    def generate(
        self, prompts: list[list[int]], sampling: dict[str, Any], seeds: list[int]
    ) -> list[list[Sample]]:
        """`sampling["n"]` completions of each prompt (vLLM's `SamplingParams` fields), the
        prompt's draws seeded by `seeds[p]` (its i-th completion by `seeds[p] + i`)."""
        vllm = import_vllm()
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        params = [vllm.SamplingParams(**sampling, seed=seed, detokenize=False) for seed in seeds]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [[_sample(c) for c in out.outputs] for out in outputs]

    def close(self) -> None:
        """Shut the engine down (the next `refresh` builds it again)."""
        if self.llm is not None:
            shutdown(self.llm)
            self.llm, self._version, self._sleeping, self._followed = None, None, False, None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def release(self) -> None:
        """Between rollouts: with sleep mode (a GPU), vLLM frees its weights and KV cache."""
        if self.settings.enable_sleep_mode and self.llm is not None and not self._sleeping:
            self.llm.sleep(level=2)
            self._sleeping = True


def _sample(completion: Any) -> Sample:
    logprobs = [
        next(iter(step.values())).logprob if step else float("nan")
        for step in (completion.logprobs or [])
    ]
    return Sample(list(completion.token_ids), logprobs, completion.finish_reason == "stop")


def _write_config(config: Any, folder: Path, dtype: str) -> None:
    """The policy's model config, as vLLM builds a model from it: unquantized (a QLoRA base is
    served dequantized), in `dtype`, its LM head untied."""
    values = config.to_dict()
    values.pop("quantization_config", None)
    # Untied: vLLM's in-place reload cannot re-tie an LM head to the embedding (it places the
    # head's old kernel tensors back), so the head is a weight of its own, sent every sync.
    values["tie_word_embeddings"] = False
    values["torch_dtype"] = values["dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(values, indent=1, default=str))


def served_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` of every weight the policy computes with, by the base model's names (the
    names of a checkpoint, which vLLM's loader maps to its own layers): adapted layers merged
    (`merged_weight`), a 4-bit base dequantized, modules peft trains in full (`modules_to_save`)
    from their trained copy. Tied weights come once (`named_parameters`)."""
    adapted: dict[str, torch.nn.Module] = {}
    trained: dict[str, torch.nn.Module] = {}
    for name, module in policy.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            adapted[name] = module
        elif type(module).__name__ == "ModulesToSaveWrapper":
            trained[name] = module.modules_to_save[module.active_adapters[0]]
    for name, layer in adapted.items():
        yield f"{base_name(name)}.weight", merged_weight(layer)()
        bias = getattr(layer.base_layer, "bias", None)
        if bias is not None:
            yield f"{base_name(name)}.bias", bias.detach()
    for name, module in trained.items():
        for pname, param in module.named_parameters():
            yield f"{base_name(name)}.{pname}", param.detach()
    owned = tuple(f"{n}." for n in (*adapted, *trained))
    for name, param in policy.named_parameters():
        if not name.startswith(owned):
            yield base_name(name), param.detach()
    yield from _tied_head(unwrap_peft(policy))


class _Fingerprinted:
    """The served weights cast to `dtype` as they stream into the engine, and a number that
    changes when any of them changes: the sum over tensors of each one's float64 sum times a
    weight of its own (so that two changes do not cancel across tensors). Taken on the way, so
    the weights are merged once per sync; `finish` reads what the sync did not."""

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> None:
        self._weights, self._dtype = iter(weights), dtype
        self._total, self._index = 0.0, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._weights:
            tensor = tensor.to(self._dtype)
            weight = 1.0 + self._index / 1024
            self._total += float(tensor.sum(dtype=torch.float64)) * weight
            self._index += 1
            yield name, tensor

    def finish(self) -> float:
        for _ in self:  # a sync that stopped reading (or never read) leaves the rest here
            pass
        return self._total


def _tied_head(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The LM head's weight when it is the input embedding's (named once above): the engine's
    head is untied (`_write_config`), so it is sent under its own name too."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embedding is None or head.weight is not embedding.weight:
        return
    name = next(n for n, m in model.named_modules() if m is head)
    yield f"{name}.weight", head.weight.detach()
