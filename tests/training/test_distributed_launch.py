"""Two processes train exactly like one, proven on CPU processes (gloo) under `accelerate launch`.

One launch of tests/training/distributed_worker.py runs every multi-process phase the tests below
read (each launch costs two interpreter start-ups on a 2-core CI machine); one more launch runs
the CLI. Every launch has a timeout, so a hang fails instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, load_script
from safetensors.torch import load_file

from grpo_plugin._compat import cpu_has_bf16_units

WORKER = Path(__file__).with_name("distributed_worker.py")
TIMEOUT_S = 400  # far above a normal run; only a hang gets there
DDP_CONFIG = REPO_ROOT / "recipes" / "accelerate" / "ddp.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], tmp: Path, *launch_flags: str) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes 2 ARGS` (CPU processes); on timeout the
    whole process group is killed, the launcher's workers too."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(tmp / "hf-home"),  # no user accelerate config is read
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")]),
    }
    # The shipped DDP config (MULTI_GPU, 2 processes): `--cpu` would start one process
    # (accelerate's CPU launcher is mpirun); torchrun starts two, and GRPOConfig selects gloo when
    # there is no GPU.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CONFIG)]
    cmd += ["--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(_free_port()), *launch_flags, *args]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"2-process run still running after {TIMEOUT_S}s (a hang):\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


CLI_RECIPE = """\
model: {model}
lora: {{r: 8, lora_alpha: 16, target_modules: all-linear}}
dataset: {{name: arithmetic, train_size: 8, eval_size: 5}}
reward_funcs: ["distributed_worker:length_score"]
eval: {{k: 0, batch_size: 8, before: false}}
num_generations: 4
per_device_train_batch_size: 8
max_steps: 2
max_completion_length: 6
log_completions: true
save_strategy: 'no'
disable_tqdm: true
output_dir: {out}
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, tiny_model_dir) -> Path:
    """One 2-process launch for every test of this file (see distributed_worker.py)."""
    out = tmp_path_factory.mktemp("two-processes")
    recipe = out / "tiny.yaml"
    recipe.write_text(CLI_RECIPE.format(model=tiny_model_dir, out=out / "cli-run"))
    phases = ["equal-grpo", "equal-dapo", "equal-ga", "equal-trl", "equal-stream", "eval"]
    phases += ["dynamic", "fsdp2", f"cli={recipe}", "error", "eval-error"]
    proc = launch([str(WORKER), str(out), *phases], out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    named = {name.removeprefix("module."): t.float() for name, t in tensors.items()}
    return torch.cat([named[name].flatten() for name in sorted(named)])


@pytest.mark.parametrize("phase", ["grpo", "dapo", "ga"])
def test_two_processes_train_like_one(two_processes, tmp_path, phase):
    """1 process x 16 completions (2 prompts x G=8) == 2 processes x 8, for 3 LoRA steps (`ga`:
    dapo, each process accumulating 2 micro-steps of 4)."""
    import pyarrow.parquet as pq

    worker = load_script(WORKER, "distributed_worker")
    loss_type = "dapo" if phase == "ga" else phase
    one, two = tmp_path / "one", two_processes / f"equal-{phase}"
    worker.train_and_record(one, loss_type, per_device=16)

    first_one = pq.read_table(one / "completions" / "step_00000.parquet").to_pydict()
    first_two = pq.read_table(two / "completions" / "step_00000.parquet").to_pydict()
    assert len(first_two["completion"]) == 16  # both processes' completions, gathered
    assert first_two["prompt"] == first_one["prompt"]
    assert first_two["completion"] == first_one["completion"]
    assert first_two["reward"] == first_one["reward"]

    # the default is the same on both layouts: each process samples from its own bf16 copy on a
    # CPU with bf16 units (the copy's tokens differ from the policy's: a log-prob gap), else both
    # from the policy (no gap)
    copy = bool(cpu_has_bf16_units())
    for run in (one, two):
        gaps = [
            row["sampling/sampling_logp_difference/max"]
            for row in json.loads((run / "log_history.json").read_text())
            if "sampling/sampling_logp_difference/max" in row
        ]
        assert gaps and (min(gaps) > 0) == copy, (run, gaps)

    grads_one, grads_two = torch.load(one / "grad.pt"), torch.load(two / "grad.pt")
    assert len(grads_one) == len(grads_two) > 0
    grad_diff = _relative(_flat(grads_two), _flat(grads_one))
    assert grad_diff < 1e-5, grad_diff

    adapter_one = load_file(one / "adapter_model.safetensors")
    adapter_two = load_file(two / "adapter_model.safetensors")
    assert adapter_one.keys() == adapter_two.keys()
    base = make_untrained_adapter_distance(adapter_one, tmp_path)
    adapter_diff = _relative(_flat(adapter_two), _flat(adapter_one))
    assert adapter_diff < 1e-3 < base, (adapter_diff, base)
    print(
        f"{phase}: 1 vs 2 processes, relative difference: first gradient {grad_diff:.1e}, "
        f"adapter after {worker.STEPS} steps {adapter_diff:.1e} (the steps moved it {base:.1e})"
    )


def test_trl_options_and_a_reward_model_on_two_processes_train_like_one(two_processes, tmp_path):
    """bnpo, the entropy quantile and bonus use every process's tokens, the reward model scores
    each process's share, and the log_extra column and log_metric metric cover both processes."""
    import pyarrow.parquet as pq

    worker = load_script(WORKER, "distributed_worker")
    one, two = tmp_path / "one", two_processes / "equal-trl"
    worker.train_and_record(one, "bnpo", per_device=16, **worker.trl_options())
    first_one = pq.read_table(one / "completions" / "step_00000.parquet").to_pydict()
    first_two = pq.read_table(two / "completions" / "step_00000.parquet").to_pydict()
    assert first_two["completion"] == first_one["completion"]
    assert len(first_two["characters"]) == 16  # log_extra, gathered from both processes
    assert first_two["characters"] == [len(c) for c in first_one["completion"]]
    # the reward model scores 8 texts per batch there and 16 here: float32 padding noise only
    assert first_two["reward"] == pytest.approx(first_one["reward"], abs=1e-5)
    grad_diff = _relative(_flat(torch.load(two / "grad.pt")), _flat(torch.load(one / "grad.pt")))
    assert grad_diff < 1e-4, grad_diff
    adapter_one = load_file(one / "adapter_model.safetensors")
    adapter_two = load_file(two / "adapter_model.safetensors")
    adapter_diff = _relative(_flat(adapter_two), _flat(adapter_one))
    assert adapter_diff < 1e-3, adapter_diff
    logged = [json.loads(line) for line in (two / "metrics.jsonl").open()]
    assert all("logged/mean_score" in row for row in logged if "loss" in row)
    print(
        f"TRL options: 1 vs 2 processes, first gradient {grad_diff:.1e}, adapter {adapter_diff:.1e}"
    )


def test_a_streamed_training_set_on_two_processes_trains_like_one(two_processes, tmp_path):
    """An IterableDataset: each process reads its share of the stream (every other row), so the
    2-process rollouts are the 1-process ones and so is the training."""
    import pyarrow.parquet as pq

    worker = load_script(WORKER, "distributed_worker")
    one, two = tmp_path / "one", two_processes / "equal-stream"
    worker.train_and_record(one, "dapo", per_device=16, **worker.streamed())
    for step in range(worker.STEPS):
        name = f"completions/step_{step:05d}.parquet"
        table_one, table_two = pq.read_table(one / name), pq.read_table(two / name)
        assert table_two.column("prompt").to_pylist() == table_one.column("prompt").to_pylist()
        assert table_two.column("completion") == table_one.column("completion")
    assert len(set(pq.read_table(two / name).column("prompt").to_pylist())) == 2  # 2 prompts
    diff = _relative(_flat(torch.load(two / "grad.pt")), _flat(torch.load(one / "grad.pt")))
    assert diff < 1e-5, diff
    print(f"streamed: 1 vs 2 processes, identical completions, first gradient {diff:.1e}")


def make_untrained_adapter_distance(trained: dict[str, torch.Tensor], tmp_path: Path) -> float:
    """How far 3 steps moved the adapter (relative): the 1e-3 bound must be far below it."""
    from peft import get_peft_model_state_dict

    worker = load_script(WORKER, "distributed_worker")
    trainer = worker.tiny_trainer(tmp_path / "untrained", 16)
    start = get_peft_model_state_dict(trainer.model)
    return _relative(_flat(start), _flat(trained))


def test_fsdp2_policy_step_equals_one_process(two_processes):
    """torch FSDP2 on 2 gloo processes: sampling with gathered weights (process 0 sampling twice,
    process 1 once, without a hang) and the training forward through the sharded root give the
    one-process completions and gradient. (Through accelerate, FSDP needs GPUs: see README.)"""
    worker = load_script(WORKER, "distributed_worker")
    model, tokenizer = worker.lora_policy()
    ids = [worker.sharded_policy_step(model, tokenizer, k) for k in range(2)]  # grads add up
    for k in range(2):
        sharded = json.loads((two_processes / "fsdp2" / f"ids_rank{k}.json").read_text())
        assert sharded == ids[k].tolist()
    expected = {n: p.grad / 2 for n, p in model.named_parameters() if p.grad is not None}
    sharded = torch.load(two_processes / "fsdp2" / "grad.pt")
    assert len(sharded) == len(expected) > 0
    diff = _relative(_flat(sharded), _flat(expected))
    assert diff < 1e-5, diff
    print(f"FSDP2 vs 1 process: gradient {diff:.1e} relative")


def test_sharded_evaluation_equals_one_process(two_processes, tmp_path):
    from grpo_plugin.evaluation.evaluator import EvalSettings, evaluate

    worker = load_script(WORKER, "distributed_worker")
    trainer = worker.tiny_trainer(tmp_path / "eval", 16)
    model = trainer.accelerator.unwrap_model(trainer.model)
    data = trainer.train_dataset.select(range(7))
    settings = EvalSettings.from_options({"k": 2, "max_new_tokens": 8, "batch_size": 2})
    one = evaluate(model, trainer.processing_class, data, worker.length_score, settings)
    two = json.loads((two_processes / "eval" / "eval.json").read_text())
    assert two["n"] == one["n"] == 7
    assert 0 < one["accuracy"] < 1  # the check can fail both ways
    assert two["accuracy"] == one["accuracy"]
    assert two["mean_reward"] == pytest.approx(one["mean_reward"], abs=1e-12)
    assert two["pass@2"] == one["pass@2"]  # samples keyed on the prompt's index, not the shard
    # GRPOTrainer.evaluate() (evaluation during training) is sharded and gathered the same way
    one_in_training = trainer.evaluate(data)
    two_in_training = json.loads((two_processes / "eval" / "trainer_eval.json").read_text())
    for key in ("eval_n", "eval_accuracy", "eval_reward", "eval_completions/mean_length"):
        assert two_in_training[key] == pytest.approx(one_in_training[key], abs=1e-9), key
    assert one_in_training["eval_n"] == 7


def test_dynamic_sampling_refills_per_process_without_deadlock(two_processes):
    """Process 0 refills every round (its groups always tie), process 1 never; both finish."""
    calls = [
        json.loads((two_processes / "dynamic" / f"calls_rank{k}.json").read_text())
        for k in range(2)
    ]
    rounds = 1 + 3  # the rollout itself + max_resample_rounds refills
    assert calls[0] == [1] * (rounds * 3)  # 3 steps, 1 prompt each time
    assert calls[1] == [1] * 3
    metrics = [json.loads(line) for line in (two_processes / "dynamic" / "metrics.jsonl").open()]
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    # dropped groups: process 0's first group and its 3 refills each step, none on process 1
    assert all(m["dynamic_sampling/filtered_groups"] == 4 for m in steps)


def test_a_reward_that_raises_on_one_process_stops_both_with_its_error(two_processes):
    reports = [
        json.loads((two_processes / "error" / f"error_rank{k}.json").read_text()) for k in range(2)
    ]
    assert reports[0]["type"] == reports[1]["type"] == "RewardFunctionError"
    assert reports[0]["message"] == reports[1]["message"]
    assert "deliberate failure" in reports[0]["message"]
    assert any("process 1 of 2" in note for note in reports[0]["notes"])


@pytest.mark.parametrize("where", ["function", "trainer"])
def test_a_reward_that_raises_while_evaluating_stops_both_with_its_error(two_processes, where):
    folder = two_processes / "eval-error"
    reports = [json.loads((folder / f"{where}_rank{k}.json").read_text()) for k in range(2)]
    assert reports[0]["type"] == reports[1]["type"] == "RewardFunctionError"
    assert reports[0]["message"] == reports[1]["message"]
    assert "deliberate evaluation failure" in reports[0]["message"]
    assert any("process 1 of 2" in note for note in reports[0]["notes"])


def test_the_cli_on_two_processes_writes_each_file_once(two_processes):
    """`grpo-plugin train` on 2 processes: one summary, one metrics.jsonl with one line per step,
    whose reward is the mean over both processes' completions (the gathered parquet)."""
    import pyarrow.parquet as pq

    out = two_processes / "cli-run"
    printed = [(two_processes / "cli" / f"stdout_rank{k}.txt").read_text() for k in range(2)]
    assert "Held-out greedy accuracy" in printed[0] and printed[1] == ""
    assert len(list(out.rglob("metrics.jsonl"))) == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    train_rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for row in train_rows:
        table = pq.read_table(out / "completions" / f"step_{row['step'] - 1:05d}.parquet")
        rewards = table.column("reward").to_pylist()
        prompts = table.column("prompt").to_pylist()
        assert len(rewards) == 16  # 2 processes x 2 prompts x G=4
        groups = [set(map(str, prompts[i : i + 4])) for i in range(0, 16, 4)]
        assert all(len(group) == 1 for group in groups)  # each group sampled whole, in one place
        assert len(set(map(str, prompts))) == 4
        assert row["reward"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)
    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["after"]["n"] == 5  # shards of 3 and 2, gathered
    for name in ("adapter_model.safetensors", "grpo_run.json", "README.md", "reward_curve.png"):
        assert (out / name).is_file(), name
