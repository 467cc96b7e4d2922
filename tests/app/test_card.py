"""Model card and reward curve, from hand-written grpo_run.json / eval.json / metrics.jsonl."""

from __future__ import annotations

import pytest
from conftest import RUN_INFO, write_run_files
from huggingface_hub import ModelCard

from grpo_plugin.app.card import build_model_card, write_model_card


def test_metadata_parses_back_with_model_card_load(run_dir):
    path = write_model_card(run_dir, repo_id="alice/tiny-grpo")
    assert path == run_dir / "README.md"
    data = ModelCard.load(path).data
    assert data.base_model == "test-org/tiny-llama"
    assert data.library_name == "peft"
    assert data.tags == ["grpo", "grpo-plugin", "reinforcement-learning", "dapo", "lora"]
    assert data.datasets == ["openai/gsm8k"]
    assert data.license == "apache-2.0"
    assert data.pipeline_tag == "text-generation"


def test_body_states_objective_hyperparameters_and_rewards(run_dir):
    text = str(build_model_card(run_dir, repo_id="alice/tiny-grpo"))
    assert "[DAPO](https://arxiv.org/abs/2503.14476)" in text
    assert "[GRPO](https://arxiv.org/abs/2402.03300)" in text
    for row in (
        "| group size G | 8 |",
        "| KL coefficient β | 0 |",
        "| clip ε (low) | 0.2 |",
        "| clip ε (high) | 0.28 |",
        "| learning rate | 0.0002 |",
        "| optimizer steps | 40 |",
    ):
        assert row in text
    assert "`last_integer` (weight 1), `format` (weight 0.5)" in text
    assert "r = 16, alpha = 32, target modules: all-linear" in text


def test_eval_table_before_after_and_change(run_dir):
    text = str(build_model_card(run_dir))
    # 0.4375 -> 0.71875 is +28.125 points; 0.875 -> 0.90625 is +3.125 points
    assert "| accuracy | 43.8% | 71.9% | +28.1 pts |" in text
    assert "| pass@8 | 87.5% | 90.6% | +3.1 pts |" in text
    assert "Held-out prompts: 64 from `openai/gsm8k`" in text
    assert "](reward_curve.png)" in text


def test_snippet_and_citations(run_dir):
    text = str(build_model_card(run_dir, repo_id="alice/tiny-grpo"))
    assert 'AutoModelForCausalLM.from_pretrained("test-org/tiny-llama")' in text
    assert 'PeftModel.from_pretrained(base, "alice/tiny-grpo")' in text
    assert "max_new_tokens=24" in text
    assert "@article{shao2024deepseekmath" in text and "@article{yu2025dapo" in text


def test_merged_card_of_a_4bit_run_says_the_base_was_reloaded(tmp_path):
    run = write_run_files(tmp_path / "run", run_info={**RUN_INFO, "load_in_4bit": True})
    card = build_model_card(run, merged=True, repo_id="alice/merged")
    assert card.data.library_name == "transformers"
    assert "lora" not in card.data.tags
    assert 'model = AutoModelForCausalLM.from_pretrained("alice/merged")' in card.text
    assert "PeftModel" not in card.text
    assert "reloaded in 32-bit floats" in card.text
    unmerged = build_model_card(run)
    assert "BitsAndBytesConfig(load_in_4bit=True" in unmerged.text


@pytest.mark.parametrize(
    ("loss_type", "level", "estimator", "tag", "bib"),
    [
        ("grpo", "token", "grpo", None, None),
        ("dr_grpo", "token", "dr_grpo", "dr-grpo", "liu2025understanding"),
        ("grpo", "sequence", "grpo", "gspo", "zheng2025gspo"),
        ("grpo", "token", "rloo", "rloo", "ahmadian2024back"),
    ],
)
def test_variant_tag_and_citation(tmp_path, loss_type, level, estimator, tag, bib):
    objective = {
        **RUN_INFO["objective"],
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "advantage_estimator": estimator,
    }
    run = write_run_files(tmp_path / "run", run_info={**RUN_INFO, "objective": objective})
    card = build_model_card(run)
    expected = ["grpo", "grpo-plugin", "reinforcement-learning"] + ([tag] if tag else [])
    assert card.data.tags == [*expected, "lora"]
    if bib:
        assert f"{{{bib}," in card.text


def test_missing_eval_and_local_base_path(tmp_path):
    info = {**RUN_INFO, "base_model": str(tmp_path), "datasets": [], "license": None}
    run = write_run_files(tmp_path / "run", run_info=info, evaluation=None)
    card = build_model_card(run)
    assert card.data.base_model is None  # a local path is not a Hub id
    assert card.data.datasets is None and card.data.license is None
    assert "## Evaluation" not in card.text and "reward_curve.png" not in card.text
    assert str(tmp_path) in card.text  # still named in the body


def test_embedded_base_is_flagged(tmp_path):
    info = {**RUN_INFO, "base_model_path": "embedded:smollm2-135m-instruct"}
    card = build_model_card(write_run_files(tmp_path / "run", run_info=info))
    assert "dequantised from a GGUF file" in card.text
