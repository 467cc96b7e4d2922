"""Which files of an output_dir a run wrote: by name and, for names a project may hold too, by
content. A user's README.md, recipe.yaml or model folder is never taken for a run's."""

from __future__ import annotations

import json

import pytest

from grpo_plugin.run import ownership

CARD = "---\nlibrary_name: peft\ntags:\n- grpo\n- grpo-plugin\n---\n\n# run\n"


def _run(out):
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (out / "checkpoint-2").mkdir()
    (out / "README.md").write_text(CARD)
    (out / "recipe.yaml").write_text("# The recipe as run (from r.yaml).\nmodel: m\n")
    (out / "eval.json").write_text(json.dumps({"before": {}}))
    (out / "tokenizer.json").write_text("{}")
    (out / "training_args.bin").write_bytes(b"x")
    (out / "runs").mkdir()  # TensorBoard's default logging dir
    (out / ".grpo-plugin.lock").write_text("")
    (out / "abandoned").mkdir()


def test_a_run_folder_is_all_the_runs(tmp_path):
    _run(tmp_path)
    assert ownership.shows_run(tmp_path)
    assert ownership.others(tmp_path) == ([], [])
    ownership.check_others(tmp_path, allowed=False)  # no error


def test_a_users_project_is_not_a_run(tmp_path):
    (tmp_path / "README.md").write_text("# My project\n")
    (tmp_path / "recipe.yaml").write_text("mine: true\n")
    (tmp_path / "eval.json").write_text(json.dumps({"f1": 0.3}))  # a project's own eval.json
    (tmp_path / "notes.txt").write_text("")
    assert not ownership.shows_run(tmp_path)
    found, clashing = ownership.others(tmp_path)
    assert found == ["README.md", "eval.json", "notes.txt", "recipe.yaml"]
    assert clashing == ["README.md", "eval.json", "recipe.yaml"]


def test_a_model_folder_is_not_a_run(tmp_path):
    """config.json, tokenizer.json, model.safetensors: a run writes these names, but without a
    run beside them they are someone's model."""
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    assert ownership.run_entries(tmp_path) == []
    assert ownership.others(tmp_path)[1] == ["config.json", "model.safetensors", "tokenizer.json"]


def test_a_users_readme_in_a_run_folder_is_theirs(tmp_path):
    _run(tmp_path)
    (tmp_path / "README.md").write_text("# What I learnt from this run\n")
    (tmp_path / "my_notes.txt").write_text("")
    assert ownership.others(tmp_path) == (["README.md", "my_notes.txt"], ["README.md"])


def test_the_card_peft_writes_with_an_adapter_is_the_runs(tmp_path):
    _run(tmp_path)
    (tmp_path / "README.md").write_text("---\nbase_model: m\nlibrary_name: peft\n---\n# Card\n")
    assert "README.md" in ownership.run_entries(tmp_path)


@pytest.mark.parametrize("allowed", [False, True])
def test_others_are_refused_unless_allowed_and_a_clash_always(tmp_path, allowed):
    (tmp_path / "data.csv").write_text("")
    if allowed:
        ownership.check_others(tmp_path, allowed=True)  # left alone, written beside
    else:
        with pytest.raises(ValueError) as caught:
            ownership.check_others(tmp_path, allowed=False)
        assert str(caught.value) == (
            f"output_dir {tmp_path} holds files no run of grpo-plugin wrote (data.csv): nothing "
            "was written; choose an empty or new output_dir, or pass "
            "--allow_other_files_in_output_dir true to write the run beside them (they are left "
            "alone)."
        )
    (tmp_path / "README.md").write_text("# Mine\n")
    with pytest.raises(ValueError, match=r"holds README.md, which no run of grpo-plugin wrote"):
        ownership.check_others(tmp_path, allowed=allowed)


def test_file_browser_litter_and_an_empty_folder_are_fine(tmp_path):
    (tmp_path / ".DS_Store").write_bytes(b"")
    ownership.check_others(tmp_path, allowed=False)
    ownership.check_others(tmp_path / "new", allowed=False)  # not there yet
