"""End to end: `grpo-plugin train recipes/arithmetic.yaml` on the embedded model for 2 steps, with
tiny eval sizes, then every output file is checked for existence and validity."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
from conftest import REPO_ROOT

from grpo_plugin import cli
from grpo_plugin.models.embedded import EMBEDDED_HUB_ID, EMBEDDED_PACKAGE, INSTALL_COMMAND

ROOT = REPO_ROOT
STEPS = 2


def _require_embedded_package() -> None:
    try:
        importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"the embedded model needs {EMBEDDED_PACKAGE}: {INSTALL_COMMAND}")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    _require_embedded_package()
    out = tmp_path_factory.mktemp("e2e") / "run"
    code = cli.main([
        "train", str(ROOT / "recipes" / "arithmetic.yaml"),
        "--output_dir", str(out), "--max_steps", str(STEPS),
        "--num_generations", "4", "--per_device_train_batch_size", "8",  # 2 prompts x 4
        "--max_completion_length", "12",
        "--dataset.train_size", "8", "--dataset.eval_size", "4",
        "--eval.k", "2", "--eval.batch_size", "8",
    ])  # fmt: skip
    assert code == 0
    return out


@pytest.mark.slow
def test_adapter_and_tokenizer_saved(run_dir):
    from peft import PeftConfig

    assert (run_dir / "adapter_model.safetensors").stat().st_size > 0
    assert PeftConfig.from_pretrained(str(run_dir)).r == 16
    assert (run_dir / "tokenizer_config.json").is_file()
    run = json.loads((run_dir / "grpo_run.json").read_text())
    assert run["global_step"] == STEPS and run["base_model"] == EMBEDDED_HUB_ID


@pytest.mark.slow
def test_metrics_jsonl_has_one_line_per_step(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "reward" in r]
    assert steps == list(range(1, STEPS + 1))
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows if "reward" in r)


@pytest.mark.slow
def test_completions_parquet_reads(run_dir):
    import pyarrow.parquet as pq

    files = sorted((run_dir / "completions").glob("*.parquet"))
    assert files
    table = pq.read_table(files[0])
    assert {"prompt", "completion", "reward", "advantage"} <= set(table.column_names)
    assert table.num_rows == 8  # 2 prompts x G=4


@pytest.mark.slow
def test_reward_curve_png_opens(run_dir):
    import matplotlib.image

    image = matplotlib.image.imread(run_dir / "reward_curve.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


@pytest.mark.slow
def test_eval_json_has_before_and_after(run_dir):
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert evaluation["dataset"] == "arithmetic" and evaluation["reward"] == "last_integer"
    for key in ("before", "after"):
        assert evaluation[key]["n"] == 4
        assert 0.0 <= evaluation[key]["accuracy"] <= 1.0
        assert 0.0 <= evaluation[key]["pass@2"] <= 1.0


@pytest.mark.slow
def test_model_card_metadata(run_dir):
    from huggingface_hub import ModelCard

    card = ModelCard.load(run_dir / "README.md")
    assert card.data.base_model == EMBEDDED_HUB_ID
    assert card.data.library_name == "peft"
    assert {"grpo", "grpo-plugin"} <= set(card.data.tags)
    assert "reward_curve.png" in card.text


@pytest.mark.slow
def test_recipe_copy_reruns_the_same_run(run_dir):
    from grpo_plugin.app.recipe import load_recipe
    from grpo_plugin.app.recipe_checks import check_recipe

    recipe = load_recipe(run_dir / "recipe.yaml")
    check_recipe(recipe)
    assert recipe.config.max_steps == STEPS and recipe.config.num_generations == 4
    assert recipe.args.dataset["eval_size"] == 4
