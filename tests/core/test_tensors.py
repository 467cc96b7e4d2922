"""core/tensors.py's padding helpers, on hand-written rows."""

from __future__ import annotations

import torch

from grpo_plugin.core.tensors import left_pad, right_pad


def test_right_pad_fills_after_each_row_and_keeps_one_column_for_empty_rows():
    ids, mask = right_pad([[5, 6, 7], [], [8]], pad_value=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 0], [8, 0, 0]] and ids.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]
    values, mask = right_pad([[-0.5], []], pad_value=0.0, dtype=torch.float32)
    assert values.tolist() == [[-0.5], [0.0]] and values.dtype == torch.float32
    assert mask.tolist() == [[1], [0]]  # a row of none still has one (pad) column


def test_left_pad_fills_before_each_row():
    ids, mask = left_pad([[5, 6], [7]], pad_token_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
