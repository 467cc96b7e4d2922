"""grpo_plugin.engine.fused_lora: peft's LoRA linear forward in one `addmm` per adapter gives peft's
outputs and gradients, and every case it does not cover runs peft's own forward."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from conftest import logits_and_grads, random_lora_model
from peft import LoraConfig
from peft.tuners.lora.layer import Linear as LoraLinear

from grpo_plugin.engine import PolicyEngine
from grpo_plugin.engine.fused_lora import fuse_lora_linears
from grpo_plugin.models.policy import load_trainer_policy

LAYERS = 14  # the tiny Llama: 2 decoder layers x (q, k, v, o, gate, up, down)

pytestmark = pytest.mark.fast_paths  # asserts the fast path ran (or declined)


@pytest.fixture
def peft_calls(monkeypatch):
    """Counts the calls that reach peft's own `Linear.forward`."""
    calls = []
    original = LoraLinear.forward

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LoraLinear, "forward", counted)
    return calls


def test_one_product_forward_matches_peft(peft_calls):
    peft_model = random_lora_model(lora_alpha=8)
    fused = copy.deepcopy(peft_model)
    assert fuse_lora_linears(fused) == LAYERS
    assert fuse_lora_linears(fused) == 0  # installed once
    ids = torch.randint(5, 40, (2, 7))
    want_logits, want_grads = logits_and_grads(peft_model, ids)
    peft_calls.clear()
    got_logits, got_grads = logits_and_grads(fused, ids)
    assert peft_calls == []  # every layer took the one-product path
    assert (got_logits - want_logits).abs().max() <= 1e-6 * want_logits.abs().max()
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == 2 * LAYERS
    for name, grad in want_grads.items():
        assert grad.norm() > 0, name
        assert (got_grads[name] - grad).norm() <= 1e-5 * grad.norm(), name


def test_a_copy_keeps_the_forward_bound_to_its_own_layers():
    model = random_lora_model()
    fuse_lora_linears(model)
    twin = copy.deepcopy(model)
    layers = [m for m in twin.modules() if type(m) is LoraLinear]
    assert len(layers) == LAYERS
    assert all(m.forward.__self__ is m for m in layers)


def _disabled(model, ids):
    with model.disable_adapter():
        model(input_ids=ids)


def _merged(model, ids):
    model.merge_adapter()
    model(input_ids=ids)


def _autocast(model, ids):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)


def _hooked(model, ids):
    layer = next(m for m in model.modules() if type(m) is LoraLinear)
    layer.lora_A["default"].register_forward_hook(lambda *a: None)
    model(input_ids=ids)
    return 1  # only the hooked layer goes to peft


def _plain_call(model, ids):
    model(input_ids=ids)


def _mixed_batch(model, ids):
    model.eval()  # peft takes adapter_names only in eval mode
    with torch.no_grad():
        model(input_ids=ids, adapter_names=["default", "__base__"])


@pytest.mark.parametrize(
    "options, case",
    [
        ({}, _disabled),
        ({}, _merged),
        ({}, _autocast),
        ({}, _hooked),
        ({}, _mixed_batch),
        ({"lora_dropout": 0.1}, None),
        ({"use_dora": True}, None),
    ],
)
def test_cases_it_does_not_cover_run_peft_forward(peft_calls, options, case):
    model = random_lora_model(**options)
    fuse_lora_linears(model)
    peft_calls.clear()  # the admission check's calls of peft's forward
    ids = torch.randint(5, 40, (2, 7))
    expected = (case or _plain_call)(model, ids) or LAYERS
    assert len(peft_calls) == expected


def test_the_trainer_policy_gets_it_unless_fast_paths_are_off(tiny_model_dir):
    args = types.SimpleNamespace(
        seed=0,
        trust_remote_code=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        cast_lm_head_to_fp32=False,
    )
    config = LoraConfig(r=4, target_modules="all-linear")
    for fast_paths, fused in ((False, 0), (True, LAYERS)):
        model, _ = load_trainer_policy(str(tiny_model_dir), None, config, args, {}, "")
        assert PolicyEngine.build("cpu", fast_paths).prepare_policy(model) == fused
        layers = [m for m in model.modules() if type(m) is LoraLinear]
        assert sum("forward" in vars(m) for m in layers) == fused
