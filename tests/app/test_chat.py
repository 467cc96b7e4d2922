"""`grpo-plugin chat` and `generate`: the base with the run's adapter (or a full fine-tune), the
run's chat template, system prompt and sampling settings; bad input in one line before any model
loads; the conversation loop, piped and interactive."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import held_lock, make_tiny_model, make_tiny_tokenizer

from grpo_plugin import cli
from grpo_plugin.app import chat as chat_app
from grpo_plugin.app.chat import ChatOptions, converse, one_line_answer, open_chat, run_sampling
from grpo_plugin.app.recipe import RecipeError
from grpo_plugin.run import rundir

SYSTEM = "You add numbers."


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny model with logits that vary (greedy answers differ between models)."""
    path = tmp_path_factory.mktemp("base")
    tok = make_tiny_tokenizer()
    make_tiny_model(tok, initializer_range=0.5).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _run_info(base: Path, **sampling) -> dict:
    return {"base_model": str(base), "base_model_path": str(base), "adapter": True,
            "max_completion_length": 6, "temperature": 0.9, "reward_funcs": [],
            "sampling": {"temperature": 0.9, "top_p": 1.0, "top_k": None, "min_p": None,
                         "repetition_penalty": 1.0, "max_completion_length": 6,
                         "chat_template_kwargs": None, **sampling}}  # fmt: skip


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory, base_dir) -> Path:
    """A run dir as training leaves it: a LoRA adapter (non-zero), the tokenizer, grpo_run.json and
    one logged completions table whose prompts carry a system message."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(r=4, lora_alpha=64, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(run)
    make_tiny_tokenizer().save_pretrained(run)
    (run / rundir.RUN_INFO_FILE).write_text(json.dumps(_run_info(base_dir)))
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 1 + 2?"}]
    records = {"step": [0], "prompt": [prompt], "completion": ["3"], "reward": [1.0],
               "advantage": [0.0]}  # fmt: skip
    rundir.write_completions_parquet(rundir.completions_file(run, 0), records)
    return run


def reference_answer(model, tokenizer, messages, max_new_tokens: int = 6) -> str:
    """Greedy decoding with transformers' own generate, on the chat template: what the run's model
    says, computed independently of grpo-plugin's sampler."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_generate_is_the_base_with_the_adapter_greedy_on_the_chat_template(adapter_run, base_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    question = "What is 17 + 25?"
    chat = open_chat(adapter_run, ChatOptions())
    assert chat.system == SYSTEM  # the run's training system prompt, read from its completions
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    tokenizer = make_tiny_tokenizer()
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    with_adapter = PeftModel.from_pretrained(base, adapter_run).eval()
    expected = reference_answer(with_adapter, tokenizer, messages)
    assert chat.answer(question) == expected
    with with_adapter.disable_adapter():
        base_only = reference_answer(with_adapter, tokenizer, messages)
    assert base_only != expected  # the adapter changes the answer: it was applied


def test_a_full_fine_tune_answers_too_and_the_system_prompt_can_be_dropped(tmp_path, base_dir):
    run = tmp_path / "full"
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, seed=3, initializer_range=0.5)
    model.save_pretrained(run)
    tokenizer.save_pretrained(run)
    chat = open_chat(run, ChatOptions(system="", max_new_tokens=5))
    assert chat.system is None and chat.settings.sampling.max_new_tokens == 5
    expected = reference_answer(model.eval(), tokenizer, [{"role": "user", "content": "Hi"}], 5)
    assert chat.answer("Hi") == expected


def test_a_run_trained_on_plain_text_gets_plain_text(tmp_path):
    """The tokenizer has a chat template, but the run's logged prompts were plain strings (even
    one that parses as JSON): the question goes in as text, as in training."""
    run = tmp_path / "plain"
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, seed=4, initializer_range=0.5)
    model.save_pretrained(run)
    tokenizer.save_pretrained(run)
    records = {"step": [0], "prompt": ["[1, 2]"], "completion": ["3"], "reward": [1.0],
               "advantage": [0.0]}  # fmt: skip
    rundir.write_completions_parquet(rundir.completions_file(run, 0), records)
    chat = open_chat(run, ChatOptions(max_new_tokens=5))
    assert not chat.uses_chat and chat.system is None
    ids = tokenizer("2 + 2 =", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.eval().generate(ids, max_new_tokens=5, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    assert chat.answer("2 + 2 =") == tokenizer.decode(
        out[0, ids.shape[1] :], skip_special_tokens=True
    )


def test_sampling_is_greedy_by_default_and_the_runs_own_with_sample(base_dir):
    info = _run_info(base_dir, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05)
    greedy = run_sampling(info, ChatOptions())
    assert greedy.temperature == 0.0 and greedy.max_new_tokens == 6
    sampled = run_sampling(info, ChatOptions(sample=True, max_new_tokens=9))
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.min_p) == (0.7, 0.9, 5, 0.05)
    assert sampled.max_new_tokens == 9
    older = {"temperature": 1.2, "max_completion_length": 7}  # a run from before `sampling`
    assert run_sampling(older, ChatOptions(sample=True)).temperature == 1.2
    for bad in (0, -1):  # refused, not silently replaced by the run's length
        with pytest.raises(RecipeError, match="max_new_tokens must be >= 1"):
            run_sampling(info, ChatOptions(max_new_tokens=bad))


def test_sampled_answers_follow_the_seed(adapter_run):
    first = open_chat(adapter_run, ChatOptions(sample=True, seed=5)).answer("What is 2 + 2?")
    again = open_chat(adapter_run, ChatOptions(sample=True, seed=5)).answer("What is 2 + 2?")
    assert first == again


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def no_model_load(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded: the run dir should have been refused")

    monkeypatch.setattr("grpo_plugin.publish.weights.trained_policy", boom)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("command", [["chat"], ["generate", "QUESTION", "What is 1 + 1?"]])
def test_bad_run_dirs_get_one_line_before_any_model_loads(
    tmp_path, capsys, no_model_load, adapter_run, command
):
    def run(path: Path) -> int:
        args = [command[0], str(path), *command[2:]]
        return cli.main(args)

    if command[0] == "generate":
        assert cli.main(["generate", str(adapter_run), "  "]) == 2
        assert "PROMPT is empty" in _one_error_line(capsys)
    assert run(tmp_path / "missing") == 2
    assert f"run dir {tmp_path / 'missing'} does not exist" in _one_error_line(capsys)
    empty = tmp_path / "no-weights"  # a run killed before it saved: metrics, no adapter
    empty.mkdir()
    (empty / rundir.METRICS_FILE).write_text('{"step": 1, "reward": 0.5}\n')
    assert run(empty) == 2
    assert "holds no adapter and no full model" in _one_error_line(capsys)
    moved = tmp_path / "moved-base"  # the adapter's base is gone
    moved.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (moved / name).write_bytes((adapter_run / name).read_bytes())
    info = _run_info(tmp_path / "gone")
    (moved / rundir.RUN_INFO_FILE).write_text(json.dumps(info))
    assert run(moved) == 2
    assert f"model path {tmp_path / 'gone'} does not exist" in _one_error_line(capsys)
    cut = tmp_path / "cut-adapter"  # issue 56: a truncated copy of the weights
    cut.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", rundir.RUN_INFO_FILE):
        (cut / name).write_bytes((adapter_run / name).read_bytes())
    weights = (adapter_run / "adapter_model.safetensors").read_bytes()
    (cut / "adapter_model.safetensors").write_bytes(weights[:-50])
    assert run(cut) == 2
    assert f"{cut / 'adapter_model.safetensors'}: truncated (" in _one_error_line(capsys)


def test_a_run_still_training_is_refused_and_its_newest_checkpoint_named(
    tmp_path, capsys, no_model_load, adapter_run
):
    run = tmp_path / "training"
    checkpoint = run / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (checkpoint / name).write_bytes((adapter_run / name).read_bytes())
    with held_lock(run) as pid:
        assert cli.main(["chat", str(run)]) == 2
        line = _one_error_line(capsys)
    assert f"run dir {run} is still training (pid {pid} on here" in line
    assert f"use its newest checkpoint: grpo-plugin chat {checkpoint}" in line


# ----------------------------------------------------------------------------- the loop


class EchoChat:
    """A stand-in for RunChat: replies with what it was asked and how many turns it saw."""

    context = None

    def __init__(self):
        self.seen: list[list[dict]] = []

    def fit(self, messages):
        return messages

    def messages(self, question):
        return [{"role": "system", "content": "S"}, {"role": "user", "content": question}]

    def reply(self, messages):
        self.seen.append(list(messages))
        return f"{messages[-1]['content']} ({len(messages)} messages)"

    def answer(self, question):
        return self.reply(self.messages(question)) + "\nsecond line"


def test_piped_one_output_line_per_input_line():
    written: list[str] = []
    count = converse(EchoChat(), ["q1\n", "\n", "q2\n"], written.append, interactive=False)
    assert count == 2
    assert written == ["q1 (2 messages)\\nsecond line", "", "q2 (2 messages)\\nsecond line"]
    assert one_line_answer("a\r\nb\nc") == "a\\nb\\nc"


def test_interactive_keeps_the_conversation_until_reset_and_exit():
    chat, written = EchoChat(), []
    lines = ["hello", "again", "/reset", "fresh", "/exit", "never"]
    assert converse(chat, lines, written.append, interactive=True) == 3
    assert written == ["hello (2 messages)", "again (4 messages)", "(a new conversation)",
                       "fresh (2 messages)"]  # fmt: skip
    assert chat.seen[1][0] == {"role": "system", "content": "S"}  # the system prompt stays first


def test_chat_piped_through_the_cli(adapter_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is 1 + 2?\n\nWhat is 3 + 4?\n"))
    assert cli.main(["chat", str(adapter_run)]) == 0
    out = capsys.readouterr().out.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # 3 answers, one per input line
    expected = open_chat(adapter_run, ChatOptions()).answer("What is 3 + 4?")
    assert out[2] == one_line_answer(expected)


def test_example_question_for_the_summary():
    assert chat_app.example_question(
        [{"prompt": [{"role": "user", "content": "What is 3 + 5?"}]}]
    ) == ("What is 3 + 5?")
    assert chat_app.example_question([{"prompt": "2 + 2 ="}]) == "2 + 2 ="
    assert chat_app.example_question(None) is None


# ----------------------------------------------------------------------------- the context

CONTEXT = 64  # tokens; the tiny tokenizer's is one per character (ChatML markers: one each)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> Path:
    """A full fine-tune whose model's context is 64 tokens."""
    run = tmp_path_factory.mktemp("short-context")
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, seed=5, initializer_range=0.5)
    model.config.max_position_embeddings = CONTEXT
    model.save_pretrained(run)
    tokenizer.save_pretrained(run)
    return run


def _tokens(messages) -> int:
    tokenizer = make_tiny_tokenizer()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_generate_refuses_a_prompt_longer_than_the_context(short_run, capsys):
    """Issue 56: the prompt's first tokens (the template's start with them) were cut silently."""
    question = "What is 1234 + 5678, and then times 3, minus 2?"
    n = _tokens([{"role": "user", "content": question}])
    assert n > CONTEXT - 6
    assert cli.main(["generate", str(short_run), question, "--max-new-tokens", "6"]) == 2
    assert _one_error_line(capsys) == (
        f"error: the prompt is {n} tokens, and the model's context of {CONTEXT} leaves "
        f"{CONTEXT - 6} beside max_new_tokens=6; shorten it, or lower --max-new-tokens"
    )
    assert cli.main(["generate", str(short_run), "What is 1 + 2?", "--max-new-tokens", "6"]) == 0
    with pytest.raises(RecipeError, match="max_new_tokens=64 leaves no room for a prompt"):
        open_chat(short_run, ChatOptions(max_new_tokens=CONTEXT))


def test_a_conversation_past_the_context_leaves_out_its_oldest_turns(short_run):
    chat = open_chat(short_run, ChatOptions(system="S", max_new_tokens=6))
    seen: list[list[dict]] = []
    reply = chat.reply
    chat.reply = lambda messages: seen.append(messages) or reply(messages)
    written: list[str] = []
    lines = ["What is 10 + 1?", "What is 20 + 2?", "What is 30 + 3?", "x" * 60, "/reset", "Hi"]
    assert converse(chat, lines, written.append, interactive=True) == 4
    notices = [w for w in written if w.startswith("(the conversation no longer fits")]
    assert notices == [
        f"(the conversation no longer fits the model's context of {CONTEXT} tokens: its oldest "
        "turns are left out from here on)"
    ]  # said once, at the second turn
    assert written.index(notices[0]) == 1
    assert [m[-1]["content"] for m in seen] == [*lines[:3], "Hi"]  # the long one is not sent
    for messages in seen:
        assert messages[0] == {"role": "system", "content": "S"}  # the system prompt stays
        assert _tokens(messages) <= CONTEXT - 6
    assert len(seen[1]) == 2  # the first turn left out: system + the new question
    too_long = _tokens([{"role": "system", "content": "S"}, {"role": "user", "content": "x" * 60}])
    assert f"error: the prompt is {too_long} tokens" in written[-3]
    assert written[-2] == "(a new conversation)"


def test_piped_a_line_too_long_gets_an_empty_line_and_a_warning(short_run, caplog):
    chat = open_chat(short_run, ChatOptions(max_new_tokens=6))
    written: list[str] = []
    with caplog.at_level("WARNING", logger="grpo_plugin.app.chat"):
        assert converse(chat, ["What is 1?", "y" * 60, "What is 2?"], written.append, False) == 2
    assert len(written) == 3 and written[1] == "" and written[0] and written[2]
    n = _tokens([{"role": "user", "content": "y" * 60}])
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("line")] == [
        f"line 2 not answered: the prompt is {n} tokens, and the model's context of {CONTEXT} "
        f"leaves {CONTEXT - 6} beside max_new_tokens=6; shorten it, or lower --max-new-tokens"
    ]
