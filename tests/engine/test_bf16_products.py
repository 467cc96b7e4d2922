"""grpo_plugin.engine.bf16_products (lever `bf16_training`): the frozen base products in bf16,
exact where bf16 holds the numbers, only inside the context and only on admitted layers; the
engine's choice of train_precision."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import logits_and_grads, random_lora_model

from grpo_plugin import engine as engine_module
from grpo_plugin.engine import PolicyEngine, TrainAsk
from grpo_plugin.engine import bf16_products as products
from grpo_plugin.engine.admission import _checking
from grpo_plugin.engine.fused_lora import fuse_lora_linears, fused_layers
from grpo_plugin.engine.levers import LEVERS, Lever, verdict

LAYERS = 14  # the tiny Llama: 2 decoder layers x (q, k, v, o, gate, up, down)

pytestmark = pytest.mark.fast_paths  # asserts the fast path ran (or declined)


def test_the_product_and_its_gradient_on_numbers_bf16_holds_exactly():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)  # (tokens 2, in 2)
    weight = torch.tensor([[1.0, 0.0], [0.5, -1.0]]).bfloat16()  # (out 2, in 2)
    y = products._FrozenBf16Product.apply(x, weight)
    # x W^T: [1*1 + 2*0, 1*0.5 - 2*1] = [1, -1.5]; [3, 1.5 - 4] = [3, -2.5]
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.tensor([[1.0, -1.5], [3.0, -2.5]]))
    y.backward(torch.tensor([[1.0, 0.0], [2.0, 1.0]]))
    # dx = dy W: [1*1 + 0*0.5, 0 + 0] = [1, 0]; [2*1 + 1*0.5, 0 - 1] = [2.5, -1]
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0], [2.5, -1.0]]))


def test_the_input_is_rounded_to_bf16():
    x = torch.tensor([[1.0 + 2**-10]])  # bf16 keeps 8 bits of mantissa: this rounds to 1
    weight = torch.tensor([[1.0]])
    assert float(torch.nn.functional.linear(x, weight)) == 1.0 + 2**-10
    assert float(products._FrozenBf16Product.apply(x, weight.bfloat16())) == 1.0


def _admitted_model():
    model = random_lora_model()
    assert fuse_lora_linears(model) == LAYERS
    assert products.admit_layers(model, fused_layers(model)) == LAYERS
    return model


def test_only_inside_the_context_and_within_bf16_of_float32():
    model = _admitted_model()
    reference = random_lora_model()
    ids = torch.randint(5, 40, (2, 7))
    want_logits, want_grads = logits_and_grads(reference, ids)
    outside_logits, _ = logits_and_grads(model, ids)
    torch.testing.assert_close(outside_logits, want_logits, rtol=1e-5, atol=1e-6)  # float32
    with products.bf16_products(True):
        assert products.products_on()
        got_logits, got_grads = logits_and_grads(model, ids)
    assert not products.products_on()
    difference = (got_logits - want_logits).abs().max() / want_logits.abs().max()
    assert 0 < difference < 2e-2  # bf16 ran (not bit for bit), within bf16's rounding
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == 2 * LAYERS
    for name, grad in want_grads.items():
        assert grad.norm() > 0, name
        assert (got_grads[name] - grad).norm() <= 3e-2 * grad.norm(), name
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights


def test_the_other_levers_checks_compare_float32_forms():
    module = torch.nn.Linear(2, 2)
    with products.bf16_products(True), _checking(module):
        assert not products.products_on()


def test_a_written_weight_is_cast_again():
    model = _admitted_model()
    layer = fused_layers(model)[0]
    x = torch.randn(3, layer.base_layer.in_features)
    with products.bf16_products(True):
        before = products.base_product(layer, layer.base_layer, x)
        with torch.no_grad():
            layer.base_layer.weight.mul_(2.0)  # what a resume's load_state_dict does (copy_)
        after = products.base_product(layer, layer.base_layer, x)
    torch.testing.assert_close(after, 2 * before, rtol=0, atol=0)  # x2 is exact in bf16


def test_a_layer_not_admitted_or_trained_runs_float32():
    model = random_lora_model()
    fuse_lora_linears(model)
    layer = fused_layers(model)[0]
    x = torch.randn(3, layer.base_layer.in_features)
    with products.bf16_products(True):
        assert products.base_product(layer, layer.base_layer, x) is None  # not admitted
        products.admit_layers(model, [layer])
        assert products.base_product(layer, layer.base_layer, x) is not None
        layer.base_layer.weight.requires_grad_(True)  # trained (full fine-tuning): its own
        assert products.base_product(layer, layer.base_layer, x) is None


def test_a_failed_check_turns_the_lever_off_with_one_line(monkeypatch, caplog):
    monkeypatch.setitem(LEVERS, "bf16_training", Lever("", "", "", 0.0))  # nothing passes
    model = random_lora_model()
    fuse_lora_linears(model)
    with caplog.at_level(logging.WARNING, "grpo_plugin.engine.levers"):
        assert products.admit_layers(model, fused_layers(model)) == 0
    assert verdict("bf16_training", model) is False
    assert [r for r in caplog.records if "'bf16_training'" in r.getMessage()]


@pytest.fixture
def bf16_units(monkeypatch):
    """A CPU with AVX512-BF16 or AMX, whatever this one has."""
    monkeypatch.setattr(engine_module, "cpu_has_bf16_units", lambda: True)


@pytest.mark.parametrize(
    "ask",
    [
        TrainAsk(None, False, False),  # the default: float32 on every device
        TrainAsk("fp32", False, False),
        TrainAsk("bf16", True, False),  # bf16=True: autocast decides
        TrainAsk("bf16", False, True),  # gradient checkpointing
    ],
)
def test_the_engine_trains_float32_by_default_and_where_it_cannot(bf16_units, ask):
    model = random_lora_model()
    PolicyEngine.build("cpu").prepare_policy(model)
    assert PolicyEngine.build("cpu").train_precision(ask, model) == "fp32"


def test_the_engine_takes_bf16_where_asked_and_it_can(bf16_units, caplog):
    model = random_lora_model()
    engine = PolicyEngine.build("cpu")
    engine.prepare_policy(model)
    asked = TrainAsk("bf16", False, False)
    with caplog.at_level(logging.WARNING, "grpo_plugin.engine"):
        assert engine.train_precision(asked, model) == "bf16"
        assert PolicyEngine.build("cpu", fast_paths=False).train_precision(asked, model) == "fp32"
        assert PolicyEngine.build("cuda").train_precision(asked, model) == "fp32"
    said = [r.getMessage() for r in caplog.records if "train_precision='bf16'" in r.getMessage()]
    assert len(said) == 2 and all("not on this device" in m for m in said)


def test_no_bf16_units_or_no_fused_layer_trains_float32(monkeypatch, caplog):
    model = random_lora_model(lora_dropout=0.1)  # dropout: peft's own forward, nothing fused
    engine = PolicyEngine.build("cpu")
    assert engine.prepare_policy(model) == LAYERS  # installed; the dropout declines each call
    plain = random_lora_model()
    engine.prepare_policy(plain)
    asked = TrainAsk("bf16", False, False)
    with caplog.at_level(logging.WARNING, "grpo_plugin.engine"):
        monkeypatch.setattr(engine_module, "cpu_has_bf16_units", lambda: False)
        assert engine.train_precision(asked, plain) == "fp32"
        monkeypatch.setattr(engine_module, "cpu_has_bf16_units", lambda: True)
        assert engine.train_precision(asked, model) == "fp32"
        assert engine.train_precision(asked, random_lora_model()) == "fp32"
    said = [r.getMessage() for r in caplog.records if "train_precision='bf16'" in r.getMessage()]
    assert len(said) == 3 and "not on this device" in said[0]  # no bf16 units
    assert all("no LoRA layer" in m for m in said[1:])  # the dropout's layers, never fused


def test_the_reference_with_adapters_off_shares_the_policys_bf16_products():
    model = _admitted_model()
    ids = torch.randint(5, 40, (2, 7))
    with products.bf16_products(True):
        with model.disable_adapter():
            reference = model(input_ids=ids).logits
        for layer in fused_layers(
            model
        ):  # B = 0: the adapters add exactly nothing, as adapters off
            for up in layer.lora_B.values():
                torch.nn.init.zeros_(up.weight)
        policy = model(input_ids=ids).logits
    with model.disable_adapter():
        float32 = model(input_ids=ids).logits
    assert torch.equal(reference, policy)  # same products: a KL that starts at exactly 0
    assert not torch.equal(reference, float32)
