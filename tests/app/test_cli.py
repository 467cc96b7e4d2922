"""`grpo-plugin` CLI: bad recipes fail early with one line and exit 2; `rewards`; `eval`; help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_plugin import cli

GOOD = (
    "dataset: {name: arithmetic, train_size: 4, eval_size: 4}\n"
    "reward_funcs: [last_integer]\n"
    "num_generations: 4\nper_device_train_batch_size: 8\nmax_steps: 1\noutput_dir: {out}\n"
)


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if the CLI gets as far as loading a model."""

    def boom(*args, **kwargs):
        raise AssertionError("train_recipe was reached: the recipe should have been rejected")

    monkeypatch.setattr("grpo_plugin.app.pipeline.train_recipe", boom)


def _recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text.replace("{out}", str(tmp_path / "out")))
    return str(path)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_good_recipe_dry_run(tmp_path, capsys, no_training):
    assert cli.main(["train", _recipe(tmp_path, GOOD), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "G=4" in out


@pytest.mark.parametrize(
    ("text", "flags", "expected"),
    [
        # unknown key, with a close-match suggestion
        (GOOD + "num_generatons: 4\n", [], "did you mean 'num_generations'"),
        (GOOD, ["--lerning_rate", "1e-4"], "did you mean 'learning_rate'"),
        (GOOD.replace("eval_size: 4", "eval_sise: 4"), [], "Did you mean 'eval_size'"),
        # unknown reward
        (GOOD.replace("[last_integer]", "[last_intger]"), [], "did you mean 'last_integer'"),
        # G does not divide the batch
        (
            GOOD.replace("num_generations: 4", "num_generations: 3"),
            [],
            "must be divisible by num_generations=3",
        ),
        # a reward reads a column the dataset does not have
        (
            GOOD.replace("[last_integer]", "[{name: gsm8k, params: {column_name: solution}}]"),
            [],
            "needs dataset column(s) ['solution']",
        ),
        # unknown eval key
        (GOOD + "eval: {kk: 4}\n", [], "did you mean 'k'"),
        # an eval_metrics hook that does not import
        (GOOD + "eval_metrics: no_such_module_xyz:f1\n", [], "cannot import 'no_such_module_xyz'"),
        # evaluation on a schedule without a held-out set
        (
            GOOD.replace("eval_size: 4", "eval_size: 0"),
            ["--eval_strategy", "steps", "--eval_steps", "2"],
            "held-out set, but there is none",
        ),
        # a best-model metric that is never logged
        (
            GOOD + "eval_strategy: steps\neval_steps: 2\nmetric_for_best_model: f1\n",
            [],
            "metric_for_best_model='f1' is never logged",
        ),
        # tools: an unknown name, a module that does not import, a function without a docstring
        (GOOD + "tools: [calculator]\n", [], "tool 'calculator' is not a built-in tool (python)"),
        (GOOD + "tools: [no_such_module_xyz:f]\n", [], "cannot import 'no_such_module_xyz'"),
        (GOOD + "tools: ['math:prod']\n", [], "tool 'prod' cannot be described to the model"),
        (GOOD + "tool_chat_template: jinja\n", [], "tool_chat_template='jinja'; use one of"),
        # overlapped scoring is for single-turn rollouts
        (
            GOOD + "tools: [python]\n",
            ["--overlap_scoring", "true"],
            "this run has tools; set overlap_scoring=False",
        ),
    ],
    ids=[
        "key",
        "flag",
        "dataset-key",
        "reward",
        "G",
        "column",
        "eval-key",
        "eval-metrics",
        "eval-no-set",
        "best-metric",
        "tool-name",
        "tool-import",
        "tool-schema",
        "tool-template",
        "overlap-tools",
    ],  # fmt: skip
)
def test_bad_recipe_gives_one_line_and_exit_2(tmp_path, capsys, no_training, text, flags, expected):
    assert cli.main(["train", _recipe(tmp_path, text), *flags]) == 2
    assert expected.lower() in _one_error_line(capsys).lower()


def test_missing_column_in_a_data_file(tmp_path, capsys, no_training):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1 + 1?", "gold": "2"}) + "\n")
    text = GOOD.replace("{name: arithmetic, train_size: 4, eval_size: 4}", f"{{path: {data}}}")
    assert cli.main(["train", _recipe(tmp_path, text)]) == 2
    line = _one_error_line(capsys)
    assert "'last_integer'" in line and "['answer']" in line and "gold" in line


def test_missing_recipe_file(tmp_path, capsys, no_training):
    assert cli.main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in _one_error_line(capsys)


def test_a_recipe_path_that_is_a_folder(tmp_path, capsys, no_training):
    """Issue 56: a folder said "not found"; it names the folder and a recipe inside it."""
    (tmp_path / "runs").mkdir()
    assert cli.main(["train", str(tmp_path / "runs")]) == 2
    line = _one_error_line(capsys)
    assert f"recipe '{tmp_path / 'runs'}' is a folder, not a recipe file (it holds no" in line
    (tmp_path / "runs" / "mine.yaml").write_text("dataset: {name: arithmetic}\n")
    assert cli.main(["train", str(tmp_path / "runs"), "--dry-run"]) == 2
    assert f"(did you mean {tmp_path / 'runs' / 'mine.yaml'}?)" in _one_error_line(capsys)


@pytest.mark.parametrize("dataset", ["/nonexistent", "./no/such.data"])
def test_a_dataset_path_that_does_not_exist_is_named(tmp_path, capsys, no_model_load, dataset):
    """Issue 56: `eval --dataset /nonexistent` said the Hub could not be reached; `train` too."""
    base = ["--reward", "last_integer", "--model", str(tmp_path)]
    assert cli.main(["eval", "--dataset", dataset, *base]) == 2
    expected = f"dataset file {str(Path(dataset))!r} does not exist; fix the path"
    assert _one_error_line(capsys) == f"error: {expected}"
    flags = ["--dataset", f"{{path: {dataset}}}", "--output_dir", str(tmp_path / "out")]
    assert cli.main(["train", "arithmetic", *flags, "--dry-run"]) == 2
    assert _one_error_line(capsys) == f"error: {expected}"


def test_bad_recipe_in_a_real_subprocess(tmp_path):
    """The console script's path: no traceback and no library warnings, just one line."""
    text = GOOD.replace("num_generations: 4", "num_generations: 3")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_plugin.cli", "train", _recipe(tmp_path, text)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "num_generations=3" in lines[0]


def test_rewards_lists_the_registry(capsys):
    import reward_fns

    assert cli.main(["rewards"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == reward_fns.format_registry().strip()
    for name in ("last_integer", "gsm8k", "think_format", "soft_overlong"):
        assert f"\n{name} " in out


def test_train_help_lists_every_key(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for key in ("--reward_funcs", "--num_generations", "--load_in_4bit", "--epsilon_high"):
        assert key in out
    assert "first one is the accuracy reward" in " ".join(out.split())


def test_eval_on_a_tiny_model(tiny_model_dir, tmp_path, capsys):
    out_file = tmp_path / "eval.json"
    code = cli.main([
        "eval", "--model", str(tiny_model_dir), "--dataset", "arithmetic", "--eval-size", "3",
        "--reward", "last_integer", "--k", "2", "--max-new-tokens", "4", "--output", str(out_file),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(out_file.read_text())
    assert result["n"] == 3 and 0.0 <= result["accuracy"] <= 1.0
    assert 0.0 <= result["pass@2"] <= 1.0 and result["reward"] == "last_integer"
    assert json.loads(capsys.readouterr().out)["n"] == 3


def test_eval_takes_the_same_tools(tiny_model_dir, tmp_path, capsys):
    code = cli.main([
        "eval", "--model", str(tiny_model_dir), "--dataset", "arithmetic", "--eval-size", "2",
        "--reward", "last_integer", "--k", "0", "--max-new-tokens", "4", "--tool", "python",
    ])  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tools"] == ["python"] and result["tool_call_rate"] == 0.0  # a random model
    assert cli.main(["eval", "--model", "x", "--dataset", "arithmetic", "--reward",
                     "last_integer", "--tool", "nope"]) == 2  # fmt: skip
    assert "tool 'nope' is not a built-in tool" in _one_error_line(capsys)


def test_eval_unknown_reward(capsys):
    assert cli.main(["eval", "--model", "x", "--dataset", "arithmetic", "--reward", "nope"]) == 2
    assert "unknown reward 'nope'" in _one_error_line(capsys)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if `grpo-plugin eval` gets as far as loading a model."""

    def boom(*args, **kwargs):
        raise AssertionError("load_policy was reached: the arguments should have been rejected")

    monkeypatch.setattr("grpo_plugin.models.policy.load_policy", boom)


def test_eval_checks_the_model_and_adapter_before_loading(
    tiny_model_dir, tmp_path, capsys, no_model_load
):
    base = ["eval", "--dataset", "arithmetic", "--reward", "last_integer"]
    model = ["--model", str(tiny_model_dir)]
    assert cli.main([*base, *model, "--adapter", str(tmp_path / "no-run")]) == 2
    assert f"adapter {tmp_path / 'no-run'} is not a directory" in _one_error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert cli.main([*base, *model, "--adapter", str(tmp_path / "empty")]) == 2
    assert "has no adapter_config.json" in _one_error_line(capsys)
    assert cli.main([*base, "--model", str(tmp_path / "no-model")]) == 2
    assert f"model path {tmp_path / 'no-model'} does not exist" in _one_error_line(capsys)
    adapter = tmp_path / "adapter"  # its base moved away since training
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(tmp_path / "moved")})
    )
    (adapter / "adapter_model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    assert cli.main([*base, "--adapter", str(adapter)]) == 2
    assert f"model path {tmp_path / 'moved'} does not exist" in _one_error_line(capsys)


def test_eval_refuses_a_model_or_adapter_without_whole_weights(
    tiny_model_dir, tmp_path, capsys, no_model_load
):
    """Issue 56: a model folder without weights, or with them cut, ended in a traceback."""
    import shutil

    base = ["eval", "--dataset", "arithmetic", "--reward", "last_integer"]
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert cli.main([*base, "--model", str(broken)]) == 2
    assert f"{weights}: truncated (" in _one_error_line(capsys)
    weights.unlink()
    assert cli.main([*base, "--model", str(broken)]) == 2
    assert f"model folder {broken} holds no weights" in _one_error_line(capsys)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"\x10" + bytes(7) + b"{")
    model = ["--model", str(tiny_model_dir)]
    assert cli.main([*base, *model, "--adapter", str(adapter)]) == 2
    assert "adapter_model.safetensors: truncated" in _one_error_line(capsys)


# ----------------------------------------------------------------------------- export


@pytest.fixture
def full_run(tmp_path):
    """A run dir holding full weights (a tiny Llama) and a byte-level BPE tokenizer."""
    from conftest import make_bpe_tokenizer, make_tiny_model

    tok = make_bpe_tokenizer("llama")
    run = tmp_path / "run"
    make_tiny_model(tok).save_pretrained(run)
    tok.save_pretrained(run)
    return run


def test_export_writes_a_gguf_and_a_modelfile(full_run, capsys):
    assert cli.main(["export", str(full_run), "--gguf", "q8_0"]) == 0
    gguf, modelfile = full_run / "run-q8_0.gguf", full_run / "run-q8_0.Modelfile"
    assert gguf.read_bytes()[:4] == b"GGUF" and modelfile.read_text().startswith("FROM ./run-q8_0")
    out = capsys.readouterr().out
    assert f"Wrote {gguf}" in out and "ollama create" in out
    assert cli.main(["export", str(full_run), "--gguf", "q8_0", "--overwrite"]) == 0


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--gguf", "q3_k"], "--gguf 'q3_k' is not a type this export writes; use one of f32, f16"),
        (["--gguf", "f16", "--out", "{run}/run-q8_0.gguf"], "already exist(s); pass --overwrite"),
    ],
)
def test_export_bad_input_one_line(full_run, capsys, flags, expected):
    assert cli.main(["export", str(full_run), "--gguf", "q8_0"]) == 0
    kept = (full_run / "run-q8_0.gguf").read_bytes()
    capsys.readouterr()
    flags = [f.replace("{run}", str(full_run)) for f in flags]
    assert cli.main(["export", str(full_run), *flags]) == 2
    assert expected in _one_error_line(capsys)
    assert (full_run / "run-q8_0.gguf").read_bytes() == kept


def test_export_of_a_dir_without_weights(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path), "--gguf", "f16"]) == 2
    assert "holds no adapter and no full model" in _one_error_line(capsys)


@pytest.mark.parametrize(
    "flags",
    [
        ["--overwrite_output_dir"],
        ["--overwrite_output_dir", "true"],
        ["--overwrite_output_dir=true"],
        ["--overwrite_output_dir", "True", "--resume_from_checkpoint", "false"],
    ],
)
def test_the_resume_command_drops_overwrite_and_its_value(flags):
    command = cli.resume_command(["r.yaml", *flags, "--max_steps", "8"])
    assert command == "grpo-plugin train r.yaml --max_steps 8 --resume_from_checkpoint true"


@pytest.mark.parametrize(
    "flags", [["--hub_token", "hf_S3CRET"], ["--hub_token=hf_S3CRET"], ["--hub-token", "hf_S3CRET"]]
)
def test_the_printed_resume_and_restart_lines_never_repeat_the_hub_token(flags, tmp_path):
    argv = ["r.yaml", *flags, "--max_steps", "8"]
    for line in (cli.resume_command(argv), cli.aborted_line(argv, str(tmp_path))):
        assert "hf_S3CRET" not in line
        assert "--max_steps 8" in line and "left out: pass it again or set HF_TOKEN" in line
    command = cli.resume_command(argv).split("  #")[0]  # what a shell runs of the pasted line
    assert command == "grpo-plugin train r.yaml --max_steps 8 --resume_from_checkpoint true"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [  # issue 45: each ended in a traceback (or, --batch-size 0, ran) once the model had loaded
        (["--eval-size", "0"], "--eval-size=0 must be >= 1"),
        (["--k", "-3"], "--k=-3 must be an integer >= 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens=0 must be an integer >= 1"),
        (["--batch-size", "0"], "--batch-size=0 must be an integer >= 1"),
        (["--tool", "python", "--tool-timeout", "-1"], "tool_timeout=-1.0 must be > 0 seconds"),
    ],
)
def test_eval_refuses_bad_options_before_loading(
    tiny_model_dir, capsys, no_model_load, flags, expected
):
    base = ["eval", "--model", str(tiny_model_dir), "--dataset", "arithmetic"]
    assert cli.main([*base, "--reward", "last_integer", *flags]) == 2
    assert expected in _one_error_line(capsys)
