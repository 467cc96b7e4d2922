"""Padding and position helpers shared by generation and the training forward; a masked mean and a NaN-aware std."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.LongTensor:
    """Positions that skip left padding, as HF generation computes them: `(B, L)` -> `(B, L)`."""
    positions = attention_mask.long().cumsum(-1) - 1  # (B, L)
    return positions.clamp(min=0)


def left_pad(
    sequences: list[list[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Left-pad token lists into `(ids, mask)`, both `(B, max_len)`."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def right_pad(
    rows: list[list], pad_value: float, dtype: torch.dtype = torch.long
) -> tuple[torch.Tensor, torch.LongTensor]:
    """Right-pad lists into `(values, mask)`, both `(B, max(1, longest))` (a row of none: all
    pad)."""
    width = max(1, max(len(row) for row in rows))
    values = torch.full((len(rows), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        values[r, : len(row)] = torch.tensor(row, dtype=dtype)
        mask[r, : len(row)] = 1
    return values, mask


def pad_columns(x: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    """Pad `(B, L)` to `(B, width)` on the left or the right (no-op when already wide enough)."""
    extra = width - x.shape[1]
    return F.pad(x, (extra, 0) if left else (0, extra), value=value) if extra > 0 else x


def nanstd(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Population std ignoring NaN (0 where nothing was scored)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    return torch.nanmean((x - mean) ** 2, dim=dim).sqrt().nan_to_num(0.0)


def masked_mean(x: torch.Tensor, weight: torch.Tensor) -> float:
    """The mean of `x` over the positions where `weight` is 1 (both `(N, T)`; 0 when none)."""
    return ((x.to(weight.dtype) * weight).sum() / weight.sum().clamp(min=1)).item()
