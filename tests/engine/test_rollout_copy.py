"""The cheaper rollout copy (`engine/rollout_copy.py`) and the sampling correction in
training (`rollout_precision`, `sampling_correction`)."""

import pytest
import torch
from peft import get_peft_model

from grpo_plugin.engine import rollout_copy as copy_module
from grpo_plugin.engine.kernels import PackedBf16Linear, bf16_packing_works
from grpo_plugin.engine.rollout_copy import (
    RolloutCopy,
    check_copyable,
    resolve_precision,
)
from tests.conftest import make_tiny_model, make_trainer, tiny_lora


def _lora_policy(tokenizer):
    model = get_peft_model(make_tiny_model(tokenizer), tiny_lora())
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: give the adapter a visible delta
            torch.nn.init.normal_(param, std=0.5)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _flip_adapters(policy) -> None:
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.mul_(-1.0)  # "an optimizer step": the adapter's delta flips sign


def test_a_bf16_copy_computes_the_merged_policy_and_follows_its_updates(tiny_tokenizer):
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9]])
    rollout_copy = RolloutCopy("bf16")
    model = rollout_copy.refresh(policy, version=0)
    assert not any(p.requires_grad for p in model.parameters())
    gap = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert 0 < gap < 0.05  # close to the policy, yet not the policy (a lower precision)
    _flip_adapters(policy)
    assert rollout_copy.refresh(policy, version=0) is model  # same version: no refresh
    stale = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert stale > 5 * gap  # the old weights: far off
    rollout_copy.refresh(policy, version=1)
    fresh = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert fresh < 0.05


def test_a_released_bf16_copy_holds_no_trained_weights_and_comes_back_the_same(tiny_tokenizer):
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9]])
    rollout_copy = RolloutCopy("bf16", pack=False)  # plain layers (the packed ones: below)
    model = rollout_copy.refresh(policy, version=0)
    before = _logits(model, ids)
    adapted = [m.weight for n, m in model.named_modules() if n.endswith(("q_proj", "down_proj"))]
    held = sum(w.untyped_storage().nbytes() for w in adapted)
    assert held > 0
    rollout_copy.release()
    rollout_copy.release()  # twice: still released, still refreshable
    assert sum(w.untyped_storage().nbytes() for w in adapted) == 0
    embedding = model.get_input_embeddings().weight  # frozen: cast once, kept
    assert embedding.untyped_storage().nbytes() == embedding.numel() * 2
    assert rollout_copy.refresh(policy, version=0) is model  # same version, yet filled again
    assert sum(w.untyped_storage().nbytes() for w in adapted) == held
    assert torch.equal(_logits(model, ids), before)


needs_packing = pytest.mark.skipif(
    not bf16_packing_works(), reason="this torch build cannot pack bf16 weights for oneDNN"
)


@needs_packing
def test_a_packed_bf16_copy_decodes_as_the_plain_one_and_drops_its_weights_between_rollouts(
    tiny_tokenizer,
):
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9]])
    rollout_copy = RolloutCopy("bf16")
    model = rollout_copy.refresh(policy, version=0)
    packed = [m for m in model.modules() if isinstance(m, PackedBf16Linear)]
    assert len(packed) == 2 * 7 + 1  # every projection of the 2 layers, and the (untied) LM head
    assert model.get_output_embeddings() in packed
    before = _logits(model, ids)
    plain = _logits(RolloutCopy("bf16", pack=False).refresh(policy, version=0), ids)
    torch.testing.assert_close(before, plain, atol=0.02, rtol=0)  # bf16 both: summation order
    rollout_copy.release()
    head = model.get_output_embeddings()
    assert head.holds_weight  # frozen: packed once, kept
    assert not any(m.holds_weight for m in packed if m is not head)
    with pytest.raises(RuntimeError, match="set_weight it first"):
        _logits(model, ids)
    assert rollout_copy.refresh(policy, version=0) is model  # same version, yet packed again
    assert all(m.holds_weight for m in packed)
    assert torch.equal(_logits(model, ids), before)
    _flip_adapters(policy)  # the next version: the packed weights follow the adapters
    rollout_copy.refresh(policy, version=1)
    flipped = _logits(RolloutCopy("bf16", pack=False).refresh(policy, version=0), ids)
    torch.testing.assert_close(_logits(model, ids), flipped, atol=0.02, rtol=0)


@needs_packing
def test_a_packed_copy_of_a_tied_model_reads_its_embeddings_from_the_policy(tiny_tokenizer):
    """SmolLM2's head is its embedding table: the copy packs it as the head and looks its input
    embeddings up in the policy's float32 table, so it holds the table once (packed), not twice."""
    base = make_tiny_model(tiny_tokenizer)
    base.lm_head.weight = base.model.embed_tokens.weight  # tied, as SmolLM2's
    policy = get_peft_model(base, tiny_lora())
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    model = RolloutCopy("bf16").refresh(policy, version=0)
    assert isinstance(model.get_output_embeddings(), PackedBf16Linear)
    lookup = model.get_input_embeddings()
    assert type(lookup) is copy_module._PolicyRowsEmbedding
    assert not any(p.numel() == base.model.embed_tokens.weight.numel() for p in model.parameters())
    expected = base.model.embed_tokens.weight[ids].to(torch.bfloat16)  # a cast table's rows
    assert torch.equal(lookup(ids), expected)
    plain = RolloutCopy("bf16", pack=False).refresh(policy, version=0)
    assert plain.get_input_embeddings().weight is plain.get_output_embeddings().weight
    torch.testing.assert_close(_logits(model, ids), _logits(plain, ids), atol=0.02, rtol=0)
    scaled = make_tiny_model(tiny_tokenizer)  # an embedding that is not a plain nn.Embedding:
    scaled.lm_head.weight = scaled.model.embed_tokens.weight
    scaled.model.embed_tokens.__class__ = type("Scaled", (torch.nn.Embedding,), {})
    kept = RolloutCopy("bf16").refresh(get_peft_model(scaled, tiny_lora()), version=0)
    assert type(kept.get_output_embeddings()) is torch.nn.Linear  # the tied head stays unpacked
    assert kept.get_input_embeddings().weight is kept.get_output_embeddings().weight


@needs_packing
def test_a_packed_bf16_layer_keeps_its_bias_and_computes_the_linear():
    torch.manual_seed(0)
    linear, x = torch.nn.Linear(40, 24).to(torch.bfloat16), torch.randn(2, 3, 40).bfloat16()
    layer = PackedBf16Linear(linear)
    expected = linear(x).float()
    torch.testing.assert_close(layer(x).float(), expected, atol=0.05, rtol=0.02)
    layer.set_weight(linear.weight.float() * 2)  # any float dtype, cast to bf16 first
    doubled = (x.float() @ linear.weight.float().T * 2 + linear.bias.float()).float()
    torch.testing.assert_close(layer(x).float(), doubled, atol=0.1, rtol=0.02)


def test_an_fp16_copy_is_not_released(tiny_tokenizer):
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9]])
    rollout_copy = RolloutCopy("fp16")
    model = rollout_copy.refresh(policy, version=0)
    before = _logits(model, ids)
    rollout_copy.release()  # packed fp16 weights cannot be freed apart: nothing happens
    assert torch.equal(_logits(model, ids), before)


def test_an_fp16_copy_of_a_lora_policy_reads_the_adapters_live(tiny_tokenizer):
    """fp16 + LoRA: the base weights are packed once and the policy's own adapters run beside
    them, so an optimizer step reaches the copy with nothing refreshed (no repacking)."""
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9]])
    rollout_copy = RolloutCopy("fp16")
    model = rollout_copy.refresh(policy, version=0)
    assert not any(p.requires_grad for p in model.parameters())  # the copy trains nothing
    assert all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)
    assert not any("lora" in n for n, _ in model.named_parameters())  # no adapter copies
    gap = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert 0 < gap < 0.01
    _flip_adapters(policy)
    assert rollout_copy.refresh(policy, version=1) is model
    moved = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert moved < 0.01  # followed without a refresh


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_dora_policy_is_refused_in_one_line(tiny_tokenizer, precision):
    """A refresh adds B A to W; DoRA rescales by a magnitude too, so a copy would drift from
    the policy after the first step (measured before this check: 0.48 max logit gap)."""
    from peft import LoraConfig

    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", use_dora=True)
    policy = get_peft_model(make_tiny_model(tiny_tokenizer), config)
    with pytest.raises(ValueError) as err:
        RolloutCopy(precision).refresh(policy, version=0)
    assert str(err.value).startswith(f"rollout_precision={precision!r} with a DoRA")
    assert "\n" not in str(err.value)


def test_an_fp16_copy_moves_the_log_probs_less_than_a_bf16_copy(tiny_tokenizer):
    # fp16 keeps 10 mantissa bits to bf16's 7, and computes in float32: its per-token log-prob
    # gap should be several times smaller. (An int8 copy through torch's dynamic quantization,
    # which also quantizes the activations, failed this: its gap was larger than bf16's.)
    policy, ids = _lora_policy(tiny_tokenizer), torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])

    def gap(precision):
        model = RolloutCopy(precision).refresh(policy, version=0)
        logps = [_logits(m, ids).log_softmax(-1) for m in (model, policy)]
        return (logps[0] - logps[1]).abs().mean().item()

    assert 0 < gap("fp16") < gap("bf16") / 4


@pytest.mark.parametrize("precision,pack", [("bf16", False), ("bf16", True), ("fp16", False)])
def test_a_copy_of_a_fully_trained_tied_model_follows_the_lm_head(tiny_tokenizer, precision, pack):
    policy = make_tiny_model(tiny_tokenizer)
    policy.lm_head.weight = policy.model.embed_tokens.weight  # tied, as SmolLM2's
    ids = torch.tensor([[5, 6, 7]])
    rollout_copy = RolloutCopy(precision, pack=pack)
    model = rollout_copy.refresh(policy, version=0)
    rollout_copy.release()  # bf16: every weight trains, so all are freed; fp16: nothing is
    freed = [p.untyped_storage().nbytes() == 0 for p in model.parameters()]
    freed += [not m.holds_weight for m in model.modules() if isinstance(m, PackedBf16Linear)]
    assert all(freed) if precision == "bf16" else not any(freed)
    with torch.no_grad():
        policy.model.embed_tokens.weight.mul_(3.0)
    rollout_copy.refresh(policy, version=1)
    gap = (_logits(model, ids) - _logits(policy, ids)).abs().max().item()
    assert gap < 0.05 * _logits(policy, ids).abs().max().item()


def test_a_bf16_policy_is_refused_in_one_line(tiny_tokenizer):
    with pytest.raises(ValueError, match="already in bfloat16: the copy would be the policy"):
        check_copyable(make_tiny_model(tiny_tokenizer).to(torch.bfloat16), "bf16")


@pytest.mark.parametrize(
    "bf16_units, dtype, expected",
    [(True, torch.float32, "bf16"), (False, torch.float32, "fp16"), (None, torch.float32, "fp16"),
     (True, torch.bfloat16, "policy"), (False, torch.bfloat16, "fp16")],
)  # fmt: skip
def test_auto_picks_the_copy_this_cpu_runs_fast(
    tiny_tokenizer, monkeypatch, bf16_units, dtype, expected
):
    monkeypatch.setattr(copy_module, "cpu_has_bf16_units", lambda: bf16_units)
    policy = make_tiny_model(tiny_tokenizer).to(dtype)
    assert resolve_precision("auto", policy) == expected
    assert resolve_precision("fp16", policy) == "fp16"  # a named precision is kept as named


@pytest.mark.parametrize(
    "bf16_units, dtype, expected",
    [(True, torch.float32, "bf16"), (False, torch.float32, "policy"),
     (None, torch.float32, "policy"), (True, torch.bfloat16, "policy"),
     (True, torch.float16, "policy")],
)  # fmt: skip
def test_the_default_copies_only_a_float32_policy_on_a_cpu_with_bf16_units(
    tiny_tokenizer, monkeypatch, bf16_units, dtype, expected
):
    # None: a bf16 copy only where its learning was measured (an AVX512-BF16 CPU); never fp16
    monkeypatch.setattr(copy_module, "cpu_has_bf16_units", lambda: bf16_units)
    policy = make_tiny_model(tiny_tokenizer).to(dtype)
    assert resolve_precision(None, policy) == expected


def test_the_default_samples_a_dora_policy_from_itself_where_a_named_copy_is_refused(
    tiny_tokenizer, monkeypatch
):
    from peft import LoraConfig

    monkeypatch.setattr(copy_module, "cpu_has_bf16_units", lambda: True)
    dora = get_peft_model(
        make_tiny_model(tiny_tokenizer), LoraConfig(r=4, target_modules="all-linear", use_dora=True)
    )
    assert resolve_precision(None, dora) == "policy"  # no error: the default just does not copy
    assert resolve_precision(None, _lora_policy(tiny_tokenizer)) == "bf16"  # a plain LoRA does


def test_a_bf16_copy_on_a_cpu_without_bf16_units_warns_and_names_fp16(
    tiny_tokenizer, monkeypatch, caplog
):
    policy = make_tiny_model(tiny_tokenizer)
    for units, warned in [(True, False), (False, True)]:
        monkeypatch.setattr(copy_module, "cpu_has_bf16_units", lambda units=units: units)
        caplog.clear()
        check_copyable(policy, "bf16")
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert bool(said) is warned
    assert "use rollout_precision='fp16' (or 'auto')" in said[0]


def test_an_auto_run_on_a_cpu_without_bf16_units_samples_from_an_fp16_copy(
    tiny_tokenizer, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(copy_module, "cpu_has_bf16_units", lambda: False)
    caplog.set_level("INFO", logger=copy_module.__name__)
    trainer = make_trainer(
        tiny_tokenizer, tmp_path, peft=tiny_lora(), max_steps=2, rollout_precision="auto"
    )
    # settled on the first rollout, once the Trainer has put the policy on its device
    assert not [r for r in caplog.records if r.name == copy_module.__name__]
    trainer.train()
    said = [r.getMessage() for r in caplog.records if r.name == copy_module.__name__]
    assert said.count("rollout_precision='auto' on cpu: 'fp16'") == 1
    assert "rollout_precision='auto' on cpu: 'fp16'" in said
    assert any(m.startswith("Rollout copy in fp16 built") for m in said)
    assert any("sampling/importance_sampling_ratio/mean" in e for e in trainer.state.log_history)


def _trained(tokenizer, tmp_path, **overrides):
    trainer = make_trainer(tokenizer, tmp_path, peft=tiny_lora(), max_steps=2, **overrides)
    trainer.train()
    return trainer


def _lora_state(trainer):
    return {k: v.clone() for k, v in trainer.model.named_parameters() if "lora_" in k}


def test_training_from_a_bf16_copy_logs_the_mismatch(tiny_tokenizer, tmp_path):
    trainer = _trained(tiny_tokenizer, tmp_path, rollout_precision="bf16")
    rows = [r for r in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in r]
    assert len(rows) == 2
    for row in rows:
        assert 0 < row["sampling/sampling_logp_difference/mean"] < 0.05
        assert 0.9 < row["sampling/importance_sampling_ratio/mean"] < 1.1
        assert row["sampling/importance_sampling_bounded"] == 0.0
    copy_model = trainer._sampler.copy.model
    packed = [m for m in copy_model.modules() if isinstance(m, PackedBf16Linear)]
    merged = [m for m in packed if m is not copy_model.get_output_embeddings()]
    if packed:  # the packed_bf16 lever (a CPU whose torch packs for oneDNN)
        assert merged and not any(m.holds_weight for m in merged)  # freed for training
    weights = [p for p in copy_model.parameters() if p.dim() == 2]
    released = [p for p in weights if p.untyped_storage().nbytes() == 0]
    if not packed:  # plain layers: freed the same way
        assert 0 < len(released) < len(weights)
    assert len(released) < len(weights)  # not the rest: the embedding (and the frozen head) stay
    plain = _trained(tiny_tokenizer, tmp_path / "plain", rollout_precision="policy")
    assert not any(k.startswith("sampling/") for r in plain.state.log_history for k in r)


def test_the_correction_weighs_the_loss(tiny_tokenizer, tmp_path):
    # clip_max far below every ratio: token_mask zeroes every token, so nothing is learned.
    before = _lora_state(make_trainer(tiny_tokenizer, tmp_path / "x", peft=tiny_lora()))
    masked = _trained(tiny_tokenizer, tmp_path / "m", rollout_precision="bf16",
                      sampling_correction_mode="token_mask", sampling_correction_clip_max=1e-6)  # fmt: skip
    assert all(torch.equal(before[k], v) for k, v in _lora_state(masked).items())
    rows = [r for r in masked.state.log_history if "sampling/importance_sampling_bounded" in r]
    assert [r["sampling/importance_sampling_bounded"] for r in rows] == [1.0, 1.0]
    # the same with the correction off: only logged, and the adapter moves
    free = _trained(tiny_tokenizer, tmp_path / "f", rollout_precision="bf16",
                    sampling_correction=False, sampling_correction_clip_max=1e-6)  # fmt: skip
    assert any(not torch.equal(before[k], v) for k, v in _lora_state(free).items())


def test_an_fp16_layer_keeps_its_bias_when_its_weight_is_packed_again():
    from grpo_plugin.engine.kernels import fp16_weight_linear, set_fp16_weight

    torch.manual_seed(0)
    linear, x = torch.nn.Linear(8, 4), torch.randn(3, 8)
    layer = fp16_weight_linear(linear)
    torch.testing.assert_close(layer(x), linear(x), atol=1e-3, rtol=1e-3)
    with torch.no_grad():
        linear.weight.mul_(2.0)
    set_fp16_weight(layer, weight=linear.weight)  # a refresh moves the weight only
    torch.testing.assert_close(layer(x), linear(x), atol=1e-3, rtol=1e-3)
    set_fp16_weight(layer, bias=linear.bias * 0)  # and a bias-only update keeps the weight
    torch.testing.assert_close(layer(x), x @ linear.weight.T, atol=1e-3, rtol=1e-3)
