"""Where training rollouts come from (`training/sampling/rollouts.py`): the decode engine the
config asks for reaches the sampler, and a static cache trains exactly as the dynamic one."""

import pytest

from grpo_plugin.rollout import static_decode
from tests.conftest import assert_same_training, make_trainer, tiny_lora


def _trained(tokenizer, tmp_path, **overrides):
    trainer = make_trainer(tokenizer, tmp_path, peft=tiny_lora(), max_steps=2, **overrides)
    trainer.train()
    return trainer


def test_a_static_cache_trains_exactly_as_the_dynamic_one(tiny_tokenizer, tmp_path, monkeypatch):
    dynamic = _trained(tiny_tokenizer, tmp_path / "d")
    calls = []
    original = static_decode.decode_static
    monkeypatch.setattr(
        static_decode, "decode_static", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    static = _trained(tiny_tokenizer, tmp_path / "s", cache_implementation="static")
    assert len(calls) == 2  # one static rollout per step
    assert_same_training(
        dynamic, static, ("loss", "reward", "completions/mean_length", "num_tokens")
    )


def test_a_static_decode_with_a_rollout_func_is_refused_in_one_line(tiny_tokenizer, tmp_path):
    from grpo_plugin import GRPOTrainer
    from tests.conftest import SEVEN_DATA, frac_sevens, make_tiny_model, tiny_config

    def rollout_func(prompts, trainer):  # never called: refused before any step
        raise AssertionError

    with pytest.raises(ValueError) as err:
        GRPOTrainer(
            make_tiny_model(tiny_tokenizer),
            frac_sevens,
            args=tiny_config(tmp_path, compile_decode=True),
            train_dataset=SEVEN_DATA,
            processing_class=tiny_tokenizer,
            rollout_func=rollout_func,
        )
    assert str(err.value) == (
        "compile_decode=True is for single-turn rollouts, not a rollout_func (it generates by "
        "itself); leave it off."
    )


def test_the_cuda_plan_compiles_single_turn_decoding_by_default(tmp_path):
    from grpo_plugin.training.sampling.rollouts import decode_engine
    from tests.conftest import tiny_config

    args = tiny_config(tmp_path)
    assert args.compile_decode is None  # the default: the device's plan decides
    cuda = decode_engine(args, "cuda", single_turn=True)
    assert cuda.compile and cuda.static
    assert not decode_engine(args, "cuda", single_turn=False).compile
    assert not decode_engine(args, "cpu", single_turn=True).compile
    off = tiny_config(tmp_path, fast_paths=False)
    assert not decode_engine(off, "cuda", single_turn=True).compile
    asked = tiny_config(tmp_path, compile_decode=True)
    assert decode_engine(asked, "cpu", single_turn=True).compile
