"""grpo_plugin.engine.levers / plan / admission: which fast paths run, and a broken one is caught.

Each "broken" test changes what a library computes under a lever (a peft LoRA layer with a new
option, a packed attention or frozen-head gradient that is off) and shows the run goes on, on
the reference path, with the reference's results and one log line naming the lever.
"""

from __future__ import annotations

import pytest
import torch
from conftest import group_batch
from peft import LoraConfig, get_peft_model

from grpo_plugin.engine import (
    Levers,
    PolicyEngine,
    completion_logprobs,
    default_levers,
    lm_head,
    padding_free,
)
from grpo_plugin.engine.forward import decoder_body
from grpo_plugin.engine.fused_lora import fuse_lora_linears
from grpo_plugin.engine.levers import LEVERS, relative_difference, verdict
from grpo_plugin.engine.plan import levers_for

GROUP = 3
LEVER_LOG = "grpo_plugin.engine.levers"


def _lora(model):
    torch.manual_seed(0)  # init_lora_weights=False: B is random too, so every matrix gets grads
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.0)
    return get_peft_model(model, config).train()


def _logps_and_grads(model, levers, **options):
    """Log-probs and LoRA grads of a fixed weighted sum of a grouped batch's log-probs."""
    model.zero_grad()
    batch = group_batch((9, 4), width=9, real_lengths=[9, 3, 7, 9, 2, 5], group=GROUP)
    out = completion_logprobs(
        model, batch, chunk_size=5, group_size=GROUP, levers=levers, **options
    )
    (out.logps * torch.linspace(0.5, 1.5, out.logps.numel()).view_as(out.logps)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return out.logps.detach(), grads


def _assert_same(a, b, atol=0.0):
    (logps_a, grads_a), (logps_b, grads_b) = a, b
    torch.testing.assert_close(logps_a, logps_b, atol=atol, rtol=0)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=atol, rtol=0)


def _said(caplog, lever):
    return [r.getMessage() for r in caplog.records if f"fast path {lever!r}" in r.getMessage()]


def test_relative_difference_by_hand():
    reference = torch.tensor([1.0, -2.0, 4.0])
    assert relative_difference(torch.tensor([1.0, -2.0, 4.5]), reference) == pytest.approx(0.125)
    assert relative_difference(reference.clone(), reference) == 0.0
    assert relative_difference(torch.tensor([1.0, float("nan"), 4.0]), reference) == float("inf")
    assert relative_difference(torch.ones(2), reference) == float("inf")  # another shape


def test_every_lever_is_named_with_its_check_and_tolerance():
    assert set(LEVERS) == set(Levers().names)
    assert all(lever.check and lever.applies and lever.tolerance >= 0 for lever in LEVERS.values())


def test_fast_paths_off_by_config_or_environment(monkeypatch):
    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS", raising=False)
    assert default_levers() == Levers() and default_levers(False) == Levers.reference()
    assert Levers.reference().names == []
    monkeypatch.setenv("GRPO_PLUGIN_FAST_PATHS", "off")
    assert default_levers() == Levers.reference()
    assert PolicyEngine.build("cpu").levers == Levers.reference()
    monkeypatch.setenv("GRPO_PLUGIN_FAST_PATHS", "disable")
    with pytest.raises(ValueError, match=r"GRPO_PLUGIN_FAST_PATHS='disable': set it to 0"):
        default_levers()


def test_the_plan_per_device(monkeypatch):
    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS", raising=False)
    assert levers_for("cpu") == Levers()
    gpu = levers_for("cuda")
    # transformers' attention and peft's own forward; the decode levers
    assert gpu.names == ["shared_prompt", "shared_prefill", "static_decode", "compiled_decode"]
    assert levers_for("cuda", fast_paths=False).names == []


def test_a_peft_layer_with_a_new_option_is_refused_and_runs_peft(tiny_model, monkeypatch, caplog):
    """peft's LoRA forward gains something the fused forward does not know (here it scales its
    output): the check sees the difference, no layer is fused, results are peft's."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    original = LoraLinear.forward
    monkeypatch.setattr(LoraLinear, "forward", lambda self, x, *a, **k: original(self, x) * 1.01)
    model = _lora(tiny_model)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    assert fuse_lora_linears(model) == 0
    assert verdict("fused_lora", model) is False and len(_said(caplog, "fused_lora")) == 1
    assert not any("forward" in vars(m) for m in model.modules() if type(m) is LoraLinear)
    reference = _logps_and_grads(model, Levers.reference())
    _assert_same(_logps_and_grads(model, Levers(frozen_head=False)), reference)


def test_the_fused_lora_forward_is_admitted_on_peft_as_it_is(tiny_model):
    model = _lora(tiny_model)
    assert fuse_lora_linears(model) == 14  # 2 layers x 7 projections
    assert verdict("fused_lora", model) is True


def test_a_broken_packed_attention_is_refused(tiny_model, monkeypatch, caplog):
    original = padding_free.PackedRows.attention
    monkeypatch.setattr(
        padding_free.PackedRows, "attention", lambda self, *a: original(self, *a) * 1.01
    )
    model = _lora(tiny_model)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    fast = _logps_and_grads(model, Levers(), share_prompt_prefix=True, padding_free=True)
    assert verdict("padding_free", decoder_body(model)) is False
    assert verdict("shared_prompt", decoder_body(model)) is True
    assert len(_said(caplog, "padding_free")) == 1
    unpacked = _logps_and_grads(model, Levers(padding_free=False), share_prompt_prefix=True)
    _assert_same(fast, unpacked)  # the shared prompt, padded: what runs once packing is refused


def test_a_broken_frozen_head_gradient_is_refused(tiny_model, monkeypatch, caplog):
    backward = lm_head._FrozenHeadLogps.backward

    def off(ctx, grad_logps, grad_entropy):
        grad_hidden, *rest = backward(ctx, grad_logps, grad_entropy)
        return (grad_hidden * 1.1, *rest)

    monkeypatch.setattr(lm_head._FrozenHeadLogps, "backward", staticmethod(off))
    model = _lora(tiny_model)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    fast = _logps_and_grads(model, Levers())
    head = model.get_base_model().get_output_embeddings()
    assert verdict("frozen_head", head) is False and len(_said(caplog, "frozen_head")) == 1
    _assert_same(fast, _logps_and_grads(model, Levers.reference()))


def test_the_levers_admitted_match_the_reference_within_their_tolerance(tiny_model):
    """Every training-forward lever on, checked and admitted: log-probs and grads agree with the
    reference path (fused LoRA, shared prompt, packed completions, frozen head)."""
    model = _lora(tiny_model)
    assert fuse_lora_linears(model) == 14
    options = dict(share_prompt_prefix=True, padding_free=True)
    fast = _logps_and_grads(model, Levers(), **options)
    body, head = decoder_body(model), model.get_base_model().get_output_embeddings()
    assert verdict("shared_prompt", body) and verdict("padding_free", body)
    assert verdict("frozen_head", head)
    reference = _logps_and_grads(model, Levers.reference(), **options)
    _assert_same(fast, reference, atol=5e-5)


@pytest.mark.fast_paths
def test_the_trainer_in_reference_mode_fuses_nothing_and_learns_the_same(tiny_tokenizer, tmp_path):
    from conftest import make_trainer

    from grpo_plugin.engine.levers import LEVERS as _  # noqa: F401  (the table is importable)

    peft = LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0)
    runs = {}
    for fast_paths in (True, False):
        # the forward's levers alone: both sample from the policy (the default's bf16 copy is
        # taken with fast paths only, training/sampling/rollouts.default_scope)
        trainer = make_trainer(
            tiny_tokenizer, tmp_path / str(fast_paths), peft=peft, max_steps=2,
            fast_paths=fast_paths, rollout_precision="policy",
        )  # fmt: skip
        fused = sum("forward" in vars(m) for m in trainer.model.modules())
        assert (fused > 0) == fast_paths
        assert trainer.engine.levers == (Levers() if fast_paths else Levers.reference())
        trainer.train()
        runs[fast_paths] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(runs[True]) == 2
    assert runs[True] == pytest.approx(runs[False], abs=1e-5)


@pytest.mark.fast_paths
def test_a_run_with_a_broken_lever_trains_as_the_reference_path(
    tiny_tokenizer, tmp_path, monkeypatch, caplog
):
    """A whole training run on a peft whose LoRA forward gained an option: the fused forward is
    refused with one warning, and the run learns what `fast_paths=False` learns."""
    from conftest import make_trainer
    from peft.tuners.lora.layer import Linear as LoraLinear

    original = LoraLinear.forward
    monkeypatch.setattr(LoraLinear, "forward", lambda self, x, *a, **k: original(self, x) * 1.01)
    peft = LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0)
    caplog.set_level("WARNING", logger=LEVER_LOG)
    runs = {}
    for fast_paths in (True, False):
        out = tmp_path / str(fast_paths)
        trainer = make_trainer(
            tiny_tokenizer, out, peft=peft, max_steps=2, fast_paths=fast_paths,
            rollout_precision="policy",  # the forward's levers alone, as above
        )  # fmt: skip
        assert not any("forward" in vars(m) for m in trainer.model.modules())  # nothing fused
        trainer.train()
        runs[fast_paths] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(_said(caplog, "fused_lora")) == 1
    assert len(runs[True]) == 2 and runs[True] == pytest.approx(runs[False], abs=1e-5)
