"""GRPOTrainer with tools, environments and rollout_func (TRL 1.16's API), on a scripted policy."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import CrashAt, tiny_config
from scripted_policy import after_tool, call, last_turn, multiply, multiply_script, scripted_llama

import reward_fns
from grpo_plugin import GRPOConfig, GRPOTrainer

DATA = [
    {"prompt": [{"role": "user", "content": f"Multiply {a} and {b}"}], "answer": str(a * b)}
    for a, b in [(123, 45), (7, 8), (31, 9), (250, 12)]
]


def exact_answer(completions, answer, **kwargs):
    """1.0 when the last assistant turn states the answer."""
    return [float(c[-1]["content"] == f"It is {a}.") for c, a in zip(completions, answer)]


def tool_trainer(tiny_tokenizer, tmp_path, script=multiply_script, reward=exact_answer, **kw):
    options = dict(max_completion_length=200, num_generations=4, per_device_train_batch_size=8,
                   max_steps=1, temperature=1.0)  # fmt: skip
    extra = {k: kw.pop(k) for k in ("tools", "environment_factory", "rollout_func") if k in kw}
    data = kw.pop("data", DATA)
    return GRPOTrainer(
        scripted_llama(tiny_tokenizer, script),
        reward,
        args=tiny_config(tmp_path, **{**options, **kw}),
        train_dataset=data,
        processing_class=tiny_tokenizer,
        **({"tools": [multiply]} | extra),
    )


def test_a_training_step_trains_only_the_sampled_tokens(tiny_tokenizer, tmp_path):
    trainer = tool_trainer(tiny_tokenizer, tmp_path, log_completions=True)
    batches = []
    original = trainer._training_batch
    trainer._training_batch = lambda rollout: batches.append(original(rollout)) or batches[-1]
    trainer.train()
    batch = batches[0]
    assert torch.equal(batch.loss_mask, batch.sampled_mask)
    tool_tokens = batch.completion_mask.bool() & ~batch.sampled_mask.bool()
    assert tool_tokens.sum() > 0  # every completion called the tool: results are in there
    out = trainer._policy_logps(trainer.model, batch, entropy=True, loss=False)
    logps, entropy = out.logps, out.entropy
    assert logps[tool_tokens].abs().max() == 0 and entropy[tool_tokens].abs().max() == 0
    assert logps[batch.sampled_mask.bool()].abs().min() > 0
    # dapo's normaliser is the rollout's sampled-token count
    assert trainer.run_state.loss_tokens_per_slice == float(batch.sampled_mask.sum())
    log = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    assert log["tools/turns_mean"] == 2.0 and log["reward"] == 1.0
    assert log["tools/reused_tokens"] > log["tools/prefill_tokens"] / 2
    assert log["completions/mean_length"] == batch.sampled_mask.sum(1).float().mean().item()
    import pandas as pd

    table = pd.read_parquet(tmp_path / "out" / "completions" / "step_00000.parquet")
    exchange = json.loads(table["completion"][0])
    assert [m["role"] for m in exchange] == ["assistant", "tool", "assistant"]


def test_the_training_forward_of_a_tool_rollout_encodes_each_prompt_once(tiny_tokenizer, tmp_path):
    trainer = tool_trainer(tiny_tokenizer, tmp_path)
    batches = []
    original = trainer._training_batch
    trainer._training_batch = lambda rollout: batches.append(original(rollout)) or batches[-1]
    trainer.train()
    batch, model = batches[0], trainer.model
    calls = []
    body = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
    hook = body.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    with torch.no_grad():
        shared = trainer._policy_logps(model, batch, False, False, sharing=(4, True)).logps
        plain = trainer._policy_logps(model, batch, False, False, sharing=(4, False)).logps
    hook.remove()
    prompt_width = batch.prompt_ids.shape[1]
    assert calls[0] == (2, prompt_width - 1)  # the 2 distinct prompts, once each
    assert calls[1][0] == 8 and calls[2] == (8, prompt_width + batch.completion_ids.shape[1])
    assert (shared - plain).abs().max() / plain.abs().max() < 1e-5


class Counter:
    """An environment: a counter the model can add to; it pays when the count hits the target."""

    resets: list[dict] = []

    def reset(self, **row):
        Counter.resets.append(row)
        self.count, self.target = 0, int(row["answer"])
        return f" (target {self.target})"

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.count += amount
        return self.count

    def get_reward(self) -> float:
        return float(self.count == self.target)


def counter_script(history: str) -> str:
    if after_tool(history):
        return "Done."
    target = re.findall(r"target (\d+)", last_turn(history, "user"))[0]
    return call("add", f'{{"amount": {target}}}')


def test_environment_factory_with_reset_and_get_reward(tiny_tokenizer, tmp_path):
    Counter.resets = []
    seen = {}

    def sees_environments(prompts, completions, environments, **kwargs):
        seen["prompts"], seen["environments"] = prompts, environments
        return [0.0] * len(completions)

    trainer = tool_trainer(tiny_tokenizer, tmp_path, counter_script, sees_environments, tools=[],
                           environment_factory=Counter)  # fmt: skip
    assert trainer.reward_names == ["sees_environments", "Counter"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    trainer.train()
    assert len(Counter.resets) == 8  # one reset per rollout, with the row's columns
    assert {r["answer"] for r in Counter.resets} <= {d["answer"] for d in DATA}
    assert all(
        p[-1]["content"].endswith(")") and "(target" in p[-1]["content"] for p in seen["prompts"]
    )
    assert len({id(e) for e in seen["environments"]}) == 8  # one instance per rollout
    log = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert log["rewards/Counter/mean"] == 1.0  # every rollout reached its target via the tool
    alone = tool_trainer(tiny_tokenizer, tmp_path / "2", counter_script, None, tools=[],
                         environment_factory=Counter)  # fmt: skip
    assert alone.reward_names == ["Counter"]  # the environment owns the reward, as in TRL


class Doubler:
    def reset(self, **row):
        self.value = 0

    def double(self, x: int) -> int:
        """Double a number.

        Args:
            x: The number.
        """
        self.value = 2 * x
        return self.value

    def get_reward(self) -> float:
        return float(self.value > 0)


def test_a_dict_of_environments_is_selected_by_the_environment_column(tiny_tokenizer, tmp_path):
    def script(history: str) -> str:
        if after_tool(history):
            return "Done."
        user = last_turn(history, "user")
        return call("add", '{"amount": 5}') if "target" in user else call("double", '{"x": 4}')

    data = [
        {"prompt": [{"role": "user", "content": "Count"}], "answer": "5", "environment": "counter"},
        {"prompt": [{"role": "user", "content": "Twice"}], "answer": "8", "environment": "doubler"},
    ]
    seen = {}

    def record(completions, environments, environment, **kwargs):
        seen.update(environments=environments, names=environment, completions=completions)
        return [0.0] * len(completions)

    trainer = tool_trainer(tiny_tokenizer, tmp_path, script, record, tools=[], data=data,
                           environment_factory={"counter": Counter, "doubler": Doubler})  # fmt: skip
    assert trainer.reward_names == ["record", "Counter", "Doubler"]
    trainer.train()
    kinds = [type(e).__name__ for e in seen["environments"]]
    assert kinds == ["Counter" if n == "counter" else "Doubler" for n in seen["names"]]
    results = [c[1]["content"] for c in seen["completions"]]
    assert results == ["5" if n == "counter" else "8" for n in seen["names"]]
    log = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert log["rewards/Counter/mean"] == 1.0 and log["rewards/Doubler/mean"] == 1.0
    bad = [{"prompt": [{"role": "user", "content": "x"}], "environment": "nope"}] * 2  # a rollout
    with pytest.raises(ValueError, match=r"rows name environment\(s\) \['nope'\]"):
        tool_trainer(tiny_tokenizer, tmp_path, script, record, tools=[], data=bad,
                     environment_factory={"counter": Counter})  # fmt: skip


class OwnsTheData(Counter):
    """An environment that owns its data: reset() writes the whole prompt."""

    def reset(self, **row):
        OwnsTheData.resets.append(row)
        self.count, self.target = 0, 6
        return "Reach target 6"


def test_an_environment_column_alone_lets_reset_supply_the_prompt(tiny_tokenizer, tmp_path):
    OwnsTheData.resets = []
    seen = {}

    def record(prompts, completions, **kwargs):
        seen["prompts"] = prompts
        return [0.0] * len(completions)

    data = [{"environment": "own"}] * 2
    trainer = tool_trainer(tiny_tokenizer, tmp_path, counter_script, record, tools=[], data=data,
                           environment_factory={"own": OwnsTheData})  # fmt: skip
    trainer.train()
    assert OwnsTheData.resets == [{}] * 8  # `environment` routes; it is not a reset() argument
    assert all(p == [{"role": "user", "content": "Reach target 6"}] for p in seen["prompts"])
    log = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert log["rewards/OwnsTheData/mean"] == 1.0  # the model reached the target reset() set
    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column.*only an"):
        tool_trainer(tiny_tokenizer, tmp_path, counter_script, record, data=data)
    OwnsTheData.resets = []  # one factory, any columns: each reset() gets the row's columns
    single = tool_trainer(tiny_tokenizer, tmp_path / "2", counter_script, None, tools=[],
                          data=[{"level": 1}, {"level": 2}], environment_factory=OwnsTheData)  # fmt: skip
    single.train()
    assert sorted(r["level"] for r in OwnsTheData.resets) == [1] * 4 + [2] * 4


def test_without_a_dataset_the_environment_owns_the_data(tiny_tokenizer, tmp_path):
    from grpo_plugin.training.sampling.tool_inputs import ToolInputs

    def check(factory, **kw):
        args = tiny_config(tmp_path, num_generations=4, per_device_train_batch_size=8, **kw)
        return ToolInputs.check([], None, factory, args).owned_data(None, args)

    placeholder = check(OwnsTheData, max_steps=3)
    assert placeholder["prompt"] == [[{"role": "user", "content": ""}]] * 2  # one rollout's rows
    with pytest.raises(ValueError, match="environment owns the data.*set max_steps"):
        check(OwnsTheData, max_steps=-1, num_train_epochs=1)
    with pytest.raises(ValueError, match="dict environment_factory requires a `train_dataset`"):
        check({"own": OwnsTheData}, max_steps=3)
    with pytest.raises(
        ValueError, match="`train_dataset` is required unless an `environment_factory`"
    ):
        check(None, max_steps=3)


def test_rollout_func_with_an_env_mask(tiny_tokenizer, tmp_path):
    calls = []

    def rollout_func(prompts, trainer):
        calls.append(len(prompts))
        ids = [[10, 11, 12, 13, 2] for _ in prompts]
        return {
            "prompt_ids": [[5, 6, 7]] * len(prompts),
            "completion_ids": ids,
            "logprobs": [[0.0] * 5 for _ in prompts],
            "env_mask": [[1, 1, 0, 0, 1] for _ in prompts],
            "turns_used": [2] * len(prompts),
        }

    seen = {}

    @reward_fns.in_process  # it records into this process's memory
    def reward(completions, turns_used, **kwargs):
        seen["turns_used"] = turns_used
        return [float(i % 2) for i in range(len(completions))]

    trainer = tool_trainer(tiny_tokenizer, tmp_path, reward=reward, tools=[],
                           rollout_func=rollout_func)  # fmt: skip
    batches = []
    original = trainer._training_batch
    trainer._training_batch = lambda rollout: batches.append(original(rollout)) or batches[-1]
    trainer.train()
    assert calls == [8]  # the 2 prompts of the step, each repeated G=4 times
    assert batches[0].loss_mask.tolist() == [[1, 1, 0, 0, 1]] * 8
    assert seen["turns_used"] == [2] * 8


TRL_TOOLS_QUICKSTART = '''
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
import random

factors = [(random.randint(0, 9999), random.randint(0, 9999)) for _ in range(100)]
dataset = Dataset.from_dict(
    {
        "prompt": [[{"role": "user", "content": f"Multiply {a} and {b}."}] for a, b in factors],
        "result": [a * b for a, b in factors],
    }
)


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def accuracy_reward(completions, result, **kwargs):
    return [int(str(r) in c[0]["content"]) for c, r in zip(completions, result)]


trainer = GRPOTrainer(
    model=MODEL_DIR,
    args=GRPOConfig(OUTPUT_DIR, **TINY),
    reward_funcs=accuracy_reward,
    train_dataset=dataset,
    tools=[multiply, async_add],
)
trainer.train()
'''


def test_trl_tools_quickstart_runs_after_changing_the_import(tiny_model_dir, tmp_path):
    """TRL's docs ("Agent Training": tools=[multiply, async_add]) with the dataset and reward of
    TRL's tool-calling example; the Hub model (Qwen3-0.6B) and vLLM settings are replaced by a
    tiny local model and a 1-step config, the only other change."""
    script = TRL_TOOLS_QUICKSTART.replace("from trl import", "from grpo_plugin import")
    tiny = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16,
                max_steps=1, report_to="none")  # fmt: skip
    scope = {"OUTPUT_DIR": str(tmp_path / "q"), "MODEL_DIR": str(tiny_model_dir), "TINY": tiny}
    exec(compile(script, "trl_tools_quickstart.py", "exec"), scope)
    trainer = scope["trainer"]
    assert trainer.state.global_step == 1 and [t.__name__ for t in trainer.tools] == [
        "multiply",
        "async_add",
    ]
    assert trainer.tool_setup.format.name == "chatml"  # the tiny ChatML template has no tools


def test_plain_text_prompts_are_refused_with_the_fix(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="tools need chat prompts"):
        tool_trainer(tiny_tokenizer, tmp_path, data=[{"prompt": "Multiply 2 and 3"}] * 2)


def test_a_template_we_cannot_parse_fails_before_training(tiny_tokenizer, tmp_path):
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    with pytest.raises(ValueError, match="has no tool support and is not ChatML"):
        GRPOTrainer(
            scripted_llama(tiny_tokenizer, multiply_script), exact_answer,
            args=GRPOConfig(output_dir=str(tmp_path)), train_dataset=DATA,
            processing_class=tokenizer, tools=[multiply],
        )  # fmt: skip


def test_evaluation_offers_the_tools_and_reports_the_call_rate(tiny_tokenizer, tmp_path):
    from grpo_plugin.evaluation.evaluator import EvalRuntime, EvalSettings, evaluate

    trainer = tool_trainer(tiny_tokenizer, tmp_path, num_generations_eval=1,
                           per_device_eval_batch_size=4)  # fmt: skip
    metrics = trainer.evaluate(DATA)
    assert metrics["eval_accuracy"] == 1.0 and metrics["eval_tools/call_rate"] == 1.0
    model = trainer.accelerator.unwrap_model(trainer.model)
    from datasets import Dataset

    greedy = EvalSettings.from_options({"k": 0, "max_new_tokens": 200})
    with_tools = EvalRuntime(tools=trainer.tool_setup)
    result = evaluate(model, tiny_tokenizer, Dataset.from_list(DATA), exact_answer, greedy,
                      with_tools)  # fmt: skip
    assert result["accuracy"] == 1.0 and result["tool_call_rate"] == 1.0
    assert result["tool_calls"] == 1.0


def test_a_tool_run_killed_mid_rollout_resumes_exactly(tiny_tokenizer, tmp_path):
    """checkpoint-1 falls inside a 2-step multi-turn rollout: the resumed run trains on the
    saved rollout (its sampled-token mask included) and ends where the uninterrupted one does."""
    spanning = dict(per_device_train_batch_size=4, steps_per_generation=2, max_steps=4,
                    save_strategy="steps", save_steps=1, learning_rate=1e-2)  # fmt: skip

    def trainer(name: str):
        return tool_trainer(tiny_tokenizer, tmp_path, output_dir=str(tmp_path / name), **spanning)

    whole = trainer("whole")
    whole.train()
    crashed = trainer("resumed")
    crashed.add_callback(CrashAt(1))
    with pytest.raises(SystemExit):
        crashed.train()
    assert sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-1"]
    resumed = trainer("resumed")
    resumed.train(resume_from_checkpoint=True)
    expected = whole.model.state_dict()
    got = resumed.model.state_dict()
    assert max((got[k] - expected[k]).abs().max().item() for k in expected) == 0.0

    def lines(name: str) -> list[dict]:
        rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(r).items() if not k.startswith(("timing/", "train_", "step_time",
                 "generation/tokens_per_s"))} for r in rows]  # fmt: skip

    assert lines("resumed") == lines("whole")
    assert [r["step"] for r in lines("whole") if "loss" in r] == [1, 2, 3, 4]
    assert lines("whole")[0]["tools/call_frequency"] == 1.0


@pytest.mark.parametrize(
    "family", ["qwen2_5", "qwen3", "llama3_1", "llama3_2", "qwen3_6", "gptoss"]
)
def test_a_models_own_template_with_tools_trains_a_step(family, tmp_path):
    """Qwen2.5 / Qwen3 / Llama 3.x / Qwen3.6 / gpt-oss templates as TRL ships them: built with tools (Qwen3
    on TRL's training version of its template), the scripted policy calls and answers in the
    template's own format, and one step trains."""
    from template_tokenizers import family_policy, template_tokenizer, trl_template

    from grpo_plugin.rollout.chat_tools import resolve_tool_format

    tok = template_tokenizer(family)
    options = dict(max_completion_length=300, num_generations=4, per_device_train_batch_size=8,
                   max_steps=1, temperature=1.0)  # fmt: skip
    trainer = GRPOTrainer(family_policy(tok, resolve_tool_format(tok)), exact_answer,
                          args=tiny_config(tmp_path, **options), train_dataset=DATA,
                          processing_class=tok, tools=[multiply])  # fmt: skip
    training = trl_template("qwen3_training") if family == "qwen3" else None
    assert trainer.tool_setup.format.template == training
    trainer.train()
    log = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    assert log["reward"] == 1.0  # every last turn is "It is {a * b}.", parsed in that format


def test_train_dataset_none_trains_on_the_environments_prompts(tiny_tokenizer, tmp_path):
    """TRL 1.16: `train_dataset=None` with one environment_factory; each reset() is the prompt."""
    OwnsTheData.resets = []
    trainer = tool_trainer(tiny_tokenizer, tmp_path, counter_script, None, tools=[], data=None,
                           environment_factory=OwnsTheData, max_steps=2)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(OwnsTheData.resets) == 16  # 2 steps x 8 completions, each its own environment
    rows = [json.loads(r) for r in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rewards/OwnsTheData/mean"] for r in rows if "loss" in r] == [1.0, 1.0]


@pytest.mark.parametrize("setting", [{"cache_implementation": "static"}, {"compile_decode": True}])
def test_a_static_decode_with_tools_is_refused_in_one_line(tiny_tokenizer, tmp_path, setting):
    with pytest.raises(ValueError) as err:
        tool_trainer(tiny_tokenizer, tmp_path, **setting)
    message = str(err.value)
    assert "is for single-turn rollouts, not tools" in message and "\n" not in message
