"""grpo_plugin._compat.checkpointing: `activation_checkpointing` (transformers 5.23's name) and
`gradient_checkpointing` are one setting on every supported transformers, the new name winning
when both are set, from Python, a recipe and the command line alike."""

from __future__ import annotations

import pytest

from grpo_plugin._compat.checkpointing import ACTIVATION_CHECKPOINTING_NATIVE
from grpo_plugin.app.recipe import build_recipe, parse_overrides
from grpo_plugin.config.grpo_config import GRPOConfig


def make(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), **kw)


def _flags(config: GRPOConfig) -> tuple[bool, bool]:
    return config.activation_checkpointing, config.gradient_checkpointing


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, (False, False)),
        ({"activation_checkpointing": True}, (True, True)),
        ({"gradient_checkpointing": True}, (True, True)),
        ({"gradient_checkpointing": True, "activation_checkpointing": False}, (False, False)),
        ({"gradient_checkpointing": False, "activation_checkpointing": True}, (True, True)),
    ],
)
def test_both_names_hold_one_value_and_the_new_one_wins(tmp_path, given, expected):
    assert _flags(make(tmp_path, **given)) == expected


def test_the_kwargs_follow_the_new_name_and_parse_from_json(tmp_path):
    config = make(
        tmp_path,
        activation_checkpointing=True,
        activation_checkpointing_kwargs='{"use_reentrant": true}',
    )
    assert config.activation_checkpointing_kwargs == {"use_reentrant": True}
    assert config.gradient_checkpointing_kwargs == {"use_reentrant": True}


def test_activation_checkpointing_is_not_reentrant_by_default(tmp_path):
    config = make(tmp_path, activation_checkpointing=True)
    # None on 5.23+ (transformers then passes use_reentrant=False itself); ours before it.
    kwargs = config.gradient_checkpointing_kwargs
    assert kwargs is None or kwargs == {"use_reentrant": False}
    assert ACTIVATION_CHECKPOINTING_NATIVE or kwargs == {"use_reentrant": False}


def test_the_recipe_key_and_the_flag_reach_the_config():
    recipe = build_recipe({"dataset": {"name": "arithmetic"}, "activation_checkpointing": True})
    assert _flags(recipe.config) == (True, True)
    assert parse_overrides(["--activation_checkpointing"]) == {"activation_checkpointing": True}


def test_output_dir_is_still_the_first_positional_field(tmp_path):
    config = GRPOConfig(str(tmp_path / "out"))  # TRL's scripts pass it so
    assert config.output_dir == str(tmp_path / "out") and config.activation_checkpointing is False
