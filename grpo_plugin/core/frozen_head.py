"""Completion log-probs through a frozen LM head, their gradient taken in the forward pass.

A position with hidden state h `(H,)` scores its token t through the head's logits
z = s(h W^T + b) / T `(V,)` (s: Gemma's soft cap, `cap * tanh(x / cap)`, or none; T: the
temperature): log p_t = z_t - logsumexp(z). When the head is frozen (LoRA and QLoRA never train
it) the only gradient backward needs is the one with respect to h, and that is one vector per
position:

    d log p_t / d h = ((e_t - p) * s') W / T        p = softmax(z), s' = ds/dx, e_t one-hot

The forward computes it straight away, with the one `(C, V) x (V, H)` matmul backward would run,
and saves only that `(C, H)` Jacobian; backward scales it by the incoming gradient. The general
path (`logprobs._chunked_head` under `torch.utils.checkpoint`) instead runs the head and the
log-softmax again in backward: one `(C, H) x (H, V)` matmul and several passes over `(C, V)`
more per chunk, the largest matmul of a small model's training step. Log-probs are computed by
the same operations as that path (equal bit for bit); gradients equal its to float rounding.
"""

from __future__ import annotations

import torch

__all__ = ["frozen_head_logps", "is_frozen_linear"]


def is_frozen_linear(head: torch.nn.Module) -> bool:
    """True for a plain `nn.Linear` head none of whose parameters train."""
    return type(head) is torch.nn.Linear and not any(p.requires_grad for p in head.parameters())


class _FrozenHeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head, targets, scoring):
        # hidden (C, H); targets (C,) int64; scoring: (temperature, softcap, want_entropy)
        temperature, softcap, want_entropy = scoring
        raw = head(hidden).float()  # (C, V)
        if softcap:
            capped = torch.tanh(raw / softcap)  # (C, V)
            logits, slope = capped * softcap, 1.0 - capped * capped  # s(x) and s'(x)
        else:
            logits, slope = raw, None
        if temperature != 1.0:
            logits = logits.div_(temperature)
        log_norm = torch.logsumexp(logits, dim=-1)  # (C,)
        logps = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # (C,)
        log_probs = logits.sub_(log_norm.unsqueeze(-1))  # (C, V), in place: logits are done
        probs = log_probs.exp()  # (C, V)
        entropy = -(probs * log_probs).sum(-1) if want_entropy else logps.new_zeros(0)  # (C,)
        del log_probs, logits, raw
        direction = probs.neg_()  # (C, V): e_t - p, built in place
        rows = torch.arange(targets.numel(), device=targets.device)
        direction[rows, targets] += 1.0
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
