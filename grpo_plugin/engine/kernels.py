"""The CPU kernels and the packed rows' attention entry of the engine's levers.

- `PackedBf16Linear`, `bf16_packing_works` (lever `packed_bf16`): torch 2.13 on a CPU reorders a
  bf16 `F.linear`'s weight into oneDNN's blocked layout on every call; only the private
  `torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise` (what inductor's freezing uses)
  keep it packed (its gain: docs/benchmarks.md, "The engine's levers").
  Remove when torch has a public prepacked CPU linear.
- `fp16_weight_linear`, `set_fp16_weight` (the fp16 rollout copy, `rollout_precision: fp16`):
  torch 2.13 has a float16-weight linear with float32 compute on CPU (fbgemm) only in the
  deprecated `torch.ao` dynamic quantization, which warns on every layer. Remove when torch has
  a supported half-weight linear on CPU.
- `rows_attention_for_packed_tokens` (lever `padding_free`): transformers 5.25's attention
  functions take the batch layout of their inputs, so a padding-free forward (real tokens packed
  into one row) would attend across every packed token. The SDPA entry of `AttentionInterface`
  is wrapped once (public `register`): a call that carries `packed_rows` (padding_free.py) runs
  its attention in the padded row layout; every other call passes through unchanged. Remove
  when transformers attends per sequence in a packed row for SDPA (as for flash-attention's
  varlen).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def _ao_quiet() -> Iterator[None]:
    """torch 2.13 warns that `torch.ao` quantization is deprecated, on every layer it builds."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.ao.*")
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        yield


def fp16_weight_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    """A copy of `linear` whose weight is stored in float16 (fbgemm's packed fp16 GEMM: float32
    activations and accumulation, the weight read at half the bytes), marked `fp16_weight`."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    with _ao_quiet():
        layer = DynamicLinear(linear.in_features, linear.out_features, dtype=torch.float16)
    layer.fp16_weight = True
    layer.fp16_bias = None  # the float32 bias, kept here: reading it back unpacks the weight too
    set_fp16_weight(layer, linear.weight, linear.bias)
    return layer


def set_fp16_weight(layer: torch.nn.Module, weight=None, bias=None) -> None:
    """Pack `weight` into an `fp16_weight_linear` layer and/or set its `bias` (None: keep it)."""
    weight = layer.weight() if weight is None else weight.detach().float()
    if bias is not None:
        layer.fp16_bias = bias.detach().float()
    with _ao_quiet():
        layer.set_weight_bias(weight, layer.fp16_bias)


_PACK_ROWS = 16  # the rows oneDNN's layout is tuned for: a decode step's batch; any count runs
_PACKING_WORKS: list[bool] = []  # process-wide, probed once


def bf16_packing_works() -> bool:
    """Whether this torch build packs bf16 linear weights for oneDNN (x86 CPU builds with
    mkldnn), checked once on a small layer against `F.linear`."""
    if not _PACKING_WORKS:
        try:
            weight, x = torch.randn(24, 40).bfloat16(), torch.randn(3, 40).bfloat16()
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS)
            out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            expected = torch.nn.functional.linear(x, weight).float()
            works = bool(torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-2))
        except (AttributeError, RuntimeError, NotImplementedError):
            works = False
        _PACKING_WORKS.append(works)
    return _PACKING_WORKS[0]


class PackedBf16Linear(torch.nn.Module):
    """A bf16 `nn.Linear` for a CPU whose weight stays in oneDNN's blocked layout (see the table
    above). `set_weight` packs a new weight (any float dtype: cast to bf16 first); `drop_weight`
    frees it until the next `set_weight`."""

    packed_bf16 = True

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias, persistent=False)
        self._packed: torch.Tensor | None = None  # opaque oneDNN tensor
        self.set_weight(linear.weight)

    @property
    def holds_weight(self) -> bool:
        return self._packed is not None

    def set_weight(self, weight: torch.Tensor) -> None:
        plain = weight.detach().to(torch.bfloat16).contiguous()  # (out, in)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(plain, _PACK_ROWS)

    def drop_weight(self) -> None:
        self._packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) bf16 -> (..., out) bf16
        if self._packed is None:
            raise RuntimeError("PackedBf16Linear: its weight was dropped; set_weight it first.")
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 packed"


_ROWS_ATTENTION: list[bool] = []  # process-wide: the SDPA wrapper installed (or not possible)


def rows_attention_for_packed_tokens(body: torch.nn.Module) -> bool:
    """Make SDPA attention honour a `packed_rows` keyword (a `core.padding_free.PackedRows`):
    queries, keys and values go to the padded row layout, attention runs there with the layout's
    mask, the output comes back packed. False when `body` does not attend through transformers'
    SDPA entry (eager, flash, flex, remote code): a packed forward cannot run there."""
    if getattr(getattr(body, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    if not _ROWS_ATTENTION:
        try:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

            sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        except (ImportError, KeyError):
            _ROWS_ATTENTION.append(False)
            return False

        def sdpa_in_rows(module, query, key, value, attention_mask, **kwargs):
            rows = kwargs.pop("packed_rows", None)
            if rows is None:  # any other forward: untouched
                return sdpa(module, query, key, value, attention_mask, **kwargs)
            return rows.attention(module, query, key, value, kwargs, sdpa), None  # (1, S, h, d)

        AttentionInterface.register("sdpa", sdpa_in_rows)
        _ROWS_ATTENTION.append(True)
    return _ROWS_ATTENTION[0]
