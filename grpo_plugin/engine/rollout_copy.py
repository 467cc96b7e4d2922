"""A cheaper copy of the policy that samples the training rollouts (`rollout_precision`).

Decoding reads every weight once per token, so on a CPU (and for small batches on a GPU) it is
bound by memory bandwidth: a copy with half the bytes per weight decodes faster. The copy is a
plain transformers model with the LoRA adapter merged in (no adapter matmuls per token either):

- 'bf16': every weight in bfloat16; on an x86 CPU the linear weights (the LM head too, unless
  its tied table cannot be read from the policy instead) are kept in oneDNN's blocked layout
  (`engine.kernels.PackedBf16Linear`), packed at each refresh instead of reordered by torch on every
  call (a faster decode step: docs/benchmarks.md, history, "packed weights in the copy"; not
  with `compile_decode`, whose compiler packs for itself);
- 'fp16': the linear layers hold float16 weights and compute in float32 (fbgemm's packed fp16
  GEMM, CPU only), the rest in float32: half the bytes where bf16 is not native. (An int8 copy
  through torch's dynamic quantization was tried and dropped: it quantizes the activations too,
  per tensor, and moved the log-probs by 1.6 nats per token on SmolLM2-135M; fp16 weights move
  them by 0.003, bf16 by 0.05.)

It is built once, on the first rollout, and never trained or written back. Before each rollout
whose policy has changed (a new optimizer step) the weights that training moves are copied in:
for LoRA, each adapted layer's W + (alpha / r) B A (peft's own `get_delta_weight`); for full
fine-tuning, every trainable parameter. An fp16 copy of a LoRA policy is the exception: packing
fp16 weights is slow (for SmolLM2's 210 adapted layers most of what the copy saved on short
rollouts: docs/benchmarks.md, history, "a refresh-free fp16 copy"), so there the adapters stay apart, the base weights are packed
once and each adapted layer adds the policy's own adapter, read live: nothing to refresh. A
DoRA (or other LoRA variant) policy is refused: W + B A is not its merged weight. Frozen weights
were cast once and stay. Between rollouts a bf16 copy holds none of the tensors that refresh
writes (`release`): training's activations reuse that memory, and the next refresh allocates and
fills them again (on SmolLM2-135M with LoRA, 214 of the copy's 270 MB). Its samples come
from a slightly different distribution than the policy's; `core/sampling_correction.py` weighs
the loss for it, and evaluation never uses the copy.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._compat import cpu_has_bf16_units
from .kernels import PackedBf16Linear, bf16_packing_works, fp16_weight_linear, set_fp16_weight
from .levers import admitted, relative_difference

logger = logging.getLogger(__name__)


@dataclass
class _Link:
    """One tensor of the copy that training moves: where its value comes from in the policy."""

    read: Callable[[], torch.Tensor]  # the policy's current value (merged for LoRA layers)
    module: torch.nn.Module  # the copy's module that holds it
    name: str  # its parameter name there

    @property
    def packed(self) -> bool:
        """A `PackedBf16Linear`'s weight: written by packing, freed by dropping it."""
        return getattr(self.module, "packed_bf16", False) and self.name == "weight"

    def write(self) -> None:
        value = self.read()
        if getattr(self.module, "fp16_weight", False):  # a packed fp16 layer: pack it again
            set_fp16_weight(self.module, **{self.name: value})
        elif self.packed:
            self.module.set_weight(value)
        else:
            getattr(self.module, self.name).copy_(value)  # casts to the copy's dtype


class RolloutCopy:
    """The rollout copy of one policy: `refresh(policy, version)` returns the model to sample
    from, holding the policy's current weights (copied in only when `version` changed).
    `pack`: a bf16 copy on a CPU holds its linear weights (the LM head too, `_pack_linears`) in
    oneDNN's blocked layout (`PackedBf16Linear`); off for `compile_decode`, which traces plain
    layers."""

    def __init__(self, precision: str, pack: bool = True) -> None:
        if precision not in ("bf16", "fp16"):
            raise ValueError(f"rollout_precision={precision!r}: a copy is 'bf16' or 'fp16'.")
        self.precision, self.pack = precision, pack
        self.model: torch.nn.Module | None = None
        self._links: list[_Link] = []
        self._version: object = None
        self._released: list[int] = []  # each link's bytes while `release`d (0: packed), else empty

    @torch.no_grad()
    def refresh(self, policy: torch.nn.Module, version: object) -> torch.nn.Module:
        if self.model is None:
            check_copyable(policy, self.precision)
            self.model, self._links = _build(policy, self.precision, self.pack)
            self._version = None
        if version != self._version or self._released:
            for link, nbytes in zip(self._links, self._released):
                if nbytes:  # a released plain tensor: its memory back, filled below
                    getattr(link.module, link.name).untyped_storage().resize_(nbytes)
            for link in self._links:
                link.write()
            self._version, self._released = version, []
        return self.model

    def release(self) -> None:
        """Free the memory of every tensor that `refresh` writes, until the next refresh (a bf16
        copy only: an fp16 copy's packed weights cannot be freed apart, and its LoRA form writes
        nothing). The copy's modules stay; its weights must not be read before a refresh."""
        if self.precision != "bf16" or self.model is None or self._released:
            return
        for link in self._links:
            if link.packed:
                link.module.drop_weight()
                self._released.append(0)
            else:
                storage = getattr(link.module, link.name).untyped_storage()
                self._released.append(storage.nbytes())
                storage.resize_(0)


def _is_4bit(policy: torch.nn.Module) -> bool:
    return any("4bit" in type(m).__name__ for m in policy.modules())


def _device_default(policy: torch.nn.Module) -> str:
    """`rollout_precision=None` on this model and device: 'bf16' only where its learning was
    measured against the policy's own rollouts (the demo over 5 seeds, docs/benchmarks.md) and
    it pays: float32 weights, no 4-bit base, no LoRA variant, on a CPU with bf16 units. On a GPU
    the decode step is bound by kernel launches, not by bytes (docs/gpu-check.md), and on a CPU
    without bf16 units the fp16 copy's learning is not measured: 'policy' there."""
    param = next(policy.parameters())
    plain = not _is_4bit(policy) and not any(
        getattr(m, "lora_variant", None) for m in policy.modules()
    )
    on_bf16_cpu = param.device.type == "cpu" and bool(cpu_has_bf16_units())
    return "bf16" if plain and on_bf16_cpu and param.dtype == torch.float32 else "policy"


def resolve_precision(precision: str | None, policy: torch.nn.Module) -> str:
    """`rollout_precision` as this machine runs it: None becomes `_device_default`; 'auto'
    becomes 'bf16' where bf16 is native (a GPU with bf16, a CPU with AVX512-BF16/AMX), 'fp16' on
    any other CPU, and 'policy' where a copy would gain nothing (a 4-bit base, or a bf16 policy
    on bf16 hardware)."""
    if precision is None:
        chosen = _device_default(policy)
        logger.info(
            "rollout_precision default on %s: %r%s",
            next(policy.parameters()).device.type,
            chosen,
            " (a bfloat16 copy samples the rollouts; rollout_precision='policy' samples from the "
            "policy itself)"
            if chosen == "bf16"
            else "",
        )
        return chosen
    if precision != "auto":
        return precision
    param = next(policy.parameters())
    if param.device.type == "cpu":
        native_bf16 = bool(cpu_has_bf16_units())
    else:
        native_bf16 = param.device.type == "cuda" and torch.cuda.is_bf16_supported()
    if _is_4bit(policy) or (native_bf16 and param.dtype == torch.bfloat16):
        chosen = "policy"
    elif native_bf16:
        chosen = "bf16"
    else:
        chosen = "fp16" if param.device.type == "cpu" else "policy"
    logger.info("rollout_precision='auto' on %s: %r", param.device.type, chosen)
    return chosen


def check_copyable(policy: torch.nn.Module, precision: str) -> None:
    """One line when `policy` cannot have a `precision` copy (a 4-bit base decodes from 4-bit
    weights already; a bf16 policy gains nothing from a bf16 copy; fbgemm's fp16 layers run on a
    CPU only), and a warning where a bf16 copy is emulated (slower than the policy)."""
    if _is_4bit(policy):
        raise ValueError(
            f"rollout_precision={precision!r} with a 4-bit (QLoRA) base: it already decodes "
            "from 4-bit weights; use rollout_precision='policy'."
        )
    if any(getattr(m, "lora_variant", None) for m in policy.modules()):
        raise ValueError(
            f"rollout_precision={precision!r} with a DoRA (or other LoRA variant) adapter: the "
            "copy's refresh adds B A to W, which a variant's rescaling does not follow; use "
            "rollout_precision='policy'."
        )
    param = next(policy.parameters())
    if precision == "bf16" and param.dtype == torch.bfloat16:
        raise ValueError(
            "rollout_precision='bf16' with weights already in bfloat16: the copy would be the "
            "policy; use rollout_precision='policy'."
        )
    if precision == "fp16" and param.device.type != "cpu":
        raise ValueError(
            f"rollout_precision='fp16' with the policy on {param.device.type}: fbgemm's fp16 "
            "layers run on a CPU only; use rollout_precision='bf16' (or 'auto')."
        )
    if precision == "bf16" and param.device.type == "cpu" and cpu_has_bf16_units() is False:
        logger.warning(
            "rollout_precision='bf16' on a CPU without AVX512-BF16 or AMX: bf16 is emulated "
            "there and decodes slower than float32 (docs/benchmarks.md; "
            "benchmarks/rollout_precision.py); use rollout_precision='fp16' (or 'auto')."
        )


class _LowRankOnFp16(torch.nn.Module):
    """An fp16-weight base layer plus the policy's own LoRA adapters, read live:
    `base(x) + sum_a scaling_a * B_a(A_a(x))` (no dropout). Nothing to refresh: the adapters
    are the policy's tensors, held in a list so that they are not this module's parameters
    (the copy's `requires_grad_(False)` must not freeze the policy's adapters)."""

    def __init__(self, base: torch.nn.Module, lora_layer: torch.nn.Module) -> None:
        super().__init__()
        self.base = base
        self._policy_layer = [lora_layer]  # a list: not registered as a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self._policy_layer[0]
        out = self.base(x)  # (..., out) float32
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                delta = layer.lora_B[adapter](layer.lora_A[adapter](x))
                out = out + delta * layer.scaling[adapter]
        return out


def base_name(peft_name: str) -> str:
    """A PeftModel's module name as the base (or merged) model names it."""
    return peft_name.removeprefix("base_model.model.")


def _plain_lora_layers(policy: torch.nn.Module) -> dict[str, torch.nn.Module] | None:
    """The policy's LoRA layers by their name in the base model, when every adapted layer is a
    plain LoRA linear (no DoRA or other variant, no embedding adapter) and peft trains no
    module in full; else None."""
    layers = {}
    for name, module in policy.named_modules():
        if type(module).__name__ == "ModulesToSaveWrapper":
            return None
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            plain = type(module.base_layer) is torch.nn.Linear and not getattr(
                module, "lora_variant", {}
            )
            if not plain or getattr(module, "lora_embedding_A", {}):
                return None
            layers[base_name(name)] = module
    return layers or None


def _build_fp16_low_rank(policy: torch.nn.Module) -> tuple[torch.nn.Module, list[_Link]] | None:
    """A LoRA policy's fp16 copy that keeps the adapters apart: the base weights packed once,
    the policy's adapters applied live (float32). None where `_plain_lora_layers` says no."""
    layers = _plain_lora_layers(policy)
    if layers is None:
        return None
    base = copy.deepcopy(policy).unload()  # the base model, adapters removed, not merged
    base.requires_grad_(False).eval().float()
    for name, lora_layer in layers.items():
        owner, leaf = _owner(base, name)
        fp16 = fp16_weight_linear(getattr(owner, leaf))
        setattr(owner, leaf, _LowRankOnFp16(fp16, lora_layer))
    _swap_linears(base, [], fp16_weight_linear)  # the rest (the LM head), never trained here
    logger.info("Rollout copy in fp16 built (LoRA adapters read live: nothing to refresh)")
    return base, []


def _build(
    policy: torch.nn.Module, precision: str, pack: bool
) -> tuple[torch.nn.Module, list[_Link]]:
    """The copy and the links that refresh it from `policy`."""
    is_peft = callable(getattr(policy, "merge_and_unload", None))
    if is_peft and precision == "fp16":
        built = _build_fp16_low_rank(policy)
        if built is not None:
            return built
    merged = copy.deepcopy(policy)
    merged = merged.merge_and_unload() if is_peft else merged
    merged.requires_grad_(False).eval()
    links = _peft_links(policy, merged) if is_peft else _full_links(policy, merged)
    packed = precision == "bf16" and pack and _on_cpu(merged) and bf16_packing_works()
    if precision == "bf16":
        merged.to(torch.bfloat16)
        packed = packed and admitted("packed_bf16", policy, _packing_difference(merged))
    else:
        merged.float()  # fbgemm's fp16 layers take float32 activations
        _swap_linears(merged, links, fp16_weight_linear)
    if packed:
        _pack_linears(policy, merged, links)
    logger.info(
        "Rollout copy in %s built (%d tensors refreshed per update%s)",
        precision,
        len(links),
        "; linear weights packed for oneDNN" if packed else "",
    )
    return merged, links


@torch.no_grad()
def _packing_difference(model: torch.nn.Module) -> float:
    """The admission check of lever `packed_bf16`: every bf16 linear layer of the copy packed
    for oneDNN against `F.linear` with its plain weight, on 3 random rows (a generator of its
    own); the largest relative difference."""
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for layer in model.modules():
        if type(layer) is not torch.nn.Linear:
            continue
        x = torch.randn(3, layer.in_features, generator=generator).to(layer.weight.dtype)
        reference = torch.nn.functional.linear(x, layer.weight, layer.bias)
        worst = max(worst, relative_difference(PackedBf16Linear(layer)(x), reference))
    return worst


def _pack_linears(policy: torch.nn.Module, merged: torch.nn.Module, links: list[_Link]) -> None:
    """Swap the bf16 copy's linear layers for `PackedBf16Linear`s, the LM head included. A head
    tied to the input embedding is packed only where the copy can look its embeddings up in the
    policy's own table instead (`_PolicyRowsEmbedding`): the copy's bf16 table is then dropped,
    so the packed head takes its place rather than adding a second copy of it (a little faster
    per decode step: docs/benchmarks.md, round three)."""
    head, embedding = merged.get_output_embeddings(), merged.get_input_embeddings()
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    lookup = _PolicyRowsEmbedding.of(policy, embedding) if tied else None
    _swap_linears(merged, links, PackedBf16Linear, skip=head if tied and lookup is None else None)
    if lookup is not None:  # the head (and its link, when it trains) holds the table now
        links[:] = [link for link in links if link.module is not embedding]
        merged.set_input_embeddings(lookup)


class _PolicyRowsEmbedding(torch.nn.Module):
    """A copy's input embedding that holds no table: the rows of the policy's own `nn.Embedding`,
    cast to the copy's dtype (the values a cast table would hold, read live, so a trained table
    needs no refresh)."""

    def __init__(self, table: torch.nn.Embedding, dtype: torch.dtype) -> None:
        super().__init__()
        self._table = [table]  # a list: not a submodule (the copy's requires_grad_(False))
        self.dtype = dtype

    @classmethod
    def of(cls, policy: torch.nn.Module, embedding: torch.nn.Module) -> _PolicyRowsEmbedding | None:
        """The lookup replacing the copy's `embedding`, or None where the policy's table is not a
        plain `nn.Embedding` of the same shape (a scaled or adapted embedding keeps its table)."""
        table = policy.get_input_embeddings()
        plain = type(table) is torch.nn.Embedding and type(embedding) is torch.nn.Embedding
        if not plain or table.max_norm is not None or table.weight.shape != embedding.weight.shape:
            return None
        return cls(table, embedding.weight.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L, H)
        return torch.nn.functional.embedding(input_ids, self._table[0].weight).to(self.dtype)


def _owner(root: torch.nn.Module, dotted: str) -> tuple[torch.nn.Module, str]:
    path, _, leaf = dotted.rpartition(".")
    return (root.get_submodule(path) if path else root), leaf


def _full_links(policy: torch.nn.Module, merged: torch.nn.Module) -> list[_Link]:
    """Full fine-tuning: every trainable parameter, by name."""
    links = []
    for name, param in policy.named_parameters():
        if param.requires_grad:
            links.append(_Link(param.detach, *_owner(merged, name)))
    return links


def _peft_links(policy: torch.nn.Module, merged: torch.nn.Module) -> list[_Link]:
    """LoRA: each adapted layer's merged weight, and the modules peft trains in full
    (`modules_to_save`), from the PeftModel's names to the merged model's."""
    links = []
    for name, module in policy.named_modules():
        target = base_name(name)
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            links.append(_Link(merged_weight(module), merged.get_submodule(target), "weight"))
        elif type(module).__name__ == "ModulesToSaveWrapper":
            trained = module.modules_to_save[module.active_adapters[0]]
            for pname, param in trained.named_parameters():
                owner, leaf = _owner(merged.get_submodule(target), pname)
                links.append(_Link(param.detach, owner, leaf))
    return links


def merged_weight(layer: torch.nn.Module) -> Callable[[], torch.Tensor]:
    """W + the active adapters' deltas: W + scaling B A in one `addmm` for a plain linear adapter
    (one pass over W, not peft's three: B A, its scaling, the sum), else W + peft's own
    `get_delta_weight`. A 4-bit (bitsandbytes) W is dequantized first, as peft's merge does
    (the vLLM engine serves a QLoRA policy so; a copy refuses a 4-bit base)."""

    plain = type(layer.base_layer) is torch.nn.Linear and not getattr(layer, "fan_in_fan_out", 0)

    def read() -> torch.Tensor:
        weight = _dense(layer.base_layer.weight)  # (out, in)
        for adapter in layer.active_adapters:
            if plain and adapter in layer.lora_A:
                down = layer.lora_A[adapter].weight.to(weight.dtype)  # (r, in)
                up = layer.lora_B[adapter].weight.to(weight.dtype)  # (out, r)
                weight = torch.addmm(weight, up, down, alpha=layer.scaling[adapter])
            elif adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
        return weight

    return read


def _dense(weight: torch.Tensor) -> torch.Tensor:
    """A layer's weight as a dense tensor: a bitsandbytes 4-bit one dequantized (peft's helper)."""
    if type(weight).__name__ == "Params4bit":
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, state=weight.quant_state)
    return weight.detach()


def _on_cpu(model: torch.nn.Module) -> bool:
    return next(model.parameters()).device.type == "cpu"


def _swap_linears(
    merged: torch.nn.Module,
    links: list[_Link],
    make: Callable[[torch.nn.Linear], torch.nn.Module],
    skip: torch.nn.Module | None = None,
) -> None:
    """Every `nn.Linear` of the copy but `skip` becomes `make(linear)` (an fp16-weight or a packed
    bf16 layer); links to it follow, and a layer whose weight was tied to a linked tensor (the LM
    head to the embedding) gets a link of its own."""
    by_storage = {getattr(x.module, x.name).data_ptr(): x for x in links}
    for name, module in list(merged.named_modules()):
        if type(module) is not torch.nn.Linear or module is skip:
            continue
        owner, leaf = _owner(merged, name)
        swapped = make(module)
        setattr(owner, leaf, swapped)
        for link in links:
            if link.module is module:
                link.module = swapped
        tied = by_storage.get(module.weight.data_ptr())
        if tied is not None and tied.module is not swapped:
            links.append(_Link(tied.read, swapped, "weight"))
