"""Where training rollouts come from (`training/sampling/rollouts.py`): the decode engine the
config asks for reaches the sampler, a static cache trains exactly as the dynamic one, and the
default `rollout_precision` samples from a bf16 copy only where that was measured."""

from types import SimpleNamespace

import pytest

from grpo_plugin.rollout import generation
from tests.conftest import assert_same_training, make_trainer, tiny_lora


def _trained(tokenizer, tmp_path, **overrides):
    trainer = make_trainer(tokenizer, tmp_path, peft=tiny_lora(), max_steps=2, **overrides)
    trainer.train()
    return trainer


def test_a_static_cache_trains_exactly_as_the_dynamic_one(tiny_tokenizer, tmp_path, monkeypatch):
    # from the policy: a bf16 copy's attention over the longer static cache rounds differently
    exact = {"rollout_precision": "policy"}
    dynamic = _trained(tiny_tokenizer, tmp_path / "d", **exact)
    calls = []
    original = generation.decode_static
    monkeypatch.setattr(
        generation, "decode_static", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    static = _trained(tiny_tokenizer, tmp_path / "s", cache_implementation="static", **exact)
    assert len(calls) == 2  # one static rollout per step
    assert_same_training(
        dynamic, static, ("loss", "reward", "completions/mean_length", "num_tokens")
    )


def _with_rollout_func(tokenizer, tmp_path, **overrides):
    """A trainer whose rollouts come from a `rollout_func` (never called: no step is taken)."""
    from grpo_plugin import GRPOTrainer
    from tests.conftest import SEVEN_DATA, frac_sevens, make_tiny_model, tiny_config

    def rollout_func(prompts, trainer):
        raise AssertionError

    return GRPOTrainer(
        make_tiny_model(tokenizer),
        frac_sevens,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=SEVEN_DATA,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )


def test_a_static_decode_with_a_rollout_func_is_refused_in_one_line(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError) as err:  # refused before any step
        _with_rollout_func(tiny_tokenizer, tmp_path, compile_decode=True)
    assert str(err.value) == (
        "compile_decode=True is for single-turn rollouts, not a rollout_func (it generates by "
        "itself); leave it off."
    )


@pytest.fixture
def fast_paths_on(monkeypatch):
    """The default's scope with fast paths on, also under `make test-reference`'s environment."""
    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS", raising=False)


def default_scope(args, single_turn):
    """What the engine picks for the rollout copy, from what the config asks."""
    from grpo_plugin.engine import PolicyEngine
    from grpo_plugin.training.sampling.rollouts import copy_ask

    engine = PolicyEngine.build("cpu", args.fast_paths)
    return engine.rollout_precision(copy_ask(args, single_turn))


def _scope_args(**changes):
    base = dict(
        rollout_precision=None, world_size=1, sampling_correction=True, loss_type="dapo",
        fast_paths=True,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **changes})


@pytest.mark.parametrize(
    "changes, single_turn, expected",
    [({}, True, None), ({}, False, "policy"), ({"world_size": 2}, True, None),
     ({"sampling_correction": False}, True, "policy"), ({"loss_type": "vespo"}, True, "policy"),
     ({"fast_paths": False}, True, "policy"),
     ({"rollout_precision": "bf16"}, False, "bf16"), ({"rollout_precision": "auto"}, True, "auto")],
)  # fmt: skip
def test_the_default_precision_is_narrowed_to_where_the_copy_was_measured(
    changes, single_turn, expected, fast_paths_on
):
    # None: the device decides on the first rollout; a named precision is the user's
    assert default_scope(_scope_args(**changes), single_turn) == expected


def test_the_reference_mode_from_the_environment_samples_from_the_policy(monkeypatch):
    monkeypatch.setenv("GRPO_PLUGIN_FAST_PATHS", "0")
    assert default_scope(_scope_args(), single_turn=True) == "policy"
    assert default_scope(_scope_args(rollout_precision="bf16"), single_turn=True) == "bf16"


@pytest.mark.parametrize("bf16_units, copied", [(True, True), (False, False)])
def test_a_default_run_samples_from_a_bf16_copy_only_on_a_cpu_with_bf16_units(
    tiny_tokenizer, tmp_path, monkeypatch, caplog, bf16_units, copied, fast_paths_on
):
    from grpo_plugin.engine import rollout_copy

    monkeypatch.setattr(rollout_copy, "cpu_has_bf16_units", lambda: bf16_units)
    caplog.set_level("INFO", logger=rollout_copy.__name__)
    trainer = _trained(tiny_tokenizer, tmp_path)
    assert trainer.args.rollout_precision is None
    said = [r.getMessage() for r in caplog.records if r.name == rollout_copy.__name__]
    chosen = "'bf16'" if copied else "'policy'"
    assert [m for m in said if m.startswith("rollout_precision default")] == [
        next(m for m in said if m.startswith(f"rollout_precision default on cpu: {chosen}"))
    ]  # said once, on the first rollout
    corrected = [
        r for r in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in r
    ]
    assert len(corrected) == (2 if copied else 0)
    assert (trainer._sampler.copy is not None) is copied


def test_the_default_is_accepted_where_a_named_copy_is_refused(tiny_tokenizer, tmp_path):
    from tests.conftest import tiny_config

    with pytest.raises(ValueError, match="rollout_precision='bf16' with a rollout_func"):
        _with_rollout_func(tiny_tokenizer, tmp_path, rollout_precision="bf16")
    _with_rollout_func(tiny_tokenizer, tmp_path)  # the default: from the policy, no error
    with pytest.raises(ValueError, match="loss_type='vespo' with a rollout copy"):
        tiny_config(tmp_path, rollout_precision="bf16", loss_type="vespo")
    assert tiny_config(tmp_path, loss_type="vespo").rollout_precision is None
