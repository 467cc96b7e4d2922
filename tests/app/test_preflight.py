"""Every bad input a recipe can hold gets one line on stderr and exit code 2, in `--dry-run`
too, so before any model loads: learning rates, model sources, output dirs, data lines, prompts,
prompt lengths, resume targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo_plugin import cli
from grpo_plugin.training import inputs

RECIPE = (
    "model: {model}\n"
    "dataset: {{path: {data}}}\n"
    "reward_funcs: [last_integer]\n"
    "num_generations: 4\nper_device_train_batch_size: 8\nmax_steps: 1\nmax_completion_length: 8\n"
    "output_dir: {out}\n"
)
ROWS = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(8)]


@pytest.fixture
def make(tmp_path, tiny_model_dir):
    """make(rows=..., lines=..., **recipe_overrides) -> the recipe's path."""

    def build(rows=ROWS, lines=None, model=None, out=None):
        data = tmp_path / "data.jsonl"
        data.write_text("\n".join(lines or [json.dumps(r) for r in rows]) + "\n")
        path = tmp_path / "recipe.yaml"
        text = RECIPE.format(model=model or tiny_model_dir, data=data, out=out or tmp_path / "out")
        path.write_text(text)
        return str(path)

    return build


def dry_run(capsys, recipe: str, *flags: str) -> str:
    code = cli.main(["train", recipe, *flags, "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_the_good_recipe_passes(make, capsys):
    assert cli.main(["train", make(), "--dry-run"]) == 0
    assert ": OK (" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--learning_rate", "0"], "learning_rate=0.0 must be a positive finite number"),
        (["--learning_rate=-1e-4"], "learning_rate=-0.0001 must be a positive finite number"),
        (["--learning_rate", "-1e-4"], "learning_rate=-0.0001 must be a positive finite number"),
        (["--learning_rate", "nan"], "learning_rate=nan must be a finite number"),
        (["--resume_from_checkpoint", "true"], "has no complete checkpoint-N folder"),
        (["--reward_timeout", "0"], "reward_timeout=0.0 must be > 0 seconds, or None"),
    ],
)
def test_bad_numbers_and_resume_targets(make, capsys, flags, expected):
    assert expected in dry_run(capsys, make(), *flags)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("./no/such/model", "model path ./no/such/model does not exist"),
        ("not a valid id!", "is neither a local directory nor a valid Hub id"),
        ("someone/not-in-any-cache", "not in the Hugging Face cache, and the Hub is offline"),
    ],
)
def test_model_sources_that_cannot_load(make, capsys, monkeypatch, model, expected):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert expected in dry_run(capsys, make(model=model))


def test_a_model_folder_without_config(make, capsys, tmp_path):
    (tmp_path / "empty-model").mkdir()
    assert "has no config.json" in dry_run(capsys, make(model=tmp_path / "empty-model"))


def test_output_dirs_that_cannot_take_a_run(make, capsys, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("x")
    assert "is a file, not a directory" in dry_run(capsys, make(out=tmp_path / "a-file"))
    assert "is not writable" in dry_run(capsys, make(out=Path("/proc/grpo-plugin-out")))
    full = shutil.disk_usage(tmp_path)._replace(free=10 * 2**20)
    monkeypatch.setattr(inputs.shutil, "disk_usage", lambda path: full)
    assert "nearly full device (10 MB free" in dry_run(capsys, make())


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [*ROWS[:3], {"prompt": 5, "answer": "0"}],
            "the training data row 3: the prompt is an int (5)",
        ),
        ([{"prompt": "  ", "answer": "0"}, *ROWS], "row 0: the prompt is an empty string"),
        (
            [*ROWS, {"prompt": [{"role": "user"}], "answer": "0"}],
            "row 8: the prompt has a message that is not {'role': ..., 'content': ...}",
        ),
    ],
)
def test_unusable_prompts_are_named_by_row(make, capsys, rows, expected):
    assert expected in dry_run(capsys, make(rows=rows))


def test_a_malformed_data_line_is_named_by_file_and_line(make, capsys, tmp_path):
    lines = [json.dumps(r) for r in ROWS[:2]] + ['{"prompt": "3+3=" "answer": "6"}']
    message = dry_run(capsys, make(lines=lines))
    assert message == (
        f"error: {tmp_path / 'data.jsonl'}:3: not valid JSON (Expecting ',' delimiter at column "
        "19); fix or delete that line."
    )


def test_prompts_longer_than_the_context(make, capsys, caplog):
    long = [*ROWS, {"prompt": "1" * 600, "answer": "1"}]  # 600 tokens; the tiny model has 512
    message = dry_run(capsys, make(rows=long))
    assert "1 of 9 prompts in the training data are longer than the 504 tokens" in message
    assert "(longest: 600 tokens); set max_prompt_length" in message
    assert cli.main(["train", make(rows=long), "--max_prompt_length", "64", "--dry-run"]) == 0
    assert "1 of 9 prompts in the training data are longer than max_prompt_length=64" in caplog.text
    too_much = dry_run(capsys, make(), "--max_prompt_length", "510")
    assert (
        "max_prompt_length=510 + max_completion_length=8 exceed the model's context of 512"
        in too_much
    )


def test_the_trainer_names_bad_prompts_too(tiny_tokenizer, tmp_path):
    from conftest import frac_sevens, tiny_config

    from grpo_plugin import GRPOTrainer

    with pytest.raises(ValueError, match="train_dataset row 1: the prompt is a NoneType"):
        GRPOTrainer("no/such-model", frac_sevens, args=tiny_config(tmp_path),
                    train_dataset=[{"prompt": "1+1="}, {"prompt": None}])  # fmt: skip


def test_a_recipes_prompts_are_checked_and_tokenized_once(tiny_model_dir, tmp_path, monkeypatch):
    """The recipe checker checks and tokenizes the prompts; the trainer it hands the same datasets
    to does neither again (`inputs._SEEN`)."""
    from grpo_plugin.app import pipeline
    from grpo_plugin.app.preflight import prepare_run
    from grpo_plugin.app.recipe import load_recipe
    from grpo_plugin.app.recipe_checks import check_recipe

    walked, encoded = [], []
    real_problem, real_encode = inputs.prompt_problem, inputs.encode_prompts
    monkeypatch.setattr(inputs, "prompt_problem", lambda p: walked.append(p) or real_problem(p))

    def counting_encode(tokenizer, prompts, **kwargs):
        encoded.extend(prompts)
        return real_encode(tokenizer, prompts, **kwargs)

    monkeypatch.setattr(inputs, "encode_prompts", counting_encode)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"model: {tiny_model_dir}\n"
        "dataset: {name: arithmetic, train_size: 12, eval_size: 5}\n"
        "reward_funcs: [last_integer]\nnum_generations: 4\nper_device_train_batch_size: 8\n"
        f"max_steps: 1\nmax_completion_length: 8\nsave_strategy: 'no'\noutput_dir: {tmp_path}/o\n"
    )
    recipe = load_recipe(path)
    rewards = check_recipe(recipe)
    data = prepare_run(recipe, rewards)
    assert (len(walked), len(encoded)) == (12 + 5, 12 + 5)  # train and held-out, once each
    trainer = pipeline._build_trainer(recipe, rewards, data)
    assert trainer.train_dataset is data.train
    assert (len(walked), len(encoded)) == (17, 17)  # the trainer checked nothing twice


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"model: [unclosed\n  - x: {", ": invalid YAML: while parsing a flow sequence"),
        (b"- a\n- b\n", ": a recipe must be a mapping of keys to values, got list"),
        (b"\x00\xff\xfe", ": not a UTF-8 text file (invalid start byte at byte 1)"),
    ],
)
def test_a_recipe_file_that_is_not_a_recipe(tmp_path, capsys, content, expected):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    assert expected in dry_run(capsys, str(path))


def test_a_directory_in_use_is_named_first_even_when_it_holds_a_run(make, capsys, tmp_path):
    """A live lock beats "already holds a run; resume it": resuming a run that is running would
    fail anyway, so the first message names the holder."""
    import subprocess
    import sys

    from grpo_plugin.run import lock as run_lock

    out = tmp_path / "out"
    (out / "completions").mkdir(parents=True)  # the running run's files
    (out / "metrics.jsonl").write_text("{}\n")
    hold = (
        "import fcntl, json, os, time\n"
        f"fd = os.open({str(out / run_lock.LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': 'h', 'started': 'now'}).encode())\n"
        "print('held', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert f"is in use by another run (pid {proc.pid} on h" in dry_run(capsys, make(out=out))
    finally:
        proc.kill()
        proc.wait()


def test_a_symlinked_checkpoint_is_refused_by_dry_run_and_nothing_is_deleted(
    make, capsys, tmp_path
):
    """Issue 56: --dry-run said OK; the run then deleted the README, the adapter and three
    checkpoints before `Cannot call rmtree on a symbolic link`, and every retry did the same."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (out / "checkpoint-11").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    elsewhere.mkdir()
    (out / "checkpoint-12").symlink_to(elsewhere, target_is_directory=True)
    before = sorted(p.name for p in out.iterdir())
    for flags in (["--overwrite_output_dir"], ["--overwrite_output_dir", "--dry-run"]):
        assert cli.main(["train", make(out=out), *flags]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"error: output_dir {out} holds checkpoint-12, a symbolic link (to {elsewhere}): a "
            "run folder holds only its own files, and a run moves or deletes its entries; "
            f"nothing was changed. Remove the link (rm {out / 'checkpoint-12'}; what it points "
            "to is not touched), or choose another output_dir."
        )
    assert sorted(p.name for p in out.iterdir()) == before and elsewhere.is_dir()


# issue 45: each of these passed `--dry-run` ("OK"), then the real run ended in a traceback (or,
# for NaN reward weights, trained nothing and exited 0)
LATE_FAILURES = [
    (["--reward_weights", "nan"], "reward_weights[0]=nan must be a finite number"),
    (["--reward_weights", "inf"], "reward_weights[0]=inf must be a finite number"),
    (["--reward_weights", "0"], "reward_weights=[0.0] are all 0"),
    (["--load_in_4bit", "true", "--lora.r", "4", "--rollout_precision", "bf16"],
     "rollout_precision='bf16' with a quantized base"),
    (["--lora.r", "4", "--lora.use_dora", "true", "--rollout_precision", "bf16"],
     "rollout_precision='bf16' with a LoRA variant (use_dora)"),
    (["--lora.r", "4", "--lora.use_dora", "true", "--rollout_precision", "fp16"],
     "rollout_precision='fp16' with a LoRA variant (use_dora)"),
    (["--model_init_kwargs", '{"dtype": "bfloat16"}', "--rollout_precision", "bf16"],
     "rollout_precision='bf16' with the policy loaded in bfloat16"),
    (["--model_init_kwargs", '{"dtype": "bfloat61"}'], "dtype='bfloat61' is not a torch dtype"),
    (["--lora.r", "0"], "lora: r=0 must be a positive integer"),
    (["--lora.r", "4", "--lora.lora_alpha", "0"], "lora: lora_alpha=0 scales every adapter"),
    (["--dataset.train_size", "0"], "dataset: train_size=0 leaves no prompts to train on"),
    (["--dataset.train_size", "1"], "the training data has 1 prompts but one rollout needs 2"),
    (["--eval.k", "-1"], "eval.k=-1 must be an integer >= 0"),
    (["--eval.max_new_tokens", "0"], "eval.max_new_tokens=0 must be an integer >= 1"),
    (["--eval.reward", "no_such_reward"], "unknown reward 'no_such_reward'"),
    (["--model", "embedded:nosuch"], "Unknown embedded model 'embedded:nosuch'"),
    # found by trying more (issue 45's "look for more such fields")
    (["--lora.r", "4", "--beta", "0.04", "--sync_ref_model", "true"],
     "sync_ref_model=True needs a separate reference model"),
    (["--router_aux_loss_coef", "0.5"], "router_aux_loss_coef=0.5 is set but this llama model"),
    (["--lora.r", "4", "--lora.target_modules", "[nosuch]"],
     "lora: target_modules=['nosuch'] match no module of this llama model"),
    (["--lora.r", "4", "--lora.bias", "nosuch"], "lora: bias='nosuch' is not supported"),
    (["--lora.r", "4", "--lora.target_modules", "[q_proj, lm_head]", "--cast_lm_head_to_fp32",
      "true"], "cast_lm_head_to_fp32=True is not supported with a LoRA adapter on lm_head"),
    (["--seed", "-1"], "seed=-1 must be in [0, 2**32 - 1]"),
    # issue 56: peft's raw TypeError ("unexpected keyword argument 'rr'")
    (["--lora.rr", "8"], "unknown lora key 'rr'; did you mean 'r'?"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size=0 must be >= 1"),
    (["--max_prompt_length", "0"], "max_prompt_length=0 must be >= 1"),
    (["--output_dir", ""], "output_dir is empty"),
    (["--model_init_kwargs", '{"attn_implementation": "nosuch"}'],
     "model_init_kwargs ['attn_implementation']: Specified `attn_implementation=\"nosuch\"`"),
    (["--model_init_kwargs", '{"foo": 1}'], "unexpected keyword argument 'foo'"),
    (["--lora.r", "4", "--lora.init_lora_weights", "nosuch"], "init_lora_weights='nosuch'"),
    (["--reward_funcs", "{name: x, params: {a: ]"], "reward_funcs entry '{name: x, params: {a: ]'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "expected"), LATE_FAILURES, ids=[" ".join(flags) for flags, _ in LATE_FAILURES]
)
def test_what_failed_only_in_the_real_run_fails_in_dry_run_and_before_the_model_loads(
    make, capsys, monkeypatch, flags, expected
):
    assert expected in dry_run(capsys, make(), *flags)

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the recipe was refused")

    monkeypatch.setattr("grpo_plugin.models.policy.load_model", no_load)
    assert cli.main(["train", make(), *flags]) == 2  # the real run: the same line, no model
    assert expected in capsys.readouterr().err


BF16_TRAINING_REFUSED = [
    ([], "train_precision='bf16' without a LoRA adapter"),
    (["--lora.r", "4", "--lora.lora_dropout", "0.1"], "with lora_dropout > 0 or a LoRA variant"),
    (["--lora.r", "4", "--load_in_4bit", "true"], "train_precision='bf16' with a quantized base"),
    (["--lora.r", "4", "--bf16", "true"], "train_precision='bf16' with bf16=True: autocast"),
    (["--lora.r", "4", "--gradient_checkpointing", "true"], "with gradient_checkpointing=True"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "expected"), BF16_TRAINING_REFUSED)
def test_bf16_training_the_run_cannot_take_fails_in_dry_run_and_before_the_model_loads(
    make, capsys, monkeypatch, flags, expected
):
    monkeypatch.setattr("grpo_plugin.config.field_checks.cpu_has_bf16_units", lambda: True)
    flags = ["--train_precision", "bf16", *flags]
    assert expected in dry_run(capsys, make(), *flags)
    monkeypatch.setattr("grpo_plugin.models.policy.load_model", _no_load)
    assert cli.main(["train", make(), *flags]) == 2
    assert expected in capsys.readouterr().err
    plain_lora = ["--train_precision", "bf16", "--lora.r", "4", "--dry-run"]
    assert cli.main(["train", make(), *plain_lora]) == 0
    assert ": OK (" in capsys.readouterr().out  # a plain LoRA passes


def _no_load(*args, **kwargs):
    raise AssertionError("a model was loaded before the recipe was refused")


def test_a_hub_model_without_network_is_one_line_at_once(make, capsys, monkeypatch):
    # transformers retried the Hub for about a minute, then raised OSError (a traceback)
    from grpo_plugin.models import hub_access

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub_access, "_unresolved_host", lambda: "huggingface.co")
    message = dry_run(capsys, make(model="someone/not-in-any-cache"))
    assert "not in the Hugging Face cache, and the Hub cannot be reached" in message
    assert "huggingface.co does not resolve" in message


def test_a_model_folder_whose_tokenizer_cannot_be_read(make, capsys, tmp_path, tiny_model_dir):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, folder / name)
    message = dry_run(capsys, make(model=folder))
    assert f"model {folder}: its tokenizer and config cannot be read" in message


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_model_folder_whose_weights_are_missing_or_cut(
    make, capsys, monkeypatch, tmp_path, tiny_model_dir, damage
):
    """Issue 56: --dry-run passed, then the load failed in a 14-frame traceback."""
    folder = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, folder)
    weights = folder / "model.safetensors"
    if damage == "missing":
        weights.unlink()
        expected = f"model folder {folder} holds no weights (model.safetensors"
    else:
        weights.write_bytes(weights.read_bytes()[:-100])
        expected = f"{weights}: truncated ("
    assert expected in dry_run(capsys, make(model=folder))
    monkeypatch.setattr("grpo_plugin.models.policy.load_model", _no_load)
    assert cli.main(["train", make(model=folder)]) == 2  # the real run: the same line, no model
    assert expected in capsys.readouterr().err


def _no_load(*args, **kwargs):
    raise AssertionError("a model was loaded before the recipe was refused")
