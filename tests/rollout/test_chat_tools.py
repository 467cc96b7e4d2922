"""The ChatML tool template, its parser, and which template a tokenizer gets."""

from __future__ import annotations

import copy
import logging

import pytest

from grpo_plugin.rollout.chat_tools import (
    CHATML_TOOL_TEMPLATE,
    assistant_message,
    parse_tool_calls,
    resolve_tool_format,
)
from grpo_plugin.rollout.types import ToolCall

SCHEMA = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}
# A template that renders tools itself, in the same <tool_call> JSON form (as Qwen2.5's does).
OWN_TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if tools and loop.first %}TOOLS {{ tools | tojson }}\n{% endif %}{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_parse_reads_calls_and_the_content_around_them():
    text = 'Let me compute.\n<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute."
    assert calls == [ToolCall("multiply", {"a": 2, "b": 3})]
    two = (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}</tool_call>'
    )
    assert [c.name for c in parse_tool_calls(two)[1]] == ["f", "g"]
    assert parse_tool_calls("No call here.") == ("No call here.", [])


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "f", "arguments": {"a": 1,}}', "the tool call is not valid JSON"),
        ('{"arguments": {}}', 'a tool call needs a "name" string'),
        ('{"name": "f", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
    ],
)
def test_unreadable_calls_carry_the_reason(body, error):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")[1]
    assert call.error.startswith(error)


def test_lenient_forms_a_small_model_writes():
    unclosed = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}')[1]
    assert unclosed == [ToolCall("f", {"x": 1})]  # the turn ended before </tool_call>
    as_string = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert as_string[1] == [ToolCall("f", {"x": 1})]
    parameters = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>')
    assert parameters[1] == [ToolCall("f", {"x": 1})]


def test_the_chatml_template_renders_tools_calls_and_results(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "Multiply 2 and 3"},
        assistant_message("", [ToolCall("multiply", {"a": 2, "b": 3})]),
        {"role": "tool", "name": "multiply", "content": "6"},
        {"role": "assistant", "content": "It is 6."},
    ]
    text = tiny_tokenizer.apply_chat_template(
        messages, tools=[SCHEMA], chat_template=CHATML_TOOL_TEMPLATE, tokenize=False
    )
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert '<tools>\n{"type": "function", "function": {"name": "multiply"' in system
    assert rest == (
        "<|im_start|>user\nMultiply 2 and 3<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}'
        "</tool_call><|im_end|>\n<|im_start|>tool\n6<|im_end|>\n"
        "<|im_start|>assistant\nIt is 6.<|im_end|>\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, *messages[:1]]
    text = tiny_tokenizer.apply_chat_template(own_system, chat_template=CHATML_TOOL_TEMPLATE,
                                              tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nMultiply 2 and 3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_suffix_is_what_follows_the_models_end_of_turn(tiny_tokenizer):
    fmt = resolve_tool_format(tiny_tokenizer, "chatml")
    results = [{"role": "tool", "name": "multiply", "content": "6"},
               {"role": "tool", "name": "multiply", "content": "8"}]  # fmt: skip
    suffix = tiny_tokenizer.decode(fmt.suffix_ids(tiny_tokenizer, results))
    assert suffix == (
        "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>tool\n8<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.stop_token_ids(tiny_tokenizer) == [
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]


def test_which_template_a_tokenizer_gets(tiny_tokenizer):
    assert resolve_tool_format(tiny_tokenizer).name == "chatml"  # ChatML without tools: ours
    own = copy.deepcopy(tiny_tokenizer)
    own.chat_template = OWN_TOOL_TEMPLATE
    fmt = resolve_tool_format(own)
    assert fmt.name == "model" and fmt.template is None  # used as it is
    assert "TOOLS" in own.decode(
        fmt.render_prompt(own, [{"role": "user", "content": "x"}], [SCHEMA])
    )
    with pytest.raises(ValueError, match="tool_chat_template='model' but the tokenizer's chat"):
        resolve_tool_format(tiny_tokenizer, "model")
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="has no tool support and is not ChatML"):
        resolve_tool_format(other)
    unreadable = copy.deepcopy(tiny_tokenizer)
    unreadable.chat_template = OWN_TOOL_TEMPLATE.replace("<tool_call>", "[CALL]").replace(
        "</tool_call>", "[/CALL]"
    )
    with pytest.raises(ValueError, match="cannot read tool calls written by the model chat"):
        resolve_tool_format(unreadable)


# ----------------------------------------------------------------------------- real templates
# TRL 1.16's own templates (trl/chat_templates/), on tiny tokenizers (`template_tokenizers.py`).
# Not here: glm4moe (refused: no end-of-turn token, a turn ends when the model opens the next),
# gemma4* (its end of turn, <turn|>, is not in END_OF_TURN_TOKENS: refused here, with the tiny
# tokenizer's EOS; no training version in TRL either),
# deepseekv3,
# diffusion_gemma, muse_glimmer (no TRL response template: their calls are refused), and the
# templates without tool support (cohere*, gemma, gemma3, idefics3, lfm2, llama3, llava_next,
# phi3*, qwen2_5_vl, smolvlm, deepseek_r1_distill).
FAMILIES = [
    "qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_vl", "qwen3_5_think", "qwen3_5_nothink",
    "qwen3_6", "qwen3_8", "llama3_1", "llama3_2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2",
    "lfm2_2_5_vl", "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
    "nemotron_3_5_lightning", "gptoss",
]  # fmt: skip
# Nemotron 3 opens each assistant turn with "<think>\n" but re-renders a past turn's empty
# thinking as "<think></think>": its own full render of a finished exchange differs from what the
# model was shown (TRL 1.16's loop, which also appends the suffix to what was sampled, gives the
# same tokens as ours); the loop is checked, the equality is not.
REWRITES_PAST_TURNS = {"nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
                       "nemotron_3_5_lightning"}  # fmt: skip
ROWS = [{"prompt": [{"role": "user", "content": f"Multiply {a} and {b}"}]} for a, b in
        [(123, 45), (7, 8)]]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_a_models_own_template_runs_tools_and_the_exchange_is_its_full_render(family, caplog):
    from scripted_policy import multiply
    from template_tokenizers import family_policy, template_tokenizer, trl_template

    from grpo_plugin.rollout.multiturn import ToolSetup
    from grpo_plugin.rollout.prompts import sample_groups
    from grpo_plugin.rollout.tool_calls import Tool
    from grpo_plugin.rollout.types import GroupSampling, SamplingParams

    tok = template_tokenizer(family)
    with caplog.at_level(logging.INFO, logger="grpo_plugin.rollout.chat_tools"):
        fmt = resolve_tool_format(tok)  # "auto": not refused
    swapped = [r.message for r in caplog.records if "TRL's training version" in r.message]
    if family == "qwen3":  # the one whose template is not prefix-preserving: TRL's training one
        assert fmt.template == trl_template("qwen3_training") and len(swapped) == 1
    else:
        assert fmt.template is None and not swapped
    tool = Tool.of(multiply)
    setup = ToolSetup(format=fmt, tools=[tool])
    sampling = GroupSampling(SamplingParams(max_new_tokens=300, temperature=0.0), 2, tools=setup)
    rollout = sample_groups(family_policy(tok, fmt), tok, ROWS, sampling)
    batch = rollout.batch
    assert batch.tool_calls.tolist() == [1] * 4 and batch.tool_failures.tolist() == [0] * 4
    for r, (a, b) in enumerate([(123, 45), (123, 45), (7, 8), (7, 8)]):
        exchange = rollout.completions[r]
        assert [m["role"] for m in exchange] == ["assistant", "tool", "assistant"]
        assert exchange[0]["tool_calls"][0]["function"] == {
            "name": "multiply", "arguments": {"a": a, "b": b}
        }  # fmt: skip
        assert exchange[1]["content"] == str(a * b)
        assert exchange[2]["content"] == f"It is {a * b}."
        # the KV-cache continuation (prompt + sampled turns + suffixes) is the full re-render
        ours = batch.prompt_ids[r][batch.prompt_mask[r].bool()].tolist()
        ours += batch.completion_ids[r][batch.completion_mask[r].bool()].tolist()
        full = tok.apply_chat_template(
            rollout.prompts[r] + exchange, tools=[tool.schema], chat_template=fmt.template,
            tokenize=False,
        )  # fmt: skip
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        if family in REWRITES_PAST_TURNS:
            continue
        assert full_ids[: len(ours)] == ours
        assert tok.decode(full_ids[len(ours) :]).strip() == ""  # at most the closing newline


def test_a_template_that_is_not_prefix_preserving_and_unknown_to_trl_is_refused():
    from template_tokenizers import template_tokenizer

    tok = template_tokenizer("qwen3")
    tok.chat_template += "{#- a local edit: TRL no longer recognises the template #}"
    with pytest.raises(ValueError, match="not prefix-preserving\\) and TRL ships no training") as e:
        resolve_tool_format(tok)
    assert "tool_chat_template='chatml'" in str(e.value) and "\n" not in str(e.value)


def test_calls_are_read_with_trls_response_template_where_it_has_one():
    from template_tokenizers import template_tokenizer

    tok = template_tokenizer("llama3_2")
    fmt = resolve_tool_format(tok)
    assert fmt.response_template is not None and tok.response_template is None  # left as it is
    ids = tok(
        '{"name": "multiply", "parameters": {"a": 2, "b": 3}}<|eot_id|>', add_special_tokens=False
    )["input_ids"]
    assert fmt.parse(tok, ids) == ("", [ToolCall("multiply", {"a": 2, "b": 3})])
    ids = tok("The answer is 6.<|eot_id|>", add_special_tokens=False)["input_ids"]
    assert fmt.parse(tok, ids) == ("The answer is 6.", [])
    qwen = template_tokenizer("qwen2_5")
    fmt = resolve_tool_format(qwen)
    bad = '<tool_call>\n{"name": "multiply", "arguments": {"a": 2,}}\n</tool_call><|im_end|>'
    _, (call,) = fmt.parse(qwen, qwen(bad, add_special_tokens=False)["input_ids"])
    assert call.error.startswith("the tool call is not valid JSON")  # the model is told, as before


def test_a_template_whose_call_turn_has_no_end_token_is_refused():
    """GLM-4-MoE closes no turn: the model would stop on the next turn's opening token, which the
    rendered tool message writes again."""
    from template_tokenizers import template_tokenizer

    with pytest.raises(ValueError, match="does not close a turn with tool calls with a token") as e:
        resolve_tool_format(template_tokenizer("glm4moe"))
    assert "\n" not in str(e.value)
