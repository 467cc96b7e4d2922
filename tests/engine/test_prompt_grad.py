"""grpo_plugin.engine.prompt_grad: a group split over micro-batches encodes its prompt once, with the
plain forward's log-probs and gradients (issue 28)."""

from __future__ import annotations

import pytest
import torch
from conftest import group_batch, pre_admitted

from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.engine.prompt_grad import SharedPromptGrad

G = 6  # rows per group
MICRO = 2  # rows per micro-batch: a group is 3 micro-batches

# the held prompt is the `shared_prompt` lever: GRPO_PLUGIN_FAST_PATHS=0 never holds one
pytestmark = pytest.mark.fast_paths


def _lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # init_lora_weights=False: B is random too, so every matrix gets grads
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.0)
    return get_peft_model(model, config).train()


def _batch(same_prompts=False):
    """G rows per prompt (lengths 7 and 4); `same_prompts`: the second group repeats the first's
    prompt (then both have length 7)."""
    prompt_ids, prompt_mask, completions, completion_mask = group_batch(
        (7, 7) if same_prompts else (7, 4),
        width=6,
        real_lengths=[6 - r % 3 for r in range(2 * G)],
        group=G,
    )
    if same_prompts:
        prompt_ids[G:], prompt_mask[G:] = prompt_ids[:G].clone(), prompt_mask[:G].clone()
    return prompt_ids, prompt_mask, completions, completion_mask


def _weights(rows: torch.Tensor, width: int) -> torch.Tensor:
    """A fixed, row-dependent weight per token, so every row's gradient counts differently."""
    return 0.5 + rows[:, None].float() / 10 + torch.arange(width)[None, :] / 20


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _plain(model, batch, rows):
    model.zero_grad()
    part = tuple(t[rows] for t in batch)
    logps = completion_logprobs(model, part).logps
    (logps * _weights(rows, logps.size(1))).sum().backward()
    return logps.detach(), _grads(model)


def _held(model, batch, order, step_ends_after=()):
    """Micro-batches of MICRO rows in `order` (lists of row indices), the held prompt flushed as
    the trainer does; `step_ends_after`: micro-batch indices that end an optimizer step."""
    model.zero_grad()
    held, prefix_calls, logps = SharedPromptGrad(G), [], {}
    body = model.get_base_model().model
    hook = body.register_forward_pre_hook(
        lambda module, args, kwargs: prefix_calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    try:
        for index, rows in enumerate(order):
            rows = torch.tensor(rows)
            part = tuple(t[rows] for t in batch)
            out = completion_logprobs(
                model, part, group_size=MICRO, share_prompt_prefix=True, shared_prompt=held
            ).logps
            (out * _weights(rows, out.size(1))).sum().backward()
            held.after_backward(step_ends=index in step_ends_after or index == len(order) - 1)
            for row, values in zip(rows.tolist(), out.detach()):
                logps[row] = values
    finally:
        hook.remove()
    assert not held.holds_prompt  # nothing left pending after the step
    return logps, _grads(model), held.encodings, prefix_calls


def _assert_close(plain_grads, held_grads, rel=1e-5):
    assert plain_grads.keys() == held_grads.keys() and len(plain_grads) > 0
    for name, grad in plain_grads.items():
        assert grad.norm() > 0, name
        assert (grad - held_grads[name]).norm() / grad.norm() < rel, name


def _in_order(rows: int) -> list[list[int]]:
    return [list(range(start, start + MICRO)) for start in range(0, rows, MICRO)]


def test_each_prompt_is_encoded_once_for_its_three_micro_batches_exactly(tiny_model):
    model = pre_admitted(_lora(tiny_model))  # its forwards are counted
    batch = _batch()
    plain_logps, plain_grads = _plain(model, batch, torch.arange(2 * G))
    logps, grads, encodings, calls = _held(model, batch, _in_order(2 * G))
    assert encodings == 2
    # the body runs 2 prompt prefixes (1 row; the prompts' lengths 7 and 4, minus the last token,
    # left padding trimmed) and 6 suffixes of MICRO rows
    assert [c for c in calls if c[0] == 1] == [(1, 6), (1, 3)]
    assert sum(1 for c in calls if c[0] == MICRO) == 6
    held_logps = torch.stack([logps[r] for r in range(2 * G)])
    assert (held_logps - plain_logps).abs().max() / plain_logps.abs().max() < 1e-5
    _assert_close(plain_grads, grads)


def test_a_step_that_ends_mid_group_flushes_what_ran(tiny_model):
    """Rows 0-3 (two thirds of group 0) in one step: the gradient of exactly those rows."""
    model = _lora(tiny_model)
    batch = _batch()
    _, plain_grads = _plain(model, batch, torch.arange(4))
    _, grads, encodings, _ = _held(model, batch, _in_order(4))
    assert encodings == 1
    _assert_close(plain_grads, grads)


def test_interleaved_groups_flush_on_each_switch_and_stay_exact(tiny_model):
    """A shuffle that alternates groups' micro-batches: each switch flushes, nothing is lost."""
    model = _lora(tiny_model)
    batch = _batch()
    order = [[0, 1], [6, 7], [2, 3], [4, 5], [8, 9], [10, 11]]
    _, plain_grads = _plain(model, batch, torch.arange(2 * G))
    _, grads, encodings, _ = _held(model, batch, order)
    assert encodings == 4  # g0, then g1 (g0 flushed), g0 again (g1 flushed), g1 again
    _assert_close(plain_grads, grads)


def test_two_groups_with_the_same_prompt_are_encoded_once_each(tiny_model):
    """A prompt drawn twice in one rollout: the first group's G rows flush before the second."""
    model = _lora(tiny_model)
    batch = _batch(same_prompts=True)
    _, plain_grads = _plain(model, batch, torch.arange(2 * G))
    _, grads, encodings, _ = _held(model, batch, _in_order(2 * G))
    assert encodings == 2
    _assert_close(plain_grads, grads)


def test_discard_drops_the_held_prompt_without_a_backward(tiny_model):
    model = _lora(tiny_model)
    batch = _batch()
    held = SharedPromptGrad(G)
    part = tuple(t[:MICRO] for t in batch)
    out = completion_logprobs(
        model, part, group_size=MICRO, share_prompt_prefix=True, shared_prompt=held
    ).logps
    model.zero_grad()
    out.sum().backward()
    suffix_only = _grads(model)
    assert held.holds_prompt
    held.discard()
    assert not held.holds_prompt
    assert _grads(model).keys() == suffix_only.keys()
    for name, grad in _grads(model).items():
        assert torch.equal(grad, suffix_only[name]), name  # no prompt backward happened
