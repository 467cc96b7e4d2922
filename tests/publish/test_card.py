"""Model card and reward curve, from hand-written grpo_run.json / eval.json / metrics.jsonl."""

from __future__ import annotations

import pytest
from conftest import EVAL, RUN_INFO, write_run_files
from huggingface_hub import ModelCard

from grpo_plugin.publish.card import build_model_card, write_model_card


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
    # 0.4375 -> 0.71875 is +28.125 points; 0.875 -> 0.90625 is +3.125 points. Wilson 95% of
    # 28/64: center (0.4375 + 0.030011) / 1.060023 = 0.441039, half 1.848985 * 0.063872 = 0.118098
    # -> 32.3-55.9%; of 46/64: center 0.706363, half 1.848985 * 0.058250 = 0.107703 -> 59.9-81.4%
    assert "| accuracy (n = 64) | 43.8% (32.3–55.9%) | 71.9% (59.9–81.4%) | +28.1 pts |" in text
    assert "| pass@8 | 87.5% | 90.6% | +3.1 pts |" in text
    assert "Held-out prompts: 64 from `openai/gsm8k`" in text
    assert "](reward_curve.png)" in text
    # no curve in this eval.json: built from before, the logged evaluation (step 20) and after
    assert "| 0 | 43.8% | 32.3–55.9% | 64 |" in text
    assert "| 20 | 50.0% | 38.1–61.9% | 64 |" in text  # 32/64: center 0.5, half 0.118979
    assert "| 40 | 71.9% | 59.9–81.4% | 64 |" in text


def test_card_shows_the_best_step_and_the_alarm(tmp_path):
    alarm = {"first_step": 16, "last_step": 32, "message": "Possible reward hacking: from step 16"}
    evaluation = {
        **EVAL,
        "curve": [
            {"step": 0, "accuracy": 0.4375, "ci95": [0.3229, 0.5591], "n": 64},
            {"step": 16, "accuracy": 0.75, "ci95": [0.6314, 0.8398], "n": 64},
            {"step": 40, "accuracy": 0.71875, "ci95": [0.5987, 0.8141], "n": 64},
        ],
        "best_step": 16,
        "best_metric": {"name": "eval_accuracy", "value": 0.75},
        "alarms": [alarm, {**alarm, "message": "later"}],
    }
    run = write_run_files(tmp_path / "run", evaluation=evaluation)
    text = build_model_card(run).text
    assert "**Best step: 16** (eval_accuracy = 75.0%); these weights are from step 40" in text
    assert "| 16 | 75.0% | 63.1–84.0% | 64 |" in text
    assert "> **Warning.** Possible reward hacking: from step 16" in text
    assert "(1 later evaluations diverged too.)" in text


def test_api_runs_take_the_best_step_from_the_run_summary(tmp_path):
    """No eval.json (trained through the Python API): grpo_run.json and metrics.jsonl suffice."""
    watch = {"metric": "eval_accuracy", "best_step": 20, "best_metric": 0.5, "weights_step": 20}
    info = {**RUN_INFO, "evaluation": watch}
    run = write_run_files(tmp_path / "run", run_info=info, evaluation=None)
    text = build_model_card(run).text
    assert "## Evaluation" in text
    assert "**Best step: 20** (eval_accuracy = 50.0%); these weights are from that step." in text


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


def test_names_from_the_run_are_shown_as_text_never_as_markup(tmp_path):
    info = {
        **RUN_INFO,
        "base_model": "/models/x`<script>",
        "reward_funcs": [{"name": "r`<img src=x>`", "weight": 1.0}],
    }
    run = write_run_files(tmp_path / "inj_<img src=x onerror=alert(1)>", run_info=info)
    text = build_model_card(run).text.lstrip("\n")
    title = text.split("\n", 1)[0]
    assert title == r"# inj\_&lt;img src=x onerror=alert(1)&gt;"
    assert "for `/models/x'<script>`, fine-tuned" in text  # one code span, closed where it ends
    assert "`r'<img src=x>'` (weight 1)" in text
