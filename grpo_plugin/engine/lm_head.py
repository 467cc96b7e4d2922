"""One chunk of completion positions through the LM head: `(C, H)` hidden states -> `(C,)`
log-probs of their tokens, the scoring `forward._chunked_head` runs chunk by chunk; and the head
kept in float32 (`cast_lm_head_to_fp32`, applied by the policy's loading in `models/policy.py`).

`chunk_logps` is the general form: head, float32 logits (soft cap, temperature), log-softmax,
gather. With grad it runs under `torch.utils.checkpoint`, so backward runs the head and the
log-softmax again. `frozen_head_logps` is the form for a head that does not train.

A position with hidden state h `(H,)` scores its token t through the head's logits
z = s(h W^T + b) / T `(V,)` (s: Gemma's soft cap, `cap * tanh(x / cap)`, or none; T: the
temperature): log p_t = z_t - logsumexp(z). When the head is frozen (LoRA and QLoRA never train
it) the only gradient backward needs is the one with respect to h, and that is one vector per
position:

    d log p_t / d h = ((e_t - p) * s') W / T        p = softmax(z), s' = ds/dx, e_t one-hot

The forward computes it straight away, with the one `(C, V) x (V, H)` matmul backward would run,
and saves only that `(C, H)` Jacobian; backward scales it by the incoming gradient: one
`(C, H) x (H, V)` matmul and several passes over `(C, V)` fewer per chunk than the checkpointed
general form, whose recompute is the largest matmul of a small model's training step. Both forms
score through `scaled_logits` and `_token_logps`, so their log-probs are equal bit for bit; their
gradients are equal to float rounding.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from .._compat import unwrap_peft

__all__ = [
    "cast_lm_head_to_fp32",
    "chunk_logps",
    "frozen_head_logps",
    "is_frozen_linear",
    "scaled_logits",
]


def scaled_logits(raw: torch.Tensor, temperature: float, softcap: float | None):
    """The logits a token is scored on, from the head's float32 output `raw` `(C, V)` (modified in
    place): Gemma-style soft cap `cap * tanh(x / cap)` when set, then `/ temperature`. Returns them
    and `tanh(x / cap)` (None without a cap), whose derivative the frozen form needs."""
    capped = None
    if softcap:
        capped = torch.tanh(raw / softcap)  # (C, V)
        raw = capped * softcap
    if temperature != 1.0:
        raw = raw.div_(temperature)
    return raw, capped


def _token_logps(logits: torch.Tensor, targets: torch.Tensor):
    """`(C,)` log-probs of `targets` under `logits` `(C, V)`, and the `(C,)` log-normaliser."""
    log_norm = torch.logsumexp(logits, dim=-1)  # (C,)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm, log_norm


def _softmax_parts(logits: torch.Tensor, targets: torch.Tensor, keep_shifted: bool):
    """The frozen form's pass over `(C, V)` logits, consuming them: `(log-probs (C,), exps (C, V),
    total (C,), shifted (C, V) or None)` with shifted = z - m (m the row max; in place in `logits`)
    exps = exp(shifted) (in place too unless `keep_shifted`) and total = sum(exps). The log-probs
    are `_token_logps`'s bit for bit: torch's CPU `logsumexp` is the same amax, masked infinite
    max, exp of the difference, sum, log and add. Five passes over `(C, V)` where the two-step
    form (logsumexp, then softmax from the normaliser) took seven."""
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (C,)
    row_max = logits.amax(dim=-1, keepdim=True)  # (C, 1)
    row_max.masked_fill_(row_max.abs() == float("inf"), 0.0)
    shifted = logits.sub_(row_max)  # (C, V)
    exps = shifted.exp() if keep_shifted else shifted.exp_()
    total = exps.sum(dim=-1)  # (C,)
    log_norm = total.log().add_(row_max.squeeze(-1))
    return target_logits - log_norm, exps, total, (shifted if keep_shifted else None)


def chunk_logps(head, hidden, targets, temperature: float, softcap: float | None, entropy: str):
    """Head + float32 log-softmax + gather for one chunk: `(C, H)` -> `(C,)` log-probs (and entropy:
    `entropy` is "" for none, "detached" or "grad")."""
    raw = head(hidden).float()  # (C, V); the matmul does not save its output: in-place is safe
    logits, _ = scaled_logits(raw, temperature, softcap)
    logps, log_norm = _token_logps(logits, targets)
    if not entropy:
        return logps, logps.new_zeros(0)
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        log_probs = logits - log_norm.unsqueeze(-1)
        token_entropy = -(log_probs.exp() * log_probs).sum(-1)  # (C,)
    return logps, token_entropy


def is_frozen_linear(head: torch.nn.Module) -> bool:
    """True for a plain `nn.Linear` head none of whose parameters train."""
    return type(head) is torch.nn.Linear and not any(p.requires_grad for p in head.parameters())


class _FrozenHeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, targets, scoring):
        # hidden (C, H); targets (C,) int64; scoring: (temperature, softcap, want_entropy)
        temperature, softcap, want_entropy = scoring
        logits, capped = scaled_logits(head(hidden).float(), temperature, softcap)  # (C, V)
        slope = None if capped is None else 1.0 - capped * capped  # s'(x) of the soft cap
        del capped
        logps, exps, total, shifted = _softmax_parts(logits, targets, keep_shifted=want_entropy)
        entropy = logps.new_zeros(0)
        if want_entropy:  # H = log S - sum_v e_v (z_v - m) / S, in place over the shifted
            weighted = shifted.mul_(exps).sum(dim=-1)  # (C,); shifted is done with
            entropy = total.log() - weighted / total
        del shifted, logits
        direction = exps.mul_((-1.0 / total).unsqueeze(-1))  # (C, V): -p, in place
        rows = torch.arange(targets.numel(), device=targets.device)
        direction[rows, targets] += 1.0  # e_t - p
        if slope is not None:
            direction.mul_(slope)
        weight = head.weight  # (V, H)
        jacobian = (direction.to(weight.dtype) @ weight).float()  # (C, H)
        if temperature != 1.0:
            jacobian.div_(temperature)
        ctx.hidden_dtype = hidden.dtype
        ctx.save_for_backward(jacobian)
        ctx.mark_non_differentiable(entropy)
        return logps, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logps, _grad_entropy):
        (jacobian,) = ctx.saved_tensors  # (C, H)
        grad_hidden = (grad_logps.unsqueeze(-1) * jacobian).to(ctx.hidden_dtype)  # (C, H)
        return grad_hidden, None, None, None


def frozen_head_logps(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
    want_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(C,)` float32 log-probs of `targets` under `head(hidden)` `(C, H)` (and their `(C,)`
    detached entropies when `want_entropy`, else an empty tensor), differentiable with respect to
    `hidden` only: `head` must be frozen (`is_frozen_linear`)."""
    return _FrozenHeadLogps.apply(hidden, head, targets, (temperature, softcap, want_entropy))


def cast_lm_head_to_fp32(model: Any) -> None:
    """Keep the LM head's weights in float32 and run it on float32 hidden states (ScaleRL,
    https://arxiv.org/abs/2510.13786), so logits and log-probs come out of a float32 matmul.

    With tied embeddings the shared weight becomes float32 too, and the embedding output is cast
    back to the model's dtype. Refused when a LoRA adapter sits on the head (it would be bypassed).
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    base = unwrap_peft(model)
    head = base.get_output_embeddings()
    if isinstance(head, BaseTunerLayer):
        raise ValueError(
            "cast_lm_head_to_fp32=True is not supported with a LoRA adapter on lm_head: remove "
            "'lm_head' from the adapter's target_modules, or set cast_lm_head_to_fp32=False."
        )
    model_dtype = head.weight.dtype
    head.float()
    head.forward = types.MethodType(_fp32_linear_forward, head)
    if getattr(base.config, "tie_word_embeddings", False) and model_dtype != torch.float32:
        base.get_input_embeddings().register_forward_hook(_cast_output_hook(model_dtype))


def _fp32_linear_forward(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    bias = None if self.bias is None else self.bias.float()
    with torch.autocast(hidden.device.type, enabled=False):  # bf16=True's autocast would lower it
        return torch.nn.functional.linear(hidden.float(), self.weight.float(), bias)


def _cast_output_hook(dtype: torch.dtype):
    def hook(module, args, output):
        return output.to(dtype)

    return hook
