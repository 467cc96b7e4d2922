"""GRPOConfig: TRL names, our defaults, and contradictions rejected with the fix in the message."""

import re

import pytest
import torch

from grpo_plugin import GRPOConfig


def make(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 defaults to True on a bf16 GPU")
def test_defaults_fit_a_cpu(tmp_path):
    c = make(tmp_path)
    assert c.bf16 is False and c.gradient_checkpointing is False
    assert c.loss_type == "dapo" and c.num_generations == 8 and c.beta == 0.0
    assert c.learning_rate == 1e-5 and c.share_prompt_prefix is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 runs on the GPU there")
def test_bf16_on_a_cpu_runs_there_and_warns_where_it_is_emulated(tmp_path, monkeypatch, caplog):
    from grpo_plugin.config import field_checks as config_module

    c = make(tmp_path, bf16=True)  # transformers alone: "Your setup doesn't support bf16/gpu"
    assert c.bf16 is True and c.use_cpu is True
    monkeypatch.setattr(config_module, "cpu_has_bf16_units", lambda: False)
    with caplog.at_level("WARNING"):
        make(tmp_path, bf16=True)
    assert "without AVX512-BF16 or AMX" in caplog.text


def test_generation_batch_is_derived_like_trl(tmp_path):
    c = make(tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    assert (c.steps_per_generation, c.generation_batch_size, c.prompts_per_generation) == (2, 16, 2)
    c = make(tmp_path, per_device_train_batch_size=8, generation_batch_size=32)
    assert c.steps_per_generation == 4 and c.needs_old_logps  # 4 slices, 1 accumulation step


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"num_generations": 1}, "at least 2"),
        ({"per_device_train_batch_size": 12}, "must be divisible by num_generations=8"),
        ({"loss_type": "ppo"}, "loss_type must be one of 'grpo', 'dapo'"),
        ({"importance_sampling_level": "seq"}, "importance_sampling_level"),
        ({"advantage_estimator": "ppo"}, "advantage_estimator='ppo'"),
        ({"scale_rewards": "max"}, "scale_rewards"),
        ({"epsilon": 1.5}, r"epsilon=1.5 \(the lower clip epsilon\) must be in \(0, 1\)"),
        ({"epsilon_high": 0.0}, "epsilon_high"),
        ({"beta": -0.1}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"max_completion_length": 0}, r"max_completion_length=0 must be >= 1"),
        ({"num_iterations": 0}, "num_iterations"),
        ({"generation_batch_size": 16, "steps_per_generation": 2}, "can not be both configured"),
        ({"auto_batch_memory_gb": 0.0}, "auto_batch_memory_gb=0.0 must be > 0"),
        ({"temperature": None}, r"temperature=None must be a number; e.g. temperature=1.0"),
        ({"max_completion_length": None}, r"max_completion_length=None must be an integer"),
        ({"num_generations": "8"}, r"num_generations='8' must be an integer"),
        ({"num_generations": True}, r"num_generations=True must be an integer"),
        ({"learning_rate": None}, r"learning_rate=None must be a number"),
    ],
)
def test_contradictions_are_rejected(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kw)


@pytest.mark.parametrize(
    "scale, estimator, expected",
    [("group", None, "grpo"), ("batch", None, "batch"), ("none", None, "dr_grpo"),
     (False, None, "dr_grpo"), ("group", "rloo", "rloo")],
)  # fmt: skip
def test_advantage_estimator_overrides_scale_rewards(tmp_path, scale, estimator, expected):
    assert make(tmp_path, scale_rewards=scale, advantage_estimator=estimator).estimator == expected


def test_every_field_has_help():
    from dataclasses import fields

    own = [f for f in fields(GRPOConfig) if f.name in GRPOConfig.__annotations__]
    assert len(own) > 90 and all(f.metadata.get("help") for f in own)


BATCH_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "logprob_chunk_size",
)


def _batch_fields(c: GRPOConfig) -> tuple:
    return tuple(getattr(c, name) for name in BATCH_FIELDS)


@pytest.mark.parametrize(
    "kw, plan, expected",
    [  # whole groups; one group split row-wise; a rollout trained on over several steps
        ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_generations": 4},
         (4, 256), (4, 4, 4, 16, 256)),
        ({"per_device_train_batch_size": 8}, (2, None), (2, 4, 4, 8, 1024)),
        ({"per_device_train_batch_size": 8, "generation_batch_size": 32}, (4, 512),
         (4, 2, 8, 32, 512)),
    ],
)  # fmt: skip
def test_a_batch_plan_keeps_the_rows_and_matches_the_same_sizes_given_by_hand(
    tmp_path, kw, plan, expected
):
    c = make(tmp_path, **kw)
    before = (
        c.per_device_train_batch_size * c.gradient_accumulation_steps,
        c.generation_batch_size,
    )
    c.apply_batch_plan(*plan)
    assert _batch_fields(c) == expected
    assert (c.per_device_train_batch_size * c.gradient_accumulation_steps, c.generation_batch_size) \
        == before  # fmt: skip
    by_hand = make(tmp_path, **{**kw, "per_device_train_batch_size": expected[0],
                                "gradient_accumulation_steps": expected[1],
                                "generation_batch_size": expected[3],
                                "logprob_chunk_size": expected[4]})  # fmt: skip
    assert _batch_fields(by_hand) == expected and by_hand.needs_old_logps == c.needs_old_logps


@pytest.mark.parametrize(
    "kw, plan, message",
    [
        ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}, (3, None),
         "per_device_train_batch_size=3 must divide the 16 rows of an optimizer step"),
        ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4,
          "generation_batch_size": 12}, (8, None),
         r"generation_batch_size=12 must be divisible by the global batch size 8"),
        ({"per_device_train_batch_size": 8}, (8, 0), "logprob_chunk_size=0 must be >= 1"),
    ],
)  # fmt: skip
def test_an_invalid_batch_plan_raises_the_users_error(tmp_path, kw, plan, message):
    c = make(tmp_path, **kw)
    before = _batch_fields(c)
    with pytest.raises(ValueError, match=message):
        c.apply_batch_plan(*plan)
    assert _batch_fields(c) == before  # a refused plan leaves the config as it was


def test_the_users_sizes_raise_the_same_error_as_a_plan(tmp_path):
    with pytest.raises(ValueError, match="generation_batch_size=12 must be divisible by the glob"):
        make(tmp_path, per_device_train_batch_size=8, num_generations=4, generation_batch_size=12)


def test_a_launch_that_started_this_process_alone_is_refused(tmp_path, monkeypatch):
    """`distributed_type: MULTI_CPU` (or `--cpu` with several processes) without mpirun: accelerate
    starts one unranked process per launch. Refused before anything loads, on every process."""
    from grpo_plugin._compat import RANK_VARIABLES

    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")  # set by accelerate's simple launcher
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # set there when several were asked for
    with pytest.raises(ValueError, match="set `distributed_type: MULTI_GPU`"):
        make(tmp_path)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "kw, message",
    [  # issue 45: `--reward_weights nan` trained nothing (every advantage 0) and exited 0
        ({"reward_weights": [NAN]}, r"reward_weights\[0\]=nan must be a finite number"),
        ({"reward_weights": [1.0, INF]}, r"reward_weights\[1\]=inf must be a finite number"),
        ({"reward_weights": [1.0, "2"]}, r"reward_weights\[1\]='2' must be a finite number"),
        ({"reward_weights": 1.0}, r"reward_weights=1.0 must be a list with one number per"),
        # NaN passed every `x <= 0` check; infinity where it is no setting
        ({"temperature": NAN}, "temperature=nan must be a finite number"),
        ({"temperature": INF}, "temperature=inf must be a finite number"),
        ({"beta": NAN}, "beta=nan must be a finite number"),
        ({"entropy_coef": NAN}, "entropy_coef=nan must be a finite number"),
        ({"num_train_epochs": NAN}, "num_train_epochs=nan must be a finite number"),
        ({"reward_timeout": INF}, "reward_timeout=inf must be a finite number"),
        ({"max_grad_norm": NAN}, "max_grad_norm=nan must be a finite number"),
        ({"max_grad_norm": -INF}, "max_grad_norm=-inf must be a finite number"),
        ({"delta": "big"}, "delta='big' must be a number"),
        # what torch's AdamW refused only once the model had loaded
        ({"adam_beta1": 1.5}, r"adam_beta1=1.5 must be in \[0, 1\)"),
        ({"adam_beta2": -0.1}, r"adam_beta2=-0.1 must be in \[0, 1\)"),
        ({"adam_epsilon": -1e-8}, "adam_epsilon=-1e-08 must be >= 0"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 must be >= 0"),
        # a batch size of 0 passed (0 % G == 0) and failed in the DataLoader after the load
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size=0 must be >= 1"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0 must be >= 1"),
        ({"steps_per_generation": 0}, "steps_per_generation=0 must be >= 1, or None"),
        ({"generation_batch_size": 0}, "generation_batch_size=0 must be >= 1, or None"),
        # taken silently: empty prompts; 3 epochs for "0 steps"; no training at all
        ({"max_prompt_length": 0}, "max_prompt_length=0 must be >= 1, or None"),
        ({"max_steps": 0}, "max_steps=0 would train num_train_epochs epochs"),
        ({"max_steps": -1, "num_train_epochs": 0}, "num_train_epochs=0 with max_steps=-1 trains"),
        # numpy's legacy seeding refused them in set_seed, after the model had loaded
        ({"seed": -1}, r"seed=-1 must be in \[0, 2\*\*32 - 1\]"),
        ({"seed": 2**40}, r"seed=1099511627776 must be in \[0, 2\*\*32 - 1\]"),
        ({"data_seed": -1}, r"data_seed=-1 must be in"),
        ({"dataloader_num_workers": -1}, "dataloader_num_workers=-1 must be >= 0"),
        # a negative logging_steps never logged, save_steps 0 never saved: both silently
        ({"logging_steps": -1}, "logging_steps=-1 must be > 0 with logging_strategy='steps'"),
        ({"save_strategy": "steps", "save_steps": 0}, "save_steps=0 must be > 0 with save_str"),
        ({"eval_strategy": "steps", "eval_steps": -2}, "eval_steps=-2 must be > 0 with eval_str"),
        ({"report_to": "nosuch"}, "report_to='nosuch' is not a tracker"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kw)


def test_infinity_where_it_means_no_bound_is_accepted(tmp_path):
    c = make(tmp_path, max_grad_norm=INF, epsilon_high=INF, sampling_correction_clip_max=INF)
    assert c.max_grad_norm == INF and c.sampling_correction_clip_max == INF
    # all-zero weights stay allowed here: an environment's reward (weight 1) may be the one learned
    assert make(tmp_path, reward_weights=[0.0, 0]).reward_weights == [0.0, 0]


def test_a_tracker_that_is_not_installed_is_refused(tmp_path):
    # the Trainer raised it once the model had loaded
    from transformers.integrations import get_available_reporting_integrations

    missing = next(
        (
            t
            for t in ("wandb", "mlflow", "comet_ml")
            if t not in get_available_reporting_integrations()
        ),
        None,
    )
    if missing is None:
        pytest.skip("every tracker tried is installed here")
    with pytest.raises(ValueError, match=f"report_to='{missing}': its package is not installed"):
        make(tmp_path, report_to=missing)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"train_precision": "int8"},
            "train_precision='int8' is not supported; use one of fp32, bf16",
        ),
        ({"bf16": True}, "train_precision='bf16' with bf16=True: autocast"),
        ({"gradient_checkpointing": True}, "with gradient_checkpointing=True: the recompute"),
        ({"fast_paths": False}, "with fast_paths=False: the bf16 products are a fast path"),
    ],
)
def test_bf16_training_against_the_rest_of_the_config(tmp_path, monkeypatch, kw, message):
    monkeypatch.setattr("grpo_plugin.config.field_checks.cpu_has_bf16_units", lambda: True)
    with pytest.raises(ValueError, match=re.escape(message)):
        make(tmp_path, **{"train_precision": "bf16", **kw})
    assert make(tmp_path, train_precision="bf16").train_precision == "bf16"
    monkeypatch.setattr("grpo_plugin.config.field_checks.cpu_has_bf16_units", lambda: False)
    with pytest.raises(ValueError, match="on a CPU without AVX512-BF16 or AMX"):
        make(tmp_path, train_precision="bf16")
    assert make(tmp_path).train_precision is None  # the default: the engine decides
