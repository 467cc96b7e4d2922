"""Every field of the installed trl.GRPOConfig exists on ours: at TRL's default nothing raises, and
each field accepted only at its default refuses anything else with one line naming it."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from grpo_plugin import GRPOConfig
from grpo_plugin.config.field_checks import refused_field_names

trl = pytest.importorskip("trl")


def trl_defaults() -> dict:
    out = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def make(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), **kw)


def test_every_trl_field_at_its_default_is_accepted(tmp_path):
    defaults = trl_defaults()
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert sorted(set(defaults) - ours) == []
    config = make(tmp_path, **{k: v for k, v in defaults.items() if k != "output_dir"})
    assert config.use_vllm is False and config.pad_to_multiple_of is None  # "auto" off Neuron
    assert config.learning_rate == 1e-6 and config.gradient_checkpointing is True  # TRL's own
    for name, value in defaults.items():  # one at a time too: no field depends on another
        if name != "output_dir":
            make(tmp_path, **{name: value})


REFUSED_EXAMPLES = {
    "vllm_server_host": "10.0.0.1",
    "ds3_gather_for_generation": False,
    "log_completions_hub_repo": "me/completions",
    "use_transformers_continuous_batching": True,
    "use_transformers_paged": True,
}


@pytest.mark.parametrize("name", refused_field_names())
def test_each_refused_field_names_itself_and_the_way_out(tmp_path, name):
    default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}[name]
    value = REFUSED_EXAMPLES.get(name, 12345 if default is None else not default)
    with pytest.raises(ValueError) as err:
        make(tmp_path, **{name: value})
    message = str(err.value)
    assert message.startswith(f"{name}={value!r} is not supported: ") and "\n" not in message
    assert f"leave it {default!r}" in message


def test_use_vllm_without_vllm_says_how_to_install_it(tmp_path, monkeypatch):
    from grpo_plugin.config import vllm_checks

    monkeypatch.setattr(vllm_checks, "vllm_problem", lambda: "vLLM is not installed: pip ...")
    with pytest.raises(ValueError, match=r"^use_vllm=True: vLLM is not installed"):
        make(tmp_path, use_vllm=True)


def test_use_liger_kernel_is_left_to_the_trainer(tmp_path):
    # the trainer decides it with the PEFT adapter in view (models/liger.py), as TRL does
    assert make(tmp_path, use_liger_kernel=True).use_liger_kernel is True


def test_generation_kwargs_override_supported_keys_and_refuse_the_rest(tmp_path):
    c = make(tmp_path, generation_kwargs={"top_k": 50, "min_p": 0.05, "do_sample": True,
                                          "suppress_tokens": [3, 4], "num_beams": 1})  # fmt: skip
    sampling = c.sampling_params()
    assert (c.top_k, sampling.top_k, sampling.min_p) == (50, 50, 0.05)
    assert sampling.suppress_tokens == (3, 4)
    c = make(tmp_path, generation_kwargs='{"temperature": 0.7}')  # a JSON string, as on a CLI
    assert c.temperature == 0.7  # also the log-prob temperature
    with pytest.raises(ValueError, match=r"generation_kwargs\['num_beams'\]=2 is not supported"):
        make(tmp_path, generation_kwargs={"num_beams": 2})
    with pytest.raises(ValueError, match="do_sample'\\]=False is greedy decoding"):
        make(tmp_path, generation_kwargs={"do_sample": False})
    with pytest.raises(ValueError, match="set max_completion_length instead"):
        make(tmp_path, generation_kwargs={"max_new_tokens": 5})


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"min_p": 1.5}, r"min_p must be None or in \[0, 1\]"),
        ({"top_entropy_quantile": 1.2}, "top_entropy_quantile=1.2 must be in"),
        ({"multi_objective_aggregation": "mean"}, "multi_objective_aggregation='mean'"),
        ({"sync_ref_model": True}, "sync_ref_model=True needs a reference model"),
        ({"delta": 0.9}, "delta=0.9 caps the importance ratio from above"),
        ({"off_policy_mask_threshold": 0.0}, "off_policy_mask_threshold=0.0 must be > 0"),
        ({"entropy_coef_min": 1.0, "entropy_coef_max": 0.5}, "entropy_coef_min must be <="),
        ({"pad_to_multiple_of": 0}, "pad_to_multiple_of=0 must be a positive int"),
        ({"sapo_temperature_neg": 0.0}, "sapo_temperature_neg=0.0 must be > 0"),
        ({"router_aux_loss_coef": -1.0}, "router_aux_loss_coef=-1.0 must be >= 0"),
    ],
)
def test_implemented_fields_are_validated(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kw)


def test_new_loss_types_and_pad_multiple_parse(tmp_path):
    for loss_type in ("bnpo", "cispo", "sapo", "luspo", "vespo"):
        assert make(tmp_path, loss_type=loss_type).loss_params().loss_type == loss_type
    assert make(tmp_path, pad_to_multiple_of="64").pad_to_multiple_of == 64
    assert make(tmp_path, pad_to_multiple_of="none").pad_to_multiple_of is None
    params = make(tmp_path, delta=4.0, use_bias_correction_kl=False).loss_params()
    assert params.delta == 4.0 and params.use_bias_correction_kl is False


def test_loss_combination_warnings(tmp_path, caplog):
    from grpo_plugin.config.field_checks import warn_on_loss_combinations

    with caplog.at_level(logging.WARNING):
        warn_on_loss_combinations(make(tmp_path, importance_sampling_level="sequence"))
    assert "sums a sequence-level ratio over tokens" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_on_loss_combinations(
            make(tmp_path, loss_type="grpo", importance_sampling_level="sequence")
        )
    assert caplog.text == ""


def test_every_trl_field_has_help():
    trl_names = set(trl_defaults())
    own = [f for f in dataclasses.fields(GRPOConfig) if f.name in GRPOConfig.__annotations__]
    assert len([f for f in own if f.name in trl_names]) > 40
    assert all(f.metadata.get("help") for f in own if f.name in trl_names)


def test_trl_fields_work_in_recipes_and_refusals_reach_the_user():
    from grpo_plugin.app.recipe import RecipeError, build_recipe

    recipe = build_recipe({"dataset": {"name": "arithmetic"}, "loss_type": "cispo", "delta": 2.0,
                           "min_p": 0.1, "generation_kwargs": {"top_k": 5}})  # fmt: skip
    assert (recipe.config.delta, recipe.config.min_p, recipe.config.top_k) == (2.0, 0.1, 5)
    with pytest.raises(RecipeError, match="vllm_mode='server' is not supported"):
        build_recipe({"dataset": {"name": "arithmetic"}, "use_vllm": True, "vllm_mode": "server"})


def test_trl_importance_sampling_names_set_ours_and_conflicts_are_refused(tmp_path):
    c = make(tmp_path, vllm_importance_sampling_mode="token_truncate",
             vllm_importance_sampling_clip_max=2.0)  # fmt: skip
    assert (c.sampling_correction_mode, c.sampling_correction_clip_max) == ("token_truncate", 2.0)
    c = make(tmp_path, sampling_correction=False, vllm_importance_sampling_cap=5.0)
    assert c.vllm_importance_sampling_correction is False  # ours sets TRL's name too
    assert c.sampling_correction_clip_max == c.vllm_importance_sampling_clip_max == 5.0
    with pytest.raises(ValueError, match="set one of them") as err:
        make(tmp_path, sampling_correction_mode="token_mask",
             vllm_importance_sampling_mode="sequence_truncate")  # fmt: skip
    assert str(err.value).startswith("sampling_correction_mode='token_mask' and vllm_importance")


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"rollout_precision": "fp8"}, "rollout_precision='fp8' is not supported; use one of"),
        ({"sampling_correction_mode": "mask"}, "sampling_correction_mode='mask' is not supported"),
        ({"rollout_precision": "bf16", "loss_type": "vespo"}, "loss_type='vespo' with a rollout"),
    ],
)
def test_rollout_copy_settings_are_checked_in_one_line(tmp_path, settings, match):
    with pytest.raises(ValueError, match=match) as err:
        make(tmp_path, **settings)
    assert "\n" not in str(err.value)


def _decode(args, device="cpu", single_turn=True):
    from grpo_plugin.engine import PolicyEngine
    from grpo_plugin.training.sampling.rollouts import decode_ask

    engine = PolicyEngine.build(device, args.fast_paths)
    return engine.decode_settings(decode_ask(args, single_turn))


def test_cache_implementation_static_is_accepted_and_others_are_refused(tmp_path, monkeypatch):
    from grpo_plugin.engine.decode import DecodeSettings

    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS", raising=False)
    assert _decode(make(tmp_path)) == DecodeSettings()  # a CPU: the dynamic loop
    assert _decode(make(tmp_path, cache_implementation="dynamic")) == DecodeSettings()
    static = _decode(make(tmp_path, cache_implementation="static"))
    assert static == DecodeSettings(static_cache=True)
    compiled = _decode(make(tmp_path, compile_decode=True))
    assert compiled.compile and compiled.static  # compiling implies the static cache
    with pytest.raises(ValueError) as err:
        make(tmp_path, cache_implementation="offloaded")
    assert str(err.value) == (
        "cache_implementation='offloaded' is not supported: the rollouts decode with our own "
        "loop; use None (or 'dynamic') or 'static'."
    )


def test_the_decode_loop_follows_the_engines_plan(tmp_path, monkeypatch):
    from grpo_plugin.engine.decode import DecodeSettings

    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS", raising=False)
    # compile_decode=None (the default): compiled (so static) on CUDA for single turns only
    assert _decode(make(tmp_path), "cuda") == DecodeSettings(compile=True)
    assert _decode(make(tmp_path), "cuda", single_turn=False) == DecodeSettings()
    assert _decode(make(tmp_path), "cpu") == DecodeSettings()
    # the reference plan (fast_paths=False or the environment): the dynamic loop, every row
    # prefilled, whatever was asked
    reference = DecodeSettings(shared_prefill=False)
    assert _decode(make(tmp_path, fast_paths=False), "cuda") == reference
    assert _decode(make(tmp_path, fast_paths=False, compile_decode=True), "cpu") == reference
    monkeypatch.setenv("GRPO_PLUGIN_FAST_PATHS", "0")
    assert _decode(make(tmp_path, cache_implementation="static"), "cuda") == reference
    monkeypatch.delenv("GRPO_PLUGIN_FAST_PATHS")
    # an explicit compile_decode wins over the device's plan; the cache stays as asked
    static = make(tmp_path, compile_decode=False, cache_implementation="static")
    assert _decode(static, "cuda") == DecodeSettings(static_cache=True)
    assert _decode(make(tmp_path, compile_decode=True), "cpu") == DecodeSettings(compile=True)
