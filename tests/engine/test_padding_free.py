"""grpo_plugin.engine.padding_free: the completions packed into one row of real tokens give the
padded forward's log-probs and gradients (issue 28)."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import group_batch, pre_admitted

from grpo_plugin import _logging
from grpo_plugin.engine import padding_free
from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.engine.padding_free import PackedRows
from grpo_plugin.engine.prompt_grad import SharedPromptGrad

GROUP = 3
NEG = torch.finfo(torch.float32).min

pytestmark = pytest.mark.fast_paths  # asserts the fast path ran (or declined)


def _lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # init_lora_weights=False: B is random too, so every matrix gets grads
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.0)
    # admitted up front: these tests count the body's forwards (the checks: test_levers.py)
    return pre_admitted(get_peft_model(model, config).train())


def _batch():
    """Two prompts (9 and 4 tokens), 3 rows each; completions of 9, 3, 7, 9, 2, 5 tokens, and a
    masked token inside row 2 (a hole the padded forward also skips as a key)."""
    batch = group_batch((9, 4), width=9, real_lengths=[9, 3, 7, 9, 2, 5], group=GROUP)
    batch[3][2, 4] = 0
    return batch


def _run(model, batch, **options):
    """Log-probs and LoRA grads of a fixed weighted sum; the body's input shapes, in order."""
    model.zero_grad()
    shapes = []
    body = model.get_base_model().model
    hook = body.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    tokens = (*batch, options.pop("score_mask", None))
    try:
        logps = completion_logprobs(
            model, tokens, chunk_size=5, group_size=GROUP, share_prompt_prefix=True, **options
        ).logps
    finally:
        hook.remove()
    (logps * torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logps.detach(), grads, shapes


def _assert_same(padded, packed, rel=1e-5):
    (logps_a, grads_a, _), (logps_b, grads_b, _) = padded, packed
    assert (logps_a - logps_b).abs().max() / logps_a.abs().max() < rel
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name, grad in grads_a.items():
        assert grad.norm() > 0, name
        assert (grad - grads_b[name]).norm() / grad.norm() < rel, name


def test_layout_by_hand():
    """2 rows of one prompt (L=2, its first token padding in row 0), T=3; row 0 predicts 2
    tokens, row 1 one: kept slots (0,0) (0,1) (1,0) -> packed tokens 0, 1, 2."""
    layout = PackedRows(
        prefix_mask=torch.tensor([[0, 1], [1, 1]]),
        suffix_mask=torch.ones(2, 3, dtype=torch.long),
        target_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
        group=2,
    )
    assert layout.tokens == 3 and layout.token_index.tolist() == [0, 1, 3]
    assert layout.query_index.tolist() == [0, 1, 0, 2, 0, 0]  # dropped slots read token 0
    # keys: the prompt's 2 columns, then 2 + the packed token of each suffix slot
    assert layout.key_index.tolist() == [0, 1, 2, 3, 2, 0, 1, 4, 2, 2]
    assert layout.worth_packing(head_dim=1)  # drops 3 of 6 slots (rows too wide for `attend`)
    assert layout.worth_packing(head_dim=64)
    mask = layout.mask(torch.float32)[:, 0]  # (N, T, L + T)
    allowed = mask == 0
    assert allowed[0, 0].tolist() == [False, True, True, False, False]  # pad prompt token hidden
    assert allowed[0, 1].tolist() == [False, True, True, True, False]  # causal
    assert allowed[1, 0].tolist() == [True, True, True, False, False]
    # a dropped slot's query (output unused) sees the real keys before it and its own slot
    assert allowed[1, 1].tolist() == [True, True, True, True, False]
    assert allowed[1, 2].tolist() == [True, True, True, False, True]
    assert torch.all(mask[~allowed] == NEG)
    assert layout.mask(torch.float32) is layout.mask(torch.float32)  # built once per dtype
    ids = torch.tensor([[10, 11, 12], [20, 21, 22]])
    assert layout.pack(ids).tolist() == [[10, 11, 20]]
    hidden = torch.tensor([[[1.0], [2.0], [3.0]]])  # (1, M, 1)
    assert layout.unpack(hidden)[..., 0].tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]


def test_inline_prompts_by_hand():
    """Prompts inline: 2 prompts of L=3 (prompt 0 left-padded by one), 2 rows each. The row
    starts with their 6 tokens; each prompt query sees its prompt's real keys up to itself, a
    padding query only itself; the suffix keys index the same columns as with a cache."""
    prefix_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    target_mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    masks = (prefix_mask, torch.ones(4, 2, dtype=torch.long), target_mask)
    inline, cached = PackedRows(*masks, group=2, prompts_inline=True), PackedRows(*masks, group=2)
    assert inline.prompt_tokens == 6 and cached.prompt_tokens == 0
    assert inline.key_index.tolist() == cached.key_index.tolist()
    assert torch.equal(inline.mask(torch.float32), cached.mask(torch.float32))
    allowed = inline.prompt_mask(torch.float32)[:, 0] == 0  # (P, L, L)
    assert allowed[0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    assert allowed[1].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert inline.prompt_mask(torch.float32) is inline.prompt_mask(torch.float32)


@pytest.mark.parametrize("heads, kv_heads", [(6, 2), (4, 4)])
def test_row_attention_by_matmul_matches_sdpa(heads, kv_heads):
    """`attend` (each key/value head read by its group of query heads, no copies) against torch's
    SDPA over copied key/value heads: outputs and input gradients within 1e-5 relative."""
    layout = PackedRows(
        prefix_mask=torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]),
        suffix_mask=torch.ones(4, 4, dtype=torch.long),
        target_mask=torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
        group=2,
    )
    mask = layout.mask(torch.float32)  # (4, 1, 4, 7)
    torch.manual_seed(0)
    q = torch.randn(4, heads, 4, 8, requires_grad=True)
    k, v = (torch.randn(4, kv_heads, 7, 8, requires_grad=True) for _ in range(2))
    weight = torch.randn(4, 4, heads, 8)
    out = layout.attend(q, k, v, mask, {"dropout": 0.0, "scaling": 0.3})  # (N, T, heads, d)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    repeat = heads // kv_heads
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1), mask, scale=0.3
    ).transpose(1, 2)
    expected_grads = torch.autograd.grad((expected * weight).sum(), (q, k, v))
    assert out.shape == (4, 4, heads, 8)
    assert (out - expected).abs().max() / expected.abs().max() < 1e-5
    for got, want in zip(grads, expected_grads):
        assert (got - want).norm() / want.norm() < 1e-5
    # SDPA's turn: dropout, a position bias, rows wider than 2 x head dim
    assert layout.attend(q, k, v, mask, {"dropout": 0.1}) is None
    assert layout.attend(q, k, v, mask, {"position_bias": torch.zeros(1)}) is None
    wide = torch.randn(4, heads, 17, 8)
    assert layout.attend(wide, k, v, torch.zeros(4, 1, 17, 7), {}) is None
    on_meta = (t.detach().to("meta") for t in (q, k, v, mask))  # not a CPU: SDPA (not measured)
    assert layout.attend(*on_meta, {}) is None


def test_packed_forward_matches_the_padded_one(tiny_model):
    model = _lora(tiny_model)
    batch = _batch()
    padded = _run(model, batch)
    packed = _run(model, batch, padding_free=True)
    # padded: the prompts once (2 rows of 8), then the suffix (6, 9); packed: ONE row of the
    # prompts' 2 x 8 tokens and the suffix's real slots
    kept = 9 + 3 + 7 + 9 + 2 + 5  # each row up to its last real target, the hole included
    assert padded[2] == [(2, 8), (6, 9)] and packed[2] == [(1, 2 * 8 + kept)]
    _assert_same(padded, packed)
    assert torch.all(packed[0][batch[3] == 0] == 0)


def test_prompts_wider_than_attend_go_inline_through_sdpa(tiny_model):
    """Prompts of 19 and 12 tokens before their last (the tiny model's `attend` takes rows up to
    16): their inline attention runs in transformers' SDPA under the prompt mask, padding
    included, and the result is still the padded forward's."""
    model = _lora(tiny_model)
    batch = group_batch((20, 13), width=9, real_lengths=[9, 3, 7, 9, 2, 5], group=GROUP)
    padded, packed = _run(model, batch), _run(model, batch, padding_free=True)
    assert packed[2] == [(1, 2 * 19 + 35)]
    _assert_same(padded, packed)


def test_a_one_token_prompt_has_only_padding_inline(tiny_model):
    """A one-token prompt beside a 6-token one: its inline part is all padding (each padding
    query sees itself), its completions see none of it, and nothing turns NaN."""
    model = _lora(tiny_model)
    batch = group_batch((1, 6), width=5, real_lengths=[5, 2, 4, 5, 3, 1], group=GROUP)
    padded, packed = _run(model, batch), _run(model, batch, padding_free=True)
    assert packed[2] == [(1, 2 * 5 + 20)]
    assert torch.isfinite(packed[0]).all()
    _assert_same(padded, packed)


def test_a_tool_result_inside_the_completion_is_attended_and_not_scored(tiny_model):
    model = _lora(tiny_model)
    batch = _batch()
    score_mask = batch[3].clone()
    score_mask[:, 3:5] = 0  # a tool result: attended to, never scored
    padded = _run(model, batch, score_mask=score_mask)
    packed = _run(model, batch, score_mask=score_mask, padding_free=True)
    assert packed[2][-1][0] == 1
    _assert_same(padded, packed)


def test_micro_batches_of_one_group_share_its_prompt_packed(tiny_model):
    """Rows of one group in micro-batches of 2 (`SharedPromptGrad`): the prompt is encoded once
    and each micro-batch runs packed against it, with the padded run's grads."""
    model = _lora(tiny_model)
    batch = group_batch((7,), width=6, real_lengths=[6, 2, 5, 1, 3, 6], group=6)

    def run(packed):
        model.zero_grad()
        held, logps = SharedPromptGrad(6), []
        for start in (0, 2, 4):
            part = tuple(t[start : start + 2] for t in batch)
            out = completion_logprobs(model, part, group_size=2, share_prompt_prefix=True, shared_prompt=held, padding_free=packed).logps  # fmt: skip
            (out * torch.linspace(0.5, 1.5, out.numel()).view_as(out)).sum().backward()
            held.after_backward(step_ends=start == 4)
            logps.append(out.detach())
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return torch.cat(logps), grads, held.encodings

    padded, packed = run(False), run(True)
    assert padded[2] == packed[2] == 1
    _assert_same(padded, packed)


def test_narrow_rows_pack_without_padding_wide_ones_run_padded(tiny_model):
    """The tiny model's heads are 8 wide: rows up to 16 tokens attend by `attend` and pack even
    with nothing to drop (same numbers); 20-token rows with no padding run the padded forward."""
    model = _lora(tiny_model)
    batch = group_batch((5, 4), width=6, real_lengths=[6] * 6, group=GROUP)
    packed = _run(model, batch, padding_free=True)
    assert packed[2] == [(1, 2 * 4 + 36)]  # the prompts' 2 x 4 tokens inline
    _assert_same(_run(model, batch, padding_free=False), packed)
    batch = group_batch((5, 4), width=20, real_lengths=[20] * 6, group=GROUP)
    assert _run(model, batch, padding_free=True)[2] == [(2, 4), (6, 20)]
    batch = _batch()  # padding, but fixed shapes were asked for
    shapes = _run(model, batch, padding_free=True, pad_to_multiple_of=4)[2]
    assert shapes[-1][0] == 6


def test_a_layer_that_cannot_run_packed_falls_back_with_one_warning(
    tiny_model, monkeypatch, caplog
):
    """A sliding-window layer (its window is not in the packed mask) is not counted: the whole
    forward runs padded instead, with one warning, and the same result."""
    model = _lora(tiny_model)
    batch = _batch()
    to_rows = PackedRows.to_rows
    monkeypatch.setattr(
        PackedRows, "to_rows", lambda self, q, k, v, w=None: to_rows(self, q, k, v, 8)
    )
    _logging._warned.discard("padding-free")
    padded = _run(model, batch)
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        packed = _run(model, batch, padding_free=True)
        again = _run(model, batch, padding_free=True)
    warnings = [r.getMessage() for r in caplog.records if "padding_free" in r.getMessage()]
    assert len(warnings) == 1 and "0 of 2 attention layers" in warnings[0]
    assert packed[2][-1] == (6, 9)  # the padded suffix after the failed packed one
    assert again[2] == [(2, 8), (6, 9)]  # the body is remembered: no packed try again
    _assert_same(padded, packed, rel=1e-6)
    padding_free._UNSUPPORTED.discard(model.get_base_model().model)


def test_eager_attention_runs_padded_with_one_warning(tiny_model, caplog):
    tiny_model.config._attn_implementation = "eager"
    model = _lora(tiny_model)
    _logging._warned.discard("padding-free")
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        shapes = _run(model, _batch(), padding_free=True)[2]
    assert shapes == [(2, 8), (6, 9)]
    assert any("'eager', not 'sdpa'" in r.getMessage() for r in caplog.records)
    padding_free._UNSUPPORTED.discard(model.get_base_model().model)


def test_a_forward_without_keyword_pass_through_runs_padded(tiny_model, monkeypatch, caplog):
    """A remote-code body whose forward takes no extra keywords: the TypeError that names
    `packed_rows` sends it to the padded forward; any other TypeError is the model's own."""
    model = _lora(tiny_model)
    body = model.get_base_model().model
    forward = body.forward

    def strict(*args, **kwargs):
        if "packed_rows" in kwargs:
            raise TypeError("forward() got an unexpected keyword argument 'packed_rows'")
        return forward(*args, **kwargs)

    monkeypatch.setattr(body, "forward", strict)
    _logging._warned.discard("padding-free")
    with caplog.at_level(logging.WARNING, logger="grpo_plugin"):
        padded = _run(model, _batch(), padding_free=True)
    # the packed try (prompts inline), then the prompt forward and the padded suffix
    assert padded[2] == [(1, 2 * 8 + 35), (2, 8), (6, 9)]
    assert any("does not pass attention keywords on" in r.getMessage() for r in caplog.records)
    padding_free._UNSUPPORTED.discard(body)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_a_half_precision_model_packs_with_a_mask_in_its_dtype(tiny_model, dtype):
    model = _lora(tiny_model.to(dtype))
    batch = _batch()
    padded, packed = _run(model, batch), _run(model, batch, padding_free=True)
    assert packed[2][-1][0] == 1
    scale = padded[0].abs().max()
    assert (padded[0] - packed[0]).abs().max() / scale < 2e-2  # bf16 rounding, not a wrong mask


def test_a_type_error_of_the_model_itself_is_not_hidden(tiny_model, monkeypatch):
    model = _lora(tiny_model)
    body = model.get_base_model().model

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(body, "forward", broken)
    with pytest.raises(TypeError, match="unsupported operand"):
        _run(model, _batch(), padding_free=True)
    assert body not in padding_free._UNSUPPORTED
