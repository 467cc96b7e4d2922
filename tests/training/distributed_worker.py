"""The multi-process side of tests/training/test_distributed_launch.py (a script, not a test).

    accelerate launch --multi_gpu --num_processes 2 tests/training/distributed_worker.py OUT PHASE...

builds `GRPOTrainer`s on the tiny model and records what the tests compare, process 0 writing:
- `equal-grpo`, `equal-dapo`: 3 LoRA steps, 8 completions per process (1 prompt x G=8), with the
  default settings (the rollout copy where the CPU has bf16 units); the test runs the same
  `train_and_record` on one process with 16. OUT/PHASE/ gets the adapter, the gathered
  completions, `grad.pt` (the first step's gradient, as the optimizer sees it) and the log history.
- `equal-stream`: the same on a streamed (`IterableDataset`) training set, read in order.
- `equal-ga`: dapo with 4 completions per micro-step and 2 accumulation steps per process (the
  global rollout and its token normaliser span processes and accumulation steps).
- `equal-trl`: the same with TRL 1.16 options whose normalisation spans processes (`TRL_OPTIONS`:
  bnpo, the entropy quantile and bonus) and a reward model next to a reward that calls
  `log_extra` and `log_metric`.
- `eval`: sharded greedy evaluation of the untrained model -> OUT/eval.json.
- `dynamic`: dynamic sampling where process 0's groups all score alike (it refills every round)
  and process 1's do not (it never refills) -> OUT/dynamic/calls_rank{k}.json.
- `error`: process 1's reward raises at the second rollout; each process writes the exception
  it stopped with -> OUT/error_rank{k}.json.
- `eval-error`: the same while evaluating (the recipes' `evaluate` and `GRPOTrainer.evaluate`)
  -> OUT/eval-error/{function,trainer}_rank{k}.json.
- `fsdp2`: one LoRA policy step on torch's FSDP2 (sharded sampling + backward) -> OUT/fsdp2/.
- `cli=RECIPE`: `grpo-plugin train RECIPE` (what `python -m grpo_plugin` runs) -> its output dir,
  and each process's stdout in OUT/cli/stdout_rank{k}.txt.
- `unshared-trainer=DIR`, `unshared-cli=RECIPE,DIR`: `GRPOTrainer.train()` and `grpo-plugin train
  RECIPE --output_dir DIR` where DIR is not one folder for both processes (DIR's `{rank}` is the
  process index, or each "machine" mounts its own folder there: test_multi_machine_launch.py);
  each process writes what it stopped with -> OUT/PHASE/rank{k}.json.
- `cli-late=RECIPE,DIR`: `grpo-plugin train RECIPE --output_dir DIR` into one folder, process 1
  reaching the run-dir checks 3 s after process 0 -> OUT/cli-late/rank{k}.json.
- `recipe-error=RECIPE,DIR`: `grpo-plugin train RECIPE --output_dir DIR`, process 1 naming a reward
  that does not exist (a file missing on one machine) -> OUT/recipe-error/rank{k}.json.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import reward_fns  # noqa: E402,F401  (first: once tests/ is on the path, tests/reward_fns/ shadows it)

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: the conftest helpers

import torch  # noqa: E402
from conftest import (  # noqa: E402
    SEVEN_DATA,
    char_codes,
    make_tiny_model,
    make_tiny_reward_model,
    make_tiny_tokenizer,
)
from transformers import TrainerCallback  # noqa: E402

from grpo_plugin._compat import release_process_group  # noqa: E402

STEPS = 3
RANK = int(os.environ.get("RANK", "0"))


class FirstGradient(TrainerCallback):
    """Keeps the trainable parameters' gradients just before the first optimizer step."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] | None = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {
                n: p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.requires_grad and p.grad is not None
            }


def tiny_trainer(
    out: Path, per_device: int, reward=char_codes, reward_classes=None, data=None, **overrides
):
    from peft import LoraConfig

    from grpo_plugin import GRPOConfig, GRPOTrainer

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, initializer_range=0.5)
    # Every lowercase letter also ends a completion: lengths vary (1..8 tokens), so the processes'
    # token counts differ and dapo's global normaliser matters.
    stops = tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz"))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    config = dict(
        output_dir=str(out),
        per_device_train_batch_size=per_device,
        num_generations=8,
        max_completion_length=8,
        max_steps=STEPS,
        learning_rate=3e-2,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        log_completions=True,
        max_grad_norm=0.0,  # no clipping: the raw gradients are compared
    )
    return GRPOTrainer(
        model,
        reward,
        args=GRPOConfig(**{**config, **overrides}),
        train_dataset=SEVEN_DATA if data is None else data,
        processing_class=tokenizer,
        reward_processing_classes=reward_classes,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    )


def train_and_record(out: Path, loss_type: str, per_device: int, **overrides) -> None:
    """3 steps; writes the adapter, the completions parquets and grad.pt under `out`."""
    trainer = tiny_trainer(out, per_device, loss_type=loss_type, **overrides)
    probe = FirstGradient()
    trainer.add_callback(probe)
    trainer.train()
    trainer.save_model(str(out))
    if trainer.is_world_process_zero():
        torch.save(probe.grads, out / "grad.pt")
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


def logged_char_codes(prompts, completions, log_extra, log_metric, **kwargs):
    """`char_codes`, also logging a column (characters) and a metric (the batch's mean score)."""
    scores = char_codes(prompts, completions)
    log_extra("characters", [len(c) for c in completions])
    log_metric("logged/mean_score", sum(scores) / len(scores))
    return scores


def trl_options() -> dict:
    """`equal-trl`'s settings: bnpo (a token mean over the micro-batch), the top half of tokens by
    entropy, an entropy bonus, and a reward model (the same weights on every process)."""
    tokenizer = make_tiny_tokenizer()
    return dict(
        top_entropy_quantile=0.5,
        entropy_coef=0.05,
        reward=[logged_char_codes, make_tiny_reward_model(tokenizer)],
        reward_classes=[None, tokenizer],
        reward_weights=[1.0, 0.1],
    )


def streamed() -> dict:
    """`equal-stream`'s settings: SEVEN_DATA as a datasets.IterableDataset, read in order (each
    process reads every other row, so the global rollout is the 1-process one)."""
    from datasets import IterableDataset

    def rows():
        yield from SEVEN_DATA

    return dict(data=IterableDataset.from_generator(rows), shuffle_dataset=False)


def length_score(prompts, completions, **kwargs):
    """A reward that varies from prompt to prompt: characters / 4 (chat or plain completions)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [len(text) / 4 for text in texts]


def sharded_eval(out: Path) -> None:
    from grpo_plugin.evaluation.evaluator import EvalRuntime, EvalSettings, evaluate

    trainer = tiny_trainer(out / "eval-run", 8)
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = evaluate(
        model,
        trainer.processing_class,
        trainer.train_dataset.select(range(7)),  # 7 prompts: shards of 4 and 3
        length_score,
        EvalSettings.from_options({"k": 2, "max_new_tokens": 8, "batch_size": 2}),
        EvalRuntime(accelerator=trainer.accelerator),
    )
    in_training = trainer.evaluate(trainer.train_dataset.select(range(7)))  # also sharded
    if trainer.is_world_process_zero():
        (out / "eval.json").write_text(json.dumps(result))
        (out / "trainer_eval.json").write_text(json.dumps(in_training))


def rank_dependent(prompts, completions, **kwargs):
    """Process 0: every group scores alike (all dropped); process 1: the G scores all differ."""
    return [1.0 if RANK == 0 else float(i) for i in range(len(completions))]


def dynamic(out: Path) -> None:
    trainer = tiny_trainer(out, 8, reward=rank_dependent, dynamic_sampling=True)
    calls = []
    sample = trainer._sample_and_score
    trainer._sample_and_score = lambda rows, key: calls.append(len(rows)) or sample(rows, key)
    trainer.train()
    (out / f"calls_rank{RANK}.json").write_text(json.dumps(calls))


def error(out: Path) -> None:
    calls = []

    def fails_on_process_1(prompts, completions, **kwargs):
        calls.append(1)
        if RANK == 1 and len(calls) == 2:
            raise ValueError("deliberate failure")
        return [1.0] * len(completions)

    trainer = tiny_trainer(out / "run", 8, reward=fails_on_process_1)
    try:
        trainer.train()
        report = {"type": None}
    except Exception as err:  # the test checks that both processes name the same error
        report = {"type": type(err).__name__, "message": str(err)}
        report["notes"] = getattr(err, "__notes__", [])
    (out / f"error_rank{RANK}.json").write_text(json.dumps(report))


def fails_on_process_1(prompts, completions, **kwargs):
    if RANK == 1:
        raise ValueError("deliberate evaluation failure")
    return [1.0] * len(completions)


def _report(run) -> dict:
    try:
        run()
        return {"type": None}
    except Exception as err:
        notes = getattr(err, "__notes__", [])
        return {"type": type(err).__name__, "message": str(err), "notes": notes}


def eval_error(out: Path) -> None:
    from grpo_plugin.evaluation.evaluator import EvalRuntime, EvalSettings, evaluate

    trainer = tiny_trainer(out / "run", 8, reward=fails_on_process_1)
    model, data = trainer.accelerator.unwrap_model(trainer.model), trainer.train_dataset
    greedy = EvalSettings.from_options({"k": 0, "max_new_tokens": 4})
    sharded = EvalRuntime(accelerator=trainer.accelerator)
    reports = {
        "function": _report(lambda: evaluate(model, trainer.processing_class, data.select(range(4)),
                                             fails_on_process_1, greedy, sharded)),
        "trainer": _report(lambda: trainer.evaluate(data.select(range(4)))),
    }  # fmt: skip
    for name, report in reports.items():
        (out / f"{name}_rank{RANK}.json").write_text(json.dumps(report))


def sharded_policy_step(model, tokenizer, prompt_index: int, accelerator=None, rounds: int = 1):
    """Sample G=8 completions of global prompt `prompt_index` (keyed draws) `rounds` times, as a
    dynamic-sampling refill would, then backpropagate their summed log-probs through the policy
    as the trainer does. Returns the completion ids."""
    from grpo_plugin.distributed import forward_through, full_parameters, shares_prefix
    from grpo_plugin.engine.forward import completion_logprobs
    from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
    from grpo_plugin.rollout.prompts import sample_groups
    from grpo_plugin.rollout.types import GroupSampling, SamplingParams

    noise = KeyedNoise.for_prompts(RolloutKey(0, 0), [prompt_index], 8, 8)
    model.eval()
    with full_parameters(accelerator, model):
        for _ in range(rounds):  # a different number of forward passes on each process
            settings = GroupSampling(SamplingParams(8), num_generations=8)
            rollout = sample_groups(
                model, tokenizer, [SEVEN_DATA[prompt_index]], settings, noise=noise
            )
    b = rollout.batch
    model.train()
    share = shares_prefix(accelerator, True)

    def logps(policy):
        ids = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
        return completion_logprobs(policy, ids, group_size=8, share_prompt_prefix=share).logps

    forward_through(accelerator, model, logps).sum().backward()
    return b.completion_ids


def lora_policy():
    from peft import LoraConfig, get_peft_model

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(tokenizer, initializer_range=0.5)
    stops = tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz"))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    torch.manual_seed(0)
    return get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    ), tokenizer


def fsdp2(out: Path) -> None:
    """torch's FSDP2 on the gloo processes (accelerate 1.15 enables its FSDP plugin on GPUs only):
    each process samples its own prompt in `full_parameters` (process 0 twice, process 1 once)
    and backpropagates through `forward_through`; FSDP2 averages the gradients."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from torch.distributed.fsdp import fully_shard

    model, tokenizer = lora_policy()
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    accelerator = SimpleNamespace(is_fsdp2=True, unwrap_model=lambda m: m, autocast=nullcontext)
    ids = sharded_policy_step(model, tokenizer, RANK, accelerator, rounds=2 - RANK)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    if RANK == 0:
        torch.save(grads, out / "grad.pt")
    (out / f"ids_rank{RANK}.json").write_text(json.dumps(ids.tolist()))


def cli(out: Path, recipe: str) -> None:
    """`grpo-plugin train RECIPE` as `python -m grpo_plugin` runs it; stdout to OUT/stdout_rank{k}."""
    from contextlib import redirect_stdout

    from grpo_plugin.cli import main as cli_main

    with (out / f"stdout_rank{RANK}.txt").open("w") as fh, redirect_stdout(fh):
        code = cli_main(["train", recipe])
    if code:
        raise SystemExit(code)


def unshared_trainer(out: Path, output_dir: str) -> None:
    trainer = tiny_trainer(Path(output_dir.format(rank=RANK)), 8)
    report = _report(trainer.train)
    report["steps"] = trainer.state.global_step
    (out / f"rank{RANK}.json").write_text(json.dumps(report))


def failing_cli(out: Path, arg: str, *flags: str) -> None:
    """The CLI's exit code and stderr (its error line) on each process -> OUT/rank{k}.json."""
    from contextlib import redirect_stderr

    from grpo_plugin.cli import main as cli_main

    recipe, output_dir = arg.split(",")
    stderr = out / f"stderr_rank{RANK}.txt"
    root = logging.getLogger()
    root.handlers.clear()  # the CLI's logging.basicConfig: to this stderr, not an earlier one
    with stderr.open("w") as fh, redirect_stderr(fh):
        code = cli_main(["train", recipe, "--output_dir", output_dir.format(rank=RANK), *flags])
    root.handlers.clear()  # its stream is closed now
    report = {"code": code, "stderr": stderr.read_text()}
    (out / f"rank{RANK}.json").write_text(json.dumps(report))


def cli_late(out: Path, arg: str) -> None:
    """Process 1 reaches the run-dir checks 3 s after process 0 (machines are never in step)."""
    import time

    from grpo_plugin.app import preflight

    check_run_dir = preflight.check_run_dir

    def late(recipe):
        time.sleep(3)
        return check_run_dir(recipe)

    if RANK == 1:
        preflight.check_run_dir = late
    try:
        failing_cli(out, arg)
    finally:
        preflight.check_run_dir = check_run_dir


def recipe_error(out: Path, arg: str) -> None:
    flags = ["--reward_funcs", "missing_module_on_machine_1:score"] if RANK == 1 else []
    failing_cli(out, arg, *flags)


def main(out: Path, phases: list[str]) -> None:
    for phase in phases:
        print(f"[worker rank {RANK}] phase {phase}", file=sys.stderr, flush=True)  # where it died
        phase, _, arg = phase.partition("=")
        (out / phase).mkdir(parents=True, exist_ok=True)
        if phase == "equal-trl":
            train_and_record(out / phase, "bnpo", per_device=8, **trl_options())
        elif phase == "equal-stream":
            train_and_record(out / phase, "dapo", per_device=8, **streamed())
        elif phase == "equal-ga":
            train_and_record(out / phase, "dapo", per_device=4, gradient_accumulation_steps=2)
        elif phase.startswith("equal-"):
            train_and_record(out / phase, phase.removeprefix("equal-"), per_device=8)
        elif phase == "cli":
            cli(out / phase, arg)
        elif phase == "unshared-trainer":
            unshared_trainer(out / phase, arg)
        elif phase == "unshared-cli":
            failing_cli(out / phase, arg)
        elif phase == "cli-late":
            cli_late(out / phase, arg)
        elif phase == "recipe-error":
            recipe_error(out / phase, arg)
        else:
            phases = {"eval": sharded_eval, "dynamic": dynamic, "error": error, "fsdp2": fsdp2}
            phases["eval-error"] = eval_error
            phases[phase](out / phase)


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), sys.argv[2:])
    finally:
        release_process_group()
    # Every output is written and the group released: end without interpreter finalization, where
    # torch 2.13's gloo has aborted finished processes (SIGABRT; see _compat.release_process_group,
    # whose own test covers the CLI's exit path). A failed phase still raises above, exit code 1.
    print(f"[worker rank {RANK}] done", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)
