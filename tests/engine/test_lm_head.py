"""The LM head's scoring of a chunk (`grpo_plugin/engine/lm_head.py`): the frozen head's
log-probs with their gradient taken in the forward, against the checkpointed path and by hand."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import group_batch, pre_admitted

from grpo_plugin.engine import forward as logprobs_module
from grpo_plugin.engine.forward import completion_logprobs
from grpo_plugin.engine.lm_head import frozen_head_logps, is_frozen_linear


def _lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.0)
    return get_peft_model(model, config)


def _logps_and_grads(model, batch, **kwargs):
    model.zero_grad()
    out = completion_logprobs(model, batch, chunk_size=5, **kwargs)
    weights = torch.linspace(-1.0, 2.0, out.logps.numel()).view_as(out.logps)
    (out.logps * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return out, grads


def test_one_position_by_hand():
    # H = 2, V = 3, W = [[1, 0], [0, 1], [1, 1]], h = (0, 0): z = 0, p = 1/3 each, target 2.
    head = torch.nn.Linear(2, 3, bias=False).requires_grad_(False)
    head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    hidden = torch.zeros(1, 2, requires_grad=True)
    logps, entropy = frozen_head_logps(head, hidden, torch.tensor([2]), 1.0, None, True)
    assert logps.item() == pytest.approx(-math.log(3))
    assert entropy.item() == pytest.approx(math.log(3))
    logps.sum().backward()
    # (e_2 - p) W = (-1/3, -1/3, 2/3) W = (-1/3 + 2/3, -1/3 + 2/3) = (1/3, 1/3)
    torch.testing.assert_close(hidden.grad, torch.tensor([[1 / 3, 1 / 3]]))


@pytest.mark.parametrize("temperature, softcap", [(1.0, None), (0.7, None), (1.3, 4.0)])
def test_matches_the_checkpointed_path_in_logps_and_lora_grads(
    tiny_model, monkeypatch, temperature, softcap
):
    model = _lora(tiny_model).train()
    head = model.get_base_model().get_output_embeddings()
    assert is_frozen_linear(head)
    monkeypatch.setattr(model.get_base_model().config, "final_logit_softcapping", softcap, False)
    batch = group_batch((7, 3), 6, seed=1)
    kwargs = {"temperature": temperature, "return_entropy": True}
    frozen, frozen_grads = _logps_and_grads(model, batch, **kwargs)
    monkeypatch.setattr(logprobs_module, "is_frozen_linear", lambda head: False)
    reference, reference_grads = _logps_and_grads(model, batch, **kwargs)
    assert torch.equal(frozen.logps, reference.logps)  # the same operations
    torch.testing.assert_close(
        frozen.entropy, reference.entropy, atol=1e-6, rtol=1e-6
    )  # H = log S - E[z - m]
    assert not frozen.entropy.requires_grad
    assert frozen_grads.keys() == reference_grads.keys() and frozen_grads
    for name, grad in reference_grads.items():
        assert grad.norm() > 0, name
        assert (frozen_grads[name] - grad).norm() / grad.norm() < 1e-5, name


@pytest.mark.fast_paths
def test_saves_no_vocabulary_sized_tensor_and_never_reruns_the_head(tiny_model):
    model = pre_admitted(_lora(tiny_model).train())  # its head calls are counted
    head = model.get_base_model().get_output_embeddings()
    vocab, calls, saved = head.out_features, [], []
    hook = head.register_forward_hook(lambda module, args, out: calls.append(out.shape[0]))

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    batch = group_batch((7, 3), 6)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logps = completion_logprobs(model, batch, chunk_size=4).logps
    before_backward = len(calls)
    logps.sum().backward()
    hook.remove()
    assert len(calls) == before_backward == -(-int(batch[3].sum()) // 4)  # one call per chunk
    assert not [s for s in saved if vocab in s]


def test_a_trained_head_or_entropy_with_grad_keeps_the_checkpointed_path(tiny_model):
    assert not is_frozen_linear(tiny_model.lm_head)  # full fine-tuning trains the head
    model = _lora(tiny_model).train()
    calls = []
    head = model.get_base_model().get_output_embeddings()
    hook = head.register_forward_hook(lambda module, args, out: calls.append(out.shape[0]))
    batch = group_batch((7, 3), 6)
    out = completion_logprobs(model, batch, chunk_size=64, return_entropy=True, entropy_grad=True)
    (out.logps.sum() + out.entropy.sum()).backward()
    hook.remove()
    assert len(calls) == 2  # forward, then the checkpoint's recompute in backward
