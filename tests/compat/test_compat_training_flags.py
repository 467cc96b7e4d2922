"""grpo_plugin._compat.training_flags / set_training_flags, and the rollouts' `eval_mode` built on
them: every module's mode set and restored exactly, without transformers' kernelizing `train`,
and a module with a `train` of its own (peft's DoRA) still gets its call."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model, make_tiny_tokenizer
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel

from grpo_plugin._compat import set_training_flags, training_flags
from grpo_plugin.models.policy import eval_mode


def _lora(**options):
    config = LoraConfig(
        r=4, target_modules="all-linear", lora_dropout=0.5, init_lora_weights=False, **options
    )
    return get_peft_model(make_tiny_model(make_tiny_tokenizer()), config).train()


def test_flags_are_set_without_transformers_train_and_restored_module_by_module(monkeypatch):
    model = _lora()
    frozen_part = model.get_base_model().model.layers[0].mlp
    frozen_part.eval()  # a part the user keeps in eval mode: model.train(True) would flip it
    before = training_flags(model)
    assert True in before and False in before
    monkeypatch.setattr(PreTrainedModel, "train", lambda *a, **k: pytest.fail("kernelized"))
    set_training_flags(model, False)
    assert not any(training_flags(model))
    set_training_flags(model, before)
    assert training_flags(model) == before and not frozen_part.training


def test_eval_mode_turns_dropout_off_inside_and_back_on_after():
    model, ids = _lora(), torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        with eval_mode(model):
            first, second = model(input_ids=ids).logits, model(input_ids=ids).logits
        assert torch.equal(first, second)  # LoRA dropout 0.5 is off
        assert model.training
        noisy = model(input_ids=ids).logits
    assert not torch.equal(noisy, first)  # on again


def test_a_module_with_its_own_train_still_gets_its_call(monkeypatch):
    from peft.tuners.lora.dora import DoraLinearLayer

    calls = []
    original = DoraLinearLayer.train
    monkeypatch.setattr(
        DoraLinearLayer, "train", lambda self, mode=True: calls.append(mode) or original(self, mode)
    )
    model = _lora(use_dora=True)
    calls.clear()
    with eval_mode(model):
        pass
    layers = sum(isinstance(m, DoraLinearLayer) for m in model.modules())
    assert layers == 14 and calls == [False] * layers + [True] * layers  # DoRA's cache is cleared
