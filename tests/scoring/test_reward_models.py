"""Reward models in reward_funcs (TRL's rules): loaded by path or passed loaded, scored as the
classifier's logit, chat prompts through the reward tokenizer's template, refused when they have
no classification head, named by model name in metrics and on the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import (
    frac_sevens,
    make_tiny_model,
    make_tiny_reward_model,
    make_tiny_tokenizer,
    make_trainer,
    tiny_config,
)
from transformers import AutoModelForSequenceClassification

from grpo_plugin import GRPOTrainer
from grpo_plugin.models.policy import model_init_kwargs
from grpo_plugin.scoring.reward_models import (
    RewardModel,
    RewardModelError,
    resolve_reward_funcs,
)

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "44", "6 is it"]


def logit_of(model, tokenizer, text: str) -> float:
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits[0, 0].item()


def test_reward_model_score_equals_the_classifier_logit(tiny_reward_dir, tiny_tokenizer):
    (rm,) = resolve_reward_funcs(str(tiny_reward_dir))
    assert isinstance(rm, RewardModel) and rm.__name__ == tiny_reward_dir.name
    scores = rm(prompts=PROMPTS, completions=COMPLETIONS)  # one padded batch
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_dir)
    expected = [logit_of(model, tiny_tokenizer, p + c) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 4) for s in scores)) == 3  # a real signal, not a constant
    assert not any(p.requires_grad for p in rm.model.parameters())


def test_chat_prompts_use_the_reward_tokenizers_own_template(tiny_tokenizer):
    reward_tok = make_tiny_tokenizer()
    reward_tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }};{% endfor %}"
    )
    rm = RewardModel(make_tiny_reward_model(reward_tok), reward_tok)
    prompts = [[{"role": "user", "content": "1+1?"}]]
    completions = [[{"role": "assistant", "content": "2"}]]
    assert rm.texts(prompts, completions) == ["[user] 1+1?;[assistant] 2;"]
    (score,) = rm(prompts=prompts, completions=completions)
    assert score == pytest.approx(logit_of(rm.model, reward_tok, "[user] 1+1?;[assistant] 2;"))


def test_a_causal_lm_path_is_refused_before_any_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("the policy was loaded before the reward model was checked")

    monkeypatch.setattr("grpo_plugin.training.trainer.load_trainer_policy", loaded)
    with pytest.raises(
        RewardModelError, match="has no sequence-classification head .*LlamaForCausalLM"
    ):
        args = tiny_config(tmp_path)
        GRPOTrainer(str(tiny_model_dir), str(tiny_model_dir), args, [{"prompt": "a"}] * 2)


def test_a_checkpoint_without_trained_head_weights_is_refused(tiny_tokenizer, tmp_path):
    path = tmp_path / "headless"
    make_tiny_model(tiny_tokenizer).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]  # lies: no score weights saved
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        RewardModelError, match=r"no trained sequence-classification head \(missing score"
    ):
        resolve_reward_funcs(str(path), tiny_tokenizer)


def test_unknown_names_still_get_the_registry_error():
    import reward_fns

    with pytest.raises(reward_fns.UnknownRewardError, match="unknown reward 'last_integr'"):
        resolve_reward_funcs("last_integr")
    with pytest.raises(RewardModelError, match="neither a registered reward nor a loadable"):
        resolve_reward_funcs("org/not-downloadable-offline")
    with pytest.raises(ValueError, match="No reward source provided"):
        resolve_reward_funcs(None)


def test_reward_processing_classes_follow_trls_rules(tiny_reward_dir, tiny_tokenizer):
    with pytest.raises(
        ValueError, match=r"number of reward processing classes \(1\) must match.*\(2\)"
    ):
        resolve_reward_funcs([str(tiny_reward_dir), frac_sevens], tiny_tokenizer)
    other = make_tiny_tokenizer()
    rm, fn = resolve_reward_funcs([str(tiny_reward_dir), frac_sevens], [other, "ignored"])
    assert rm.tokenizer is other and fn is frac_sevens
    (rm,) = resolve_reward_funcs(make_tiny_reward_model(tiny_tokenizer), tiny_tokenizer)
    assert rm.tokenizer is tiny_tokenizer
    with pytest.raises(RewardModelError, match="LlamaForCausalLM in reward_funcs is not a"):
        resolve_reward_funcs(make_tiny_model(tiny_tokenizer), tiny_tokenizer)


def test_reward_model_is_4bit_when_asked_like_the_policy(tiny_tokenizer, tmp_path):
    pytest.importorskip("bitsandbytes")
    # width 64: bitsandbytes' CPU inference path needs in_features >= its block size (64)
    make_tiny_reward_model(tiny_tokenizer, hidden=64).save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    (rm,) = resolve_reward_funcs(
        str(tmp_path / "rm"), init_kwargs=model_init_kwargs({}, load_in_4bit=True)
    )
    assert rm.model.is_loaded_in_4bit
    assert len(rm(prompts=PROMPTS, completions=COMPLETIONS)) == 3


def test_trainer_scores_with_a_reward_model_and_lists_it(tiny_reward_dir, tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, reward=[str(tiny_reward_dir), frac_sevens],
                           max_steps=1)  # fmt: skip
    name = tiny_reward_dir.name
    assert trainer.reward_names == [name, "frac_sevens"]
    assert trainer.reward_processing_classes[1] is None
    trainer.train()
    logged = trainer.state.log_history[0]
    assert f"rewards/{name}/mean" in logged and f"rewards/{name}/std" in logged
    summary = trainer.run_summary()["reward_funcs"]
    assert summary[0] == {"name": name, "weight": 1.0, "model": str(tiny_reward_dir)}
    assert "model" not in summary[1]

    from grpo_plugin.publish.card import write_model_card

    trainer.save_model()
    text = write_model_card(Path(trainer.args.output_dir)).read_text()
    assert f"`{name}` (reward model `{tiny_reward_dir}`, weight 1)" in text


def test_reward_models_go_to_the_policys_device_unless_quantized(tiny_reward_dir, monkeypatch):
    from grpo_plugin.scoring.reward_models import place_reward_models

    (rm,) = resolve_reward_funcs([str(tiny_reward_dir)], None, {})
    moved = []
    monkeypatch.setattr(rm.model, "to", lambda device: moved.append(device))
    place_reward_models([rm, len], "cuda:3", {"enable_thinking": False})
    assert moved == ["cuda:3"] and rm.chat_template_kwargs == {"enable_thinking": False}
    rm.model.is_loaded_in_4bit = True  # bitsandbytes places 4-bit weights itself
    place_reward_models([rm], "cuda:3")
    assert moved == ["cuda:3"]


def test_python_users_name_a_reward_file_as_recipes_do(tmp_path, monkeypatch):
    """`GRPOTrainer(reward_funcs=["myrew.py:lenrew"])`: the loader recipes, tools and
    eval_metrics use (user_code/callables.py), relative to the working directory."""
    from grpo_plugin.scoring.reward_models import resolve_reward_funcs

    (tmp_path / "rm_myrew.py").write_text(
        "def lenrew(completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    for spec in ("rm_myrew.py:lenrew", "rm_myrew:lenrew"):
        (fn,) = resolve_reward_funcs([spec])
        assert fn(completions=["abcd"]) == [4.0]
