"""The multi-turn loop on a scripted policy: calls, results, exact masks, no re-prefill."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from scripted_policy import after_tool, call, last_turn, multiply, multiply_script, scripted_llama

from grpo_plugin.rollout.chat_tools import resolve_tool_format
from grpo_plugin.rollout.multiturn import ToolSetup
from grpo_plugin.rollout.prompts import sample_groups
from grpo_plugin.rollout.tool_calls import Tool
from grpo_plugin.rollout.types import GenerationRequest, GroupSampling, SamplingParams

GREEDY = SamplingParams(max_new_tokens=400, temperature=0.0)
ROWS = [
    {"prompt": [{"role": "user", "content": "Multiply 123 and 45"}], "answer": "5535"},
    {"prompt": [{"role": "user", "content": "Multiply 7 and 8"}], "answer": "56"},
]


def setup_for(tokenizer, *fns, **options) -> ToolSetup:
    fmt = resolve_tool_format(tokenizer, "auto")
    return ToolSetup(format=fmt, tools=[Tool.of(f) for f in fns], **options)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def run(tokenizer, script, setup, rows=ROWS, group=2, sampling=GREEDY):
    model = scripted_llama(tokenizer, script)
    rollout = sample_groups(model, tokenizer, rows, GroupSampling(sampling, group, tools=setup))
    return model, rollout


def test_the_tool_is_called_with_the_parsed_arguments_and_its_result_appended(tiny_tokenizer):
    seen = []

    def recording_multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        seen.append((a, b))
        return a * b

    recording_multiply.runs_in_process = True  # it records into this process's memory
    setup = setup_for(tiny_tokenizer, recording_multiply)
    script = lambda h: multiply_script(h).replace('"multiply"', '"recording_multiply"')  # noqa: E731
    _, rollout = run(tiny_tokenizer, script, setup)
    assert sorted(seen) == [(7, 8), (7, 8), (123, 45), (123, 45)]  # G=2 rows per prompt
    first = rollout.completions[0]
    assert [m["role"] for m in first] == ["assistant", "tool", "assistant"]
    assert first[0]["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "recording_multiply", "arguments": {"a": 123, "b": 45}},
        }
    ]
    assert first[1] == {"role": "tool", "name": "recording_multiply", "content": "5535"}
    assert first[2] == {"role": "assistant", "content": "It is 5535."}
    assert rollout.completions[2][2]["content"] == "It is 56."
    assert rollout.batch.tool_calls.tolist() == [1, 1, 1, 1]
    assert rollout.batch.turns.tolist() == [2, 2, 2, 2]
    assert rollout.batch.tool_failures.tolist() == [0, 0, 0, 0]


def test_masks_are_exact_token_by_token(tiny_tokenizer):
    _, rollout = run(tiny_tokenizer, multiply_script, setup_for(tiny_tokenizer, multiply))
    end = [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    for row, (a, b) in zip(range(0, 4, 2), [(123, 45), (7, 8)]):
        turn1 = ids(tiny_tokenizer, call("multiply", f'{{"a": {a}, "b": {b}}}')) + end
        glue = ids(
            tiny_tokenizer, f"\n<|im_start|>tool\n{a * b}<|im_end|>\n<|im_start|>assistant\n"
        )
        turn2 = ids(tiny_tokenizer, f"It is {a * b}.") + end
        expected = turn1 + glue + turn2
        n = len(expected)
        b = rollout.batch
        assert b.completion_ids[row, :n].tolist() == expected
        assert b.completion_mask[row].tolist() == [1] * n + [0] * (b.completion_mask.shape[1] - n)
        sampled = [1] * len(turn1) + [0] * len(glue) + [1] * len(turn2)
        assert b.sampled_mask[row, :n].tolist() == sampled
        assert int(b.sampled_mask[row, n:].sum()) == 0
        assert rollout.completion_ids[row] == expected
    assert not rollout.batch.is_truncated.any()
    assert rollout.batch.num_generated_tokens == int(rollout.batch.sampled_mask.sum())


def test_only_the_new_tokens_are_prefilled(tiny_tokenizer):
    model, rollout = run(tiny_tokenizer, multiply_script, setup_for(tiny_tokenizer, multiply))
    b = rollout.batch
    prompt_tokens = b.prompt_mask[::2].sum().item()  # each prompt once for its group of 2
    turn1 = [len(call("multiply", f'{{"a": {a}, "b": {c}}}')) + 1 for a, c in [(123, 45), (7, 8)]]
    glue = [len(ids(tiny_tokenizer, f"\n<|im_start|>tool\n{r}<|im_end|>\n<|im_start|>assistant\n"))
            for r in (5535, 56)]  # fmt: skip
    steps = max(turn1)  # the first turn decodes until its longest row ends
    missing = [int(t == steps) for t in turn1]  # that row's last token was never fed back
    expected_blocks = 2 * sum(g + m for g, m in zip(glue, missing))
    assert b.num_prefill_tokens == prompt_tokens + expected_blocks
    # what the model was given: that, and once per model the shared prefill's admission check
    # (every row of the first prefill, engine/decode.py)
    assert model.prefilled == b.num_prefill_tokens + b.prompt_mask.sum().item()
    reused = 2 * sum(
        p + t - m for p, t, m in zip(b.prompt_mask[::2].sum(1).tolist(), turn1, missing)
    )
    assert b.num_reused_tokens == reused  # what re-encoding the history would prefill again


def test_max_tool_calling_iterations_is_honoured(tiny_tokenizer):
    def keep_calling(history: str) -> str:
        return call("multiply", '{"a": 2, "b": 3}')

    for limit, calls in [(0, 0), (1, 1), (3, 3)]:
        setup = setup_for(tiny_tokenizer, multiply, max_iterations=limit)
        _, rollout = run(tiny_tokenizer, keep_calling, setup, rows=ROWS[:1], group=2)
        assert rollout.batch.tool_calls.tolist() == [calls, calls]
        assert rollout.batch.turns.tolist() == [calls + 1, calls + 1]
        tool_turns = [m for m in rollout.completions[0] if m["role"] == "tool"]
        assert len(tool_turns) == calls


def test_a_result_that_does_not_fit_ends_the_row_as_truncated(tiny_tokenizer):
    def huge(a: int, b: int) -> str:
        """Return a long text.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return "9" * 500

    script = lambda h: multiply_script(h).replace('"multiply"', '"huge"')  # noqa: E731
    setup = setup_for(tiny_tokenizer, huge, max_result_chars=10_000)
    _, rollout = run(tiny_tokenizer, script, setup, rows=ROWS[:1], group=2)
    assert rollout.batch.is_truncated.tolist() == [True, True]
    assert [m["role"] for m in rollout.completions[0]] == ["assistant"]  # result dropped
    assert (
        rollout.batch.completion_mask.sum(1).tolist() == rollout.batch.sampled_mask.sum(1).tolist()
    )


@pytest.mark.parametrize(
    "tool_body, expected",
    [
        ("raise ValueError('no')", "Error: broken raised ValueError: no"),
        ("release.wait(60); returned.append(1)", "Error: broken timed out after 0.3 s"),
    ],
)
def test_a_tool_that_raises_or_hangs_returns_an_error_and_the_run_goes_on(
    tiny_tokenizer, tool_body, expected
):
    namespace = {"release": threading.Event(), "returned": []}
    exec(
        f'def broken(a: int, b: int) -> int:\n    """Break.\n\n    Args:\n        a: A.\n'
        f'        b: B.\n    """\n    {tool_body}\n',
        namespace,
    )
    script = lambda h: multiply_script(h).replace('"multiply"', '"broken"')  # noqa: E731
    setup = setup_for(tiny_tokenizer, namespace["broken"], timeout=0.3)
    _, rollout = run(tiny_tokenizer, script, setup, rows=ROWS[:1], group=2)
    assert namespace["returned"] == []  # a hanging call was not waited for: it is still blocked
    namespace["release"].set()
    assert rollout.completions[0][1]["content"] == expected
    assert rollout.batch.tool_failures.tolist() == [1, 1]
    assert rollout.completions[0][2]["content"] == f"It is {expected}."


def test_malformed_arguments_and_unknown_tools_are_reported_to_the_model(tiny_tokenizer):
    cases = {
        "Multiply 1 and 2": '<tool_call>{"name": "multiply", "arguments": {"a": 1,}}</tool_call>',
        "Multiply 3 and 4": call("multiply", '{"a": 3, "c": 4}'),
        "Multiply 5 and 6": call("divide", '{"a": 5, "b": 6}'),
    }

    def script(history: str) -> str:
        return "Done." if after_tool(history) else cases[last_turn(history, "user")]

    rows = [{"prompt": [{"role": "user", "content": q}]} for q in cases]
    _, rollout = run(
        tiny_tokenizer, script, setup_for(tiny_tokenizer, multiply), rows=rows, group=1
    )
    results = [c[1]["content"] for c in rollout.completions]
    assert results[0].startswith("Error: the tool call is not valid JSON")
    assert results[1].startswith("Error: bad arguments for multiply:")
    assert results[2] == "Error: there is no tool named 'divide' (tools: multiply)"
    assert rollout.batch.tool_failures.tolist() == [1, 1, 1]
    assert "tool_calls" not in rollout.completions[0][0]  # an unreadable call is not a call


def test_async_tools_run_concurrently(tiny_tokenizer):
    in_flight = {"now": 0, "most": 0}

    async def slow_multiply(a: int, b: int) -> int:
        """Multiply two integers, slowly.

        Args:
            a: The first integer.
            b: The second integer.
        """
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        await asyncio.sleep(0.2)
        in_flight["now"] -= 1
        return f"{a * b}, {in_flight['most']} in flight"  # read where the tools ran (the worker)

    script = lambda h: multiply_script(h).replace('"multiply"', '"slow_multiply"')  # noqa: E731
    setup = setup_for(tiny_tokenizer, slow_multiply)
    _, rollout = run(tiny_tokenizer, script, setup, group=4)  # 8 calls in one round
    finals = [c[2]["content"] for c in rollout.completions]
    assert finals == ["It is 5535, 8 in flight."] * 4 + ["It is 56, 8 in flight."] * 4  # at once


def test_sampled_turns_draw_at_their_position_in_the_completion(tiny_tokenizer):
    """Sampling (temperature 1) picks the scripted tokens; the keyed draws make it repeatable."""
    from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey

    setup = setup_for(tiny_tokenizer, multiply)
    sampling = SamplingParams(max_new_tokens=160, temperature=1.0)
    noise = KeyedNoise.for_prompts(RolloutKey(0, 0), [0, 1], 2, 160)
    model = scripted_llama(tiny_tokenizer, multiply_script)
    settings = GroupSampling(sampling, num_generations=2, tools=setup)
    first = sample_groups(model, tiny_tokenizer, ROWS, settings, noise=noise)
    assert [c[-1]["content"] for c in first.completions] == ["It is 5535."] * 2 + ["It is 56."] * 2
    assert torch.equal(first.batch.sampled_mask.sum(1), first.batch.sampled_mask.sum(1))


def test_two_turn_log_probs_from_the_reused_cache_equal_one_full_forward(tiny_tokenizer):
    """The loop's sampling log-probs (cache reused across turns, blocks padded, finished rows'
    columns masked) against one forward over prompt + whole exchange, in float32."""
    from scripted_policy import LlamaForCausalLM

    from grpo_plugin.rollout.multiturn import run_tool_loop

    # a model whose attention is far from uniform, so that a wrongly attended column shows
    model = scripted_llama(tiny_tokenizer, multiply_script, bias=BIAS, init=INIT)
    setup = setup_for(tiny_tokenizer, multiply)
    prompts, boxes, _ = setup.start([r for r in ROWS for _ in range(2)])
    prompt_ids = [
        setup.format.render_prompt(tiny_tokenizer, p, [multiply_schema()]) for p in prompts
    ]
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    request = GenerationRequest(GREEDY, 2, [end], tiny_tokenizer.pad_token_id, record_logprobs=True)
    result = run_tool_loop(model, tiny_tokenizer, prompt_ids, boxes, setup, request)
    worst = 0.0
    for r, t in enumerate(result.trajectories):
        assert t.turns == 2 and sum(1 - s for s in t.sampled) > 0  # a genuine two-turn exchange
        full = torch.tensor([prompt_ids[r] + t.ids])
        with torch.no_grad():
            logits = LlamaForCausalLM.forward(model, input_ids=full).logits[0].float()  # (L, V)
        start = len(prompt_ids[r])
        for j, sampled in enumerate(t.sampled):
            if not sampled:
                continue
            z = logits[start + j - 1].clone()
            z[model.next_token(full[0, : start + j].tolist())] += BIAS
            expected = z.log_softmax(-1)[t.ids[j]].item()
            worst = max(worst, abs(expected - result.logprobs[r][j]))
    print(f"two-turn log-prob max |diff| = {worst:.3g}")
    assert worst < 1e-5, worst


BIAS, INIT = 8.0, 0.2  # greedy still follows the script; unmasked columns show (0.1)


def multiply_schema():
    return Tool.of(multiply).schema


def test_the_training_forward_scores_the_whole_exchange_with_the_prompt_shared(tiny_tokenizer):
    from grpo_plugin.engine.forward import completion_logprobs

    _, rollout = run(tiny_tokenizer, multiply_script, setup_for(tiny_tokenizer, multiply))
    b = rollout.batch
    model = scripted_llama(tiny_tokenizer, multiply_script, init=INIT)
    tensors = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    with torch.no_grad():
        shared = completion_logprobs(model, (*tensors, b.sampled_mask), group_size=2, share_prompt_prefix=True).logps  # fmt: skip
        plain = completion_logprobs(model, (*tensors, b.sampled_mask)).logps
    assert (shared - plain).abs().max() < 1e-5
    assert shared[b.sampled_mask == 0].abs().max() == 0  # tool results and glue are not scored
    assert shared[b.sampled_mask == 1].abs().min() > 0
